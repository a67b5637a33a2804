"""RocksDB's memory inside the slot's managed memory (Flink's
``state.backend.rocksdb.memory.managed``).

Left alone, every RocksDB database takes memory of its own: each column family (one per state)
two write buffers of 16 MB, each database a block cache, and the index and filter blocks of
every SST file it opened, which grow with the data. A TaskExecutor whose job has many states or
many keys then outgrows its container and YARN kills it.

With ``state.backend.rocksdb.memory.managed: true`` (the default) the RocksDB backends of all
tasks in one slot share one ``RocksDBMemory``, made the first time one of them opens (see
``MemoryManager.shared``) and sized to the slot's managed memory (or
``state.backend.rocksdb.memory.fixed-per-slot``):

- one LRU block cache of that size holds the data blocks read, and the index and filter blocks
  too (``cache_index_and_filter_blocks``; those of level 0 pinned), so they no longer grow
  beside it;
- a write buffer manager charges the memtables of every column family to the same cache and
  flushes them when they pass ``write-buffer-ratio`` of it;
- each column family's write buffer is at most a quarter of that part, so one family cannot
  fill it alone.

So RocksDB's memory stays near the slot's managed memory whatever the number of keys and states.
``usage()`` is what the cache holds (memtables included): the TaskExecutor reports it.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["KIND", "RocksDBMemory", "rocksdb_usage", "slot_rocksdb_memory"]

#: the shared resource's kind in ``MemoryManager.shared``
KIND = "rocksdb"
#: a column family's largest write buffer (RocksDB's default is 64 MB)
MAX_WRITE_BUFFER = 16 << 20
#: the smallest shared memory that still works (a few blocks and write buffers)
MIN_SIZE = 8 << 20


class RocksDBMemory:
    """A block cache of ``size`` bytes and a write buffer manager charging ``write_buffer_ratio``
    of it to memtables; hand ``db_options(memory)`` to every database and column family."""

    def __init__(self, size: int, write_buffer_ratio: float = 0.5) -> None:
        from rocksdict import Cache, WriteBufferManager

        self.size = max(MIN_SIZE, int(size))
        self.write_buffer_limit = int(self.size * min(1.0, write_buffer_ratio))
        self.cache = Cache(self.size)
        self.write_buffers = WriteBufferManager.new_write_buffer_manager_with_cache(
            self.write_buffer_limit, False, self.cache)
        #: each column family's write buffer
        self.write_buffer_size = max(1 << 20, min(MAX_WRITE_BUFFER, self.write_buffer_limit // 4))

    def usage(self) -> int:
        """Bytes the block cache holds now (the write buffers' charge included)."""
        return int(self.cache.get_usage())

    def __repr__(self) -> str:
        return (f"RocksDBMemory({self.size / 2**20:.0f} MB, write buffers {self.write_buffer_limit / 2**20:.0f} MB, "
                f"{self.write_buffer_size / 2**20:.0f} MB each)")


def slot_rocksdb_memory(manager: Any, slot: int, owner: str, config: dict[str, str]) -> RocksDBMemory | None:
    """The shared RocksDB memory of slot ``slot`` of ``manager`` (a ``MemoryManager``) for task
    ``owner`` whose job's settings are ``config``; None when the job turned it off."""
    from yarnflow.common.config import Options

    if not Options.ROCKSDB_MEMORY_MANAGED.convert(config.get(Options.ROCKSDB_MEMORY_MANAGED.key, "true")):
        return None
    fixed = Options.ROCKSDB_MEMORY_FIXED.convert(config.get(Options.ROCKSDB_MEMORY_FIXED.key, ""))
    ratio = Options.ROCKSDB_WRITE_BUFFER_RATIO.convert(config.get(Options.ROCKSDB_WRITE_BUFFER_RATIO.key, "0.5"))

    def make(nbytes: int) -> RocksDBMemory:
        memory = RocksDBMemory(nbytes, ratio)
        log.info("slot %d: the RocksDB state backends share %r", slot, memory)
        return memory

    return manager.shared(slot, KIND, owner, make, fixed)  # type: ignore[no-any-return]


def rocksdb_usage(manager: Any) -> int:
    """Bytes the shared RocksDB memory of every slot of ``manager`` holds now."""
    return sum(memory.usage() for memory in manager.shared_resources(KIND))
