"""``pyflink.datastream.checkpoint_config``."""

from yarnflow.job_config import CheckpointConfig, ExternalizedCheckpointCleanup, ExternalizedCheckpointRetention

__all__ = ["CheckpointConfig", "ExternalizedCheckpointCleanup", "ExternalizedCheckpointRetention"]
