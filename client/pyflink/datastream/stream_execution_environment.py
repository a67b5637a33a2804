"""PyFlink's StreamExecutionEnvironment over yarnflow's (``yarnflow run JOB.py`` gives it the
cluster: embedded local, a session or YARN)."""

from __future__ import annotations

import logging
import warnings
from typing import Any

from yarnflow.common.errors import JobDefinitionError
from yarnflow.pyflink.common.typeinfo import TypeInformation
from yarnflow.pyflink.datastream.data_stream import DataStream
from yarnflow.pyflink.datastream.wrappers import _decoded
from yarnflow.pyflink.datastream.records import encoder

__all__ = ["StreamExecutionEnvironment", "RuntimeExecutionMode"]

log = logging.getLogger(__name__)


class RuntimeExecutionMode:
    STREAMING = "STREAMING"
    BATCH = "BATCH"
    AUTOMATIC = "AUTOMATIC"


class ExecutionConfig:
    """``env.get_config()``: the settings PyFlink programs set on it."""

    def __init__(self, env: StreamExecutionEnvironment) -> None:
        self._env = env

    def set_parallelism(self, parallelism: int) -> ExecutionConfig:
        self._env.set_parallelism(parallelism)
        return self

    def get_parallelism(self) -> int:
        return self._env.get_parallelism()

    def set_max_parallelism(self, max_parallelism: int) -> ExecutionConfig:
        self._env.set_max_parallelism(max_parallelism)
        return self

    def set_auto_watermark_interval(self, interval_ms: int) -> ExecutionConfig:
        self._env._env.conf["pipeline.auto-watermark-interval"] = f"{int(interval_ms)} ms"
        return self

    def set_global_job_parameters(self, params: Any) -> ExecutionConfig:
        for k, v in dict(getattr(params, "to_dict", lambda: params)()).items():
            self._env._env.conf[str(k)] = str(v)
        return self

    def enable_object_reuse(self) -> ExecutionConfig:
        return self

    def disable_object_reuse(self) -> ExecutionConfig:
        return self


