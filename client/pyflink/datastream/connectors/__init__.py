"""PyFlink's connectors on yarnflow: the file system's (``file_system``) and Kafka's (``kafka``)."""

from typing import Any

from yarnflow.pyflink.datastream.connectors.file_system import FileSink, FileSource, OutputFileConfig, StreamFormat

__all__ = ["FileSink", "FileSource", "OutputFileConfig", "StreamFormat", "DeliveryGuarantee"]


def __getattr__(name: str) -> Any:
    if name == "DeliveryGuarantee":  # (from the Kafka module, loaded when asked for)
        from yarnflow.kafka import DeliveryGuarantee

        return DeliveryGuarantee
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
