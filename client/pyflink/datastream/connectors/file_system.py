"""PyFlink's FileSource (text lines) and FileSink (``Encoder.simple_string_encoder()``) on
yarnflow's file source and its two-phase text sink. Differences from Flink's: the sink writes
its part files in the folder itself (no date-time bucket folders), each line ``str(element)``."""

from __future__ import annotations

from typing import Any

from yarnflow.common.errors import JobDefinitionError
from yarnflow.pyflink.common.typeinfo import Types
from yarnflow.pyflink.datastream.records import decode

__all__ = ["FileSource", "FileSourceBuilder", "StreamFormat", "FileSink", "OutputFileConfig", "RollingPolicy",
           "DefaultRollingPolicy", "OnCheckpointRollingPolicy"]


class StreamFormat:
    def __init__(self, kind: str, charset: str = "UTF-8") -> None:
        self.kind, self.charset = kind, charset

    @staticmethod
    def text_line_format(charset_name: str = "UTF-8") -> StreamFormat:
        return StreamFormat("text", charset_name)


class FileSource:
    def __init__(self, fmt: StreamFormat, paths: tuple[str, ...]) -> None:
        self._format, self._paths = fmt, paths

    @staticmethod
    def for_record_stream_format(stream_format: StreamFormat, *paths: str) -> FileSourceBuilder:
        if not isinstance(stream_format, StreamFormat) or stream_format.kind != "text":
            raise JobDefinitionError("yarnflow's PyFlink layer reads StreamFormat.text_line_format() files (yarnflow's "
                                     "own env.read_parquet/read_csv/read_json read the others)")
        if not paths:
            raise JobDefinitionError("FileSource.for_record_stream_format needs at least one path")
        return FileSourceBuilder(stream_format, tuple(paths))

    @staticmethod
    def for_bulk_file_format(bulk_format: Any, *paths: str) -> FileSourceBuilder:
        raise JobDefinitionError("FileSource.for_bulk_file_format is not supported by yarnflow's PyFlink layer "
                                 "(yarnflow's own env.read_parquet is)")

    def _attach(self, env: Any, name: str) -> tuple[Any, Any]:
        paths = [_local(p) for p in self._paths]
        return env.read_text(paths if len(paths) > 1 else paths[0], name=name), Types.STRING()


class FileSourceBuilder:
    def __init__(self, fmt: StreamFormat, paths: tuple[str, ...]) -> None:
        self._format, self._paths = fmt, paths

    def monitor_continuously(self, discovery_interval: Any) -> FileSourceBuilder:
        raise JobDefinitionError("FileSource.monitor_continuously (an unbounded file source) is not supported by "
                                 "yarnflow's PyFlink layer")

    def process_static_file_set(self) -> FileSourceBuilder:
        return self

    def build(self) -> FileSource:
        return FileSource(self._format, self._paths)


def _local(path: str) -> str:
    return path[len("file://"):] if path.startswith("file://") and not path.startswith("file:///") else path


class OutputFileConfig:
    def __init__(self, part_prefix: str = "part", part_suffix: str = "") -> None:
        self.part_prefix, self.part_suffix = part_prefix, part_suffix

    @staticmethod
    def builder() -> OutputFileConfigBuilder:
        return OutputFileConfigBuilder()


class OutputFileConfigBuilder:
    def __init__(self) -> None:
        self._prefix, self._suffix = "part", ""

    def with_part_prefix(self, prefix: str) -> OutputFileConfigBuilder:
        self._prefix = prefix
        return self

    def with_part_suffix(self, suffix: str) -> OutputFileConfigBuilder:
        self._suffix = suffix
        return self

    def build(self) -> OutputFileConfig:
        return OutputFileConfig(self._prefix, self._suffix)


class RollingPolicy:
    def __init__(self, part_size: int | None = None) -> None:
        self.part_size = part_size

    @staticmethod
    def default_rolling_policy(part_size: int = 1024 * 1024 * 128, rollover_interval: int = 60 * 1000,
                               inactivity_interval: int = 60 * 1000) -> RollingPolicy:
        return RollingPolicy(part_size)

    @staticmethod
    def on_checkpoint_rolling_policy() -> RollingPolicy:
        return RollingPolicy(None)


DefaultRollingPolicy = RollingPolicy
OnCheckpointRollingPolicy = RollingPolicy


class _Line:
    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        return {"line": str(decode(row))}


class FileSink:
    def __init__(self, path: str, config: OutputFileConfig, rolling: RollingPolicy) -> None:
        self._path, self._config, self._rolling = path, config, rolling

    @staticmethod
    def for_row_format(base_path: str, encoder: Any) -> FileSinkBuilder:
        if getattr(encoder, "_kind", "") != "simple_string":
            raise JobDefinitionError("yarnflow's PyFlink layer writes Encoder.simple_string_encoder() rows")
        return FileSinkBuilder(base_path)

    @staticmethod
    def for_bulk_format(base_path: str, writer_factory: Any) -> FileSinkBuilder:
        raise JobDefinitionError("FileSink.for_bulk_format is not supported by yarnflow's PyFlink layer (yarnflow's "
                                 "own sink_to_parquet is)")

    def _attach(self, ds: Any) -> Any:
        lines = ds.map(_Line(), name="to_string")
        return lines.sink_to_text(_local(self._path), name="FileSink", roll_size_bytes=self._rolling.part_size,
                                  suffix=self._config.part_suffix)


class FileSinkBuilder:
    def __init__(self, path: str) -> None:
        self._path = path
        self._config = OutputFileConfig()
        self._rolling = RollingPolicy()

    def with_output_file_config(self, output_file_config: OutputFileConfig) -> FileSinkBuilder:
        self._config = output_file_config
        return self

    def with_rolling_policy(self, rolling_policy: RollingPolicy) -> FileSinkBuilder:
        self._rolling = rolling_policy
        return self

    def with_bucket_assigner(self, bucket_assigner: Any) -> FileSinkBuilder:
        return self  # (no buckets: the parts are in the folder itself)

    def with_bucket_check_interval(self, interval: int) -> FileSinkBuilder:
        return self

    def build(self) -> FileSink:
        return FileSink(self._path, self._config, self._rolling)
