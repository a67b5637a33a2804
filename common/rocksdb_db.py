"""Opening and scanning a RocksDB database of the RocksDB state backend (``rocksdict``): the
layer under the snapshot format (``rocksdb_snapshot``) and the columnar states' format
(``rocksdb_columnar``), which both read entries key group by key group."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rocksdict import Options, Rdict

_WRITE_BUFFER = 16 << 20


def kg_prefix(kg: int) -> bytes:
    return kg.to_bytes(2, "big")


def db_options() -> Options:
    from rocksdict import Options

    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    opts.set_write_buffer_size(_WRITE_BUFFER)
    opts.set_max_write_buffer_number(2)
    opts.set_max_open_files(256)
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
