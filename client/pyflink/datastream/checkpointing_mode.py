"""``pyflink.datastream.checkpointing_mode``."""

from yarnflow.job_config import CheckpointingMode

__all__ = ["CheckpointingMode"]