class StreamExecutionEnvironment:
    """Where a PyFlink program builds its pipeline; ``execute`` runs it on yarnflow."""

    def __init__(self, env: Any) -> None:
        self._env = env
        self._prints: list[tuple[str, str | None]] = []
        self._warned: set[str] = set()
        #: operators fused into the next one (data_stream.py): dropped at execute unless read
        self._absorbed: list[Any] = []

    @staticmethod
    def get_execution_environment(configuration: Any = None) -> StreamExecutionEnvironment:
        import yarnflow

        inner = yarnflow.StreamExecutionEnvironment()
        if "execution.runtime-mode" not in inner.conf:  # (PyFlink's default; yarnflow's is AUTOMATIC)
            inner.set_runtime_mode("STREAMING")
        env = StreamExecutionEnvironment(inner)
        if configuration is not None:
            env.configure(configuration)
        return env

    def configure(self, configuration: Any) -> StreamExecutionEnvironment:
        for k, v in configuration.to_dict().items():
            self._env.conf[str(k)] = str(v)
        return self

    # -- parallelism, mode and configuration from the job's code
    def set_parallelism(self, parallelism: int) -> StreamExecutionEnvironment:
        self._env.set_parallelism(parallelism)
        return self

    def get_parallelism(self) -> int:
        return int(self._env.parallelism)

    def set_max_parallelism(self, max_parallelism: int) -> StreamExecutionEnvironment:
        self._env.set_max_parallelism(max_parallelism)
        return self

    def get_max_parallelism(self) -> int:
        return int(self._env.max_parallelism)

    def set_runtime_mode(self, execution_mode: Any) -> StreamExecutionEnvironment:
        self._env.set_runtime_mode(str(getattr(execution_mode, "name", execution_mode)))
        return self

    def enable_checkpointing(self, interval: int, mode: Any = None) -> StreamExecutionEnvironment:
        self._env.enable_checkpointing(interval, mode)
        return self

    def get_checkpoint_config(self) -> Any:
        return self._env.get_checkpoint_config()

    def get_checkpoint_interval(self) -> int:
        return int(self._env.get_checkpoint_interval())

    def set_state_backend(self, state_backend: Any) -> StreamExecutionEnvironment:
        self._env.set_state_backend(state_backend)
        return self

    def set_restart_strategy(self, restart_strategy_configuration: Any) -> StreamExecutionEnvironment:
        self._env.set_restart_strategy(restart_strategy_configuration)
        return self

    def get_config(self) -> ExecutionConfig:
        return ExecutionConfig(self)

    def set_buffer_timeout(self, timeout_millis: int) -> StreamExecutionEnvironment:
        self._env.conf["execution.buffer-timeout"] = f"{int(timeout_millis)} ms"
        return self

    def set_python_executable(self, python_exec: str) -> StreamExecutionEnvironment:
        return self._ignored("set_python_executable", "the TaskExecutors run yarnflow's own interpreter")

    # -- what a JVM needs, which yarnflow has none of
    def add_jars(self, *jars_path: str) -> StreamExecutionEnvironment:
        return self._ignored("add_jars", "yarnflow runs no JVM: connectors are yarnflow's own")

    def add_classpaths(self, *classpaths: str) -> StreamExecutionEnvironment:
        return self._ignored("add_classpaths", "yarnflow runs no JVM")

    def add_python_file(self, file_path: str) -> StreamExecutionEnvironment:
        return self._ignored("add_python_file", "the job file's folder is shipped with the job (its modules too)")

    def add_python_archive(self, archive_path: str, target_dir: str | None = None) -> StreamExecutionEnvironment:
        return self._ignored("add_python_archive", "ship a virtualenv with yarn.ship-venv instead")

    def set_python_requirements(self, requirements_file_path: str, requirements_cache_dir: str | None = None
                                ) -> StreamExecutionEnvironment:
        return self._ignored("set_python_requirements", "ship a virtualenv with yarn.ship-venv instead")

    def _ignored(self, call: str, why: str) -> StreamExecutionEnvironment:
        if call not in self._warned:
            self._warned.add(call)
            warnings.warn(f"{call}(...) is ignored on yarnflow: {why}", stacklevel=3)
        return self

    # -- sources
    def from_collection(self, collection: list[Any], type_info: TypeInformation | None = None) -> DataStream:
        encode = encoder(type_info)
        rows = [encode(v) for v in collection]
        if not rows:
            raise JobDefinitionError("from_collection needs at least one element")
        return DataStream(self, self._env.from_collection(rows, name="Collection Source"), type_info)

    def from_source(self, source: Any, watermark_strategy: Any = None, source_name: str = "Source",
                    type_info: TypeInformation | None = None) -> DataStream:
        attach = getattr(source, "_attach", None)
        if attach is None:
            raise JobDefinitionError(f"from_source: {type(source).__name__} is not a source yarnflow's PyFlink layer "
                                     "knows (FileSource)")
        stream = DataStream(self, *attach(self._env, source_name))
        return stream.assign_timestamps_and_watermarks(watermark_strategy) if watermark_strategy is not None \
            else stream

    def add_source(self, source_func: Any, source_name: str = "Custom Source",
                   type_info: TypeInformation | None = None) -> DataStream:
        return self.from_source(source_func, None, source_name, type_info)

    # -- execution
    def _drop_absorbed(self) -> None:
        """Operators whose functions run fused in the next one, and that nothing else reads."""
        ts = self._env.transformations
        for t in self._absorbed:
            if t in ts and not any(inp.upstream is t for other in ts for inp in other.inputs):
                ts.remove(t)
        self._absorbed = [t for t in self._absorbed if t in ts]

    def _execute(self, job_name: str | None) -> Any:
        self._drop_absorbed()
        result = self._env.execute(job_name or "Flink Streaming Job")
        for uid, identifier in self._prints:
            prefix = f"{identifier}:" if identifier else ""
            for value in _decoded(result.collected(uid)):
                print(f"{prefix}{value}")
        return result

    def execute(self, job_name: str | None = None) -> Any:
        return self._execute(job_name)

    def execute_async(self, job_name: str | None = None) -> Any:
        """Runs the job to its end (yarnflow's client waits) and returns its result."""
        return self._execute(job_name)

    def get_execution_plan(self) -> str:
        return f"{len(self._env.transformations)} transformations"
