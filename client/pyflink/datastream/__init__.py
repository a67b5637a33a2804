"""PyFlink's ``pyflink.datastream`` on yarnflow (see ``yarnflow.pyflink``)."""

from yarnflow.job_config import (CheckpointConfig, CheckpointingMode, EmbeddedRocksDBStateBackend,
                                 ExternalizedCheckpointCleanup, ExternalizedCheckpointRetention, HashMapStateBackend)
from yarnflow.pyflink.datastream.connected import BroadcastConnectedStream, BroadcastStream, ConnectedStreams
from yarnflow.pyflink.datastream.data_stream import CloseableIterator, DataStream, DataStreamSink, KeyedStream
from yarnflow.pyflink.datastream.windowed import AllWindowedStream, WindowedStream
from yarnflow.pyflink.datastream.wrappers import OutputTag
from yarnflow.pyflink.datastream.functions import (
    AggregateFunction, BroadcastProcessFunction, CoFlatMapFunction, CoMapFunction, CoProcessFunction, FilterFunction,
    FlatMapFunction, KeyedBroadcastProcessFunction, KeyedCoProcessFunction, KeyedProcessFunction, KeySelector,
    MapFunction, Partitioner, ProcessFunction, ProcessWindowFunction, ReduceFunction, RuntimeContext, TimeDomain,
    TimerService, WindowFunction)
from yarnflow.pyflink.datastream.stream_execution_environment import (RuntimeExecutionMode,
                                                                      StreamExecutionEnvironment)

__all__ = [
    "StreamExecutionEnvironment", "RuntimeExecutionMode", "DataStream", "KeyedStream", "WindowedStream",
    "AllWindowedStream", "DataStreamSink", "CloseableIterator", "OutputTag", "ConnectedStreams", "BroadcastStream",
    "BroadcastConnectedStream",
    # functions
    "MapFunction", "FlatMapFunction", "FilterFunction", "ReduceFunction", "KeySelector", "Partitioner",
    "AggregateFunction", "ProcessFunction", "KeyedProcessFunction", "ProcessWindowFunction", "WindowFunction",
    "CoMapFunction", "CoFlatMapFunction", "CoProcessFunction", "KeyedCoProcessFunction", "BroadcastProcessFunction",
    "KeyedBroadcastProcessFunction", "RuntimeContext", "TimerService", "TimeDomain",
    # configuration from the job's code
    "CheckpointingMode", "CheckpointConfig", "ExternalizedCheckpointCleanup", "ExternalizedCheckpointRetention",
    "HashMapStateBackend", "EmbeddedRocksDBStateBackend",
]
