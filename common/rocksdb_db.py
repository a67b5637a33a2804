"""Opening and scanning a RocksDB database of the RocksDB state backend (``rocksdict``): the
layer under the snapshot format (``rocksdb_snapshot``) and the columnar states' format
(``rocksdb_columnar``), which both read entries key group by key group."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rocksdict import Options, Rdict

_WRITE_BUFFER = 16 << 20


def kg_prefix(kg: int) -> bytes:
    return kg.to_bytes(2, "big")


def db_options(memory: Any = None) -> Options:
    """Options of a database and its column families. ``memory`` (a slot's ``RocksDBMemory``):
    its block cache holds the data, index and filter blocks, and its write buffer manager
    bounds the memtables; None: RocksDB's own caches (readers of snapshots, tools). Bloom
    filters make the lookups of keys not there (new keys: most of a growing state's) cheap."""
    from rocksdict import BlockBasedIndexType, BlockBasedOptions, Options

    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    opts.set_max_write_buffer_number(2)
    opts.set_max_open_files(256)
    table = BlockBasedOptions()
    table.set_bloom_filter(10, False)
    if memory is None:
        opts.set_write_buffer_size(_WRITE_BUFFER)
    else:
        opts.set_write_buffer_size(memory.write_buffer_size)
        opts.set_write_buffer_manager(memory.write_buffers)
        table.set_block_cache(memory.cache)
        table.set_cache_index_and_filter_blocks(True)
        table.set_pin_l0_filter_and_index_blocks_in_cache(True)
        # partitioned: a lookup loads one small partition of a file's index and filter, not
        # the whole of them, which a cache full of data blocks would evict again and again
        table.set_index_type(BlockBasedIndexType.two_level_index_search())
        table.set_partition_filters(True)
        table.set_pin_top_level_index_and_filter(True)
    opts.set_block_based_table_factory(table)
    return opts


def open_read_only(path: str) -> Rdict:
    from rocksdict import AccessType, Rdict

    return Rdict(path, db_options(), access_type=AccessType.read_only())


def scan(cf: Rdict, key_group_range: range) -> Iterator[tuple[int, bytes, bytes]]:
    """(key group, entry bytes, value bytes) of ``cf`` in ``key_group_range``: one range scan."""
    it = cf.iter()
    it.seek(kg_prefix(key_group_range.start))
    stop = kg_prefix(key_group_range.stop) if key_group_range.stop < 1 << 16 else None
    while it.valid():
        key = it.key()
        if stop is not None and key >= stop:
            break
        yield int.from_bytes(key[:2], "big"), key[2:], it.value()
        it.next()
