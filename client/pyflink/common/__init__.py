"""PyFlink's ``pyflink.common`` on yarnflow."""

from yarnflow.job_config import RestartStrategies
from yarnflow.pyflink.common.configuration import Configuration
from yarnflow.pyflink.common.serialization import Encoder, SimpleStringSchema
from yarnflow.pyflink.common.time import Duration, Time
from yarnflow.pyflink.common.typeinfo import TypeInformation, Types
from yarnflow.pyflink.common.types import Row, RowKind
from yarnflow.pyflink.common.watermark_strategy import TimestampAssigner, WatermarkStrategy

__all__ = ["Configuration", "Encoder", "SimpleStringSchema", "Duration", "Time", "Types", "TypeInformation", "Row",
           "RowKind", "WatermarkStrategy", "TimestampAssigner", "RestartStrategies"]
