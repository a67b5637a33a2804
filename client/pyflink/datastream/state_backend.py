"""``pyflink.datastream.state_backend``."""

from yarnflow.job_config import EmbeddedRocksDBStateBackend, HashMapStateBackend

__all__ = ["HashMapStateBackend", "EmbeddedRocksDBStateBackend"]
