"""PyFlink's connectors on yarnflow: the file system's (``file_system``)."""

from yarnflow.pyflink.datastream.connectors.file_system import FileSink, FileSource, OutputFileConfig, StreamFormat

__all__ = ["FileSink", "FileSource", "OutputFileConfig", "StreamFormat"]
