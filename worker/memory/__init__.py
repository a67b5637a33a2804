"""Managed memory (``manager``) and spill files (``spill``) of a TaskExecutor's batch operators."""

from yarnflow.worker.memory.manager import MemoryBudget, MemoryManager, MemoryReservationError
from yarnflow.worker.memory.spill import SpillFile, SpillFiles

__all__ = ["MemoryBudget", "MemoryManager", "MemoryReservationError", "SpillFile", "SpillFiles"]
