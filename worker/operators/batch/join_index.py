"""The kernel of the batch hash joins: an index over the build side, made once and probed a
chunk of rows at a time, and the layout that turns matched row positions into output rows.

``JoinIndex`` groups the build rows by key: the distinct keys (an Arrow array), and for each the
positions of its rows (numpy: rows sorted by key, with offsets). Probing a chunk is one
``pyarrow.compute.index_in`` of the chunk's keys against the distinct keys (a vectorised hash
lookup) and numpy to expand keys with several build rows. ``index_in`` hashes the distinct
keys on every call, so callers probe chunks of at least as many rows as there are distinct
keys (``JoinIndex.probe_rows``): the lookup costs at most about as much again as the probe.

One key column of an integer, string, binary, boolean or temporal type is looked up as is;
several columns (or floats) are looked up by their 64-bit hash, and each match is then checked
column by column, so a hash collision never joins two different keys. A null key matches
nothing, as in SQL.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from yarnflow.worker.key_assignment import hash_keys

__all__ = ["JoinIndex", "JoinLayout", "JOIN_TYPES", "Matches"]

#: the widest key range looked up by array (64 M entries: 256 MB of int32 codes at most, and
#: only for that many keys / 4)
_DENSE_MAX = 1 << 26

#: the join types and what a user may call them
JOIN_TYPES = {"inner": "inner",
              "left": "left_outer", "left_outer": "left_outer", "left outer": "left_outer",
              "right": "right_outer", "right_outer": "right_outer", "right outer": "right_outer",
              "full": "full_outer", "full_outer": "full_outer", "full outer": "full_outer", "outer": "full_outer",
              "semi": "left_semi", "left_semi": "left_semi", "left semi": "left_semi",
              "anti": "left_anti", "left_anti": "left_anti", "left anti": "left_anti"}


def _direct(t: pa.DataType) -> bool:
    """Key types ``index_in`` compares exactly as a join should (not floats: -0.0 and NaN)."""
    return (pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)
            or pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_boolean(t)
            or pa.types.is_temporal(t) or pa.types.is_decimal(t))


@dataclass
class Matches:
    """Matching row pairs of one probe: ``probe[i]`` joins ``build[i]`` (positions)."""

    probe: np.ndarray
    build: np.ndarray
    #: every probe row matched exactly once, in order (``probe`` is 0, 1, 2, ...)
    every_probe_row: bool = False

    def __len__(self) -> int:
        return len(self.probe)


class JoinIndex:
    """The build rows of a hash join, grouped by key. ``keys``: the build side's key columns,
    already cast to the types both sides are compared as."""

    def __init__(self, keys: Sequence[pa.Array | pa.ChunkedArray], dense_bytes: int = _DENSE_MAX * 4) -> None:
        """``dense_bytes``: the most an array lookup of integer keys may take (its int32 code per
        key of the range); 0: always hash lookups."""
        cols = [k.combine_chunks() if isinstance(k, pa.ChunkedArray) else k for k in keys]
        self.num_rows = len(cols[0]) if cols else 0
        self.direct = len(cols) == 1 and _direct(cols[0].type)
        self._build_keys = cols
        if self.direct:
            encoded = pc.dictionary_encode(cols[0], null_encoding="mask")
            indices = encoded.indices
            valid = indices.is_valid().to_numpy(zero_copy_only=False) if indices.null_count else None
            codes = indices.fill_null(0).to_numpy(zero_copy_only=False) if indices.null_count \
                else indices.to_numpy(zero_copy_only=False)
            self.distinct: pa.Array = encoded.dictionary
        else:
            h = self._hashes(cols)
            valid = self._valid(cols)
            uniq, codes = np.unique(h if valid is None else h[valid], return_inverse=True)
            if valid is not None:
                full = np.full(len(h), -1, dtype=np.int64)
                full[valid] = codes
                codes = full
            self.distinct = pa.array(uniq, pa.uint64())
        codes = np.asarray(codes, dtype=np.int64)
        if valid is not None:
            codes = np.where(valid, codes, -1)
        n_keys = len(self.distinct)
        rows = np.flatnonzero(codes >= 0) if valid is not None else np.arange(len(codes))
        ordered = codes[rows]
        order = np.argsort(ordered, kind="stable")
        self._rows = rows[order]  # build positions grouped by key, in input order within a key
        self._counts = np.bincount(ordered, minlength=n_keys).astype(np.int64)
        self._starts = np.concatenate(([0], np.cumsum(self._counts)[:-1])).astype(np.int64) if n_keys \
            else np.zeros(0, np.int64)
        self.unique = bool(n_keys == len(rows))
        #: with one build row per key: that row, by key code (one lookup per probe row)
        self._row_of = self._rows[self._starts] if self.unique else self._rows
        self._dense: tuple[int, int, np.ndarray] | None = self._dense_codes(dense_bytes) if self.direct else None

    @property
    def dense_bytes(self) -> int:
        """Memory of the array lookup (0 without one); the rest of the index is about
        ``INDEX_BYTES_PER_ROW`` (hash_join_run.py) a build row."""
        return int(self._dense[2].nbytes) if self._dense is not None else 0

    def _dense_codes(self, limit_bytes: int) -> tuple[int, int, np.ndarray] | None:
        """For integer keys in a range not much wider than their number (surrogate keys of a
        dimension table): ``(min, max, code of each key - min)``, so a probe is an array lookup
        instead of a hash lookup, and needs no chunk of its own size."""
        t = self.distinct.type
        if not len(self.distinct) or not pa.types.is_integer(t) or t.bit_width > 64 or pa.types.is_uint64(t):
            return None
        keys = self.distinct.to_numpy(zero_copy_only=False).astype(np.int64)
        low, high = int(keys.min()), int(keys.max())
        span = high - low + 1
        if span > max(4 * len(keys), 1 << 16) or span > _DENSE_MAX or span * 4 > limit_bytes:
            return None
        codes = np.full(span, -1, dtype=np.int32)
        codes[keys - low] = np.arange(len(keys), dtype=np.int32)
        return low, high, codes

    @staticmethod
    def _hashes(cols: Sequence[pa.Array]) -> np.ndarray:
        names = [str(i) for i in range(len(cols))]
        return hash_keys(pa.table(list(cols), names=names), names)

    @staticmethod
    def _valid(cols: Sequence[pa.Array]) -> np.ndarray | None:
        """Rows whose key has no null (None: all of them)."""
        if not any(c.null_count for c in cols):
            return None
        valid = np.ones(len(cols[0]), dtype=bool)
        for c in cols:
            if c.null_count:
                valid &= c.is_valid().to_numpy(zero_copy_only=False)
        return valid

    @property
    def probe_rows(self) -> int:
        """Probe this many rows at a time, at least: ``index_in`` hashes the distinct keys on
        every call, which then costs at most about as much as the lookup itself (an array
        lookup of dense integer keys costs nothing per call)."""
        return 0 if self._dense is not None else len(self.distinct)

    def _dense_lookup(self, col: pa.Array) -> tuple[np.ndarray, np.ndarray, bool]:
        """``(probe rows with a match, their key codes, every row matched)`` by array lookup."""
        assert self._dense is not None
        low, high, table = self._dense
        keys = (col.fill_null(low - 1 if low > -(2**63) else high + 1) if col.null_count else col) \
            .to_numpy(zero_copy_only=False)
        if keys.dtype != np.int64:
            keys = keys.astype(np.int64)
        offset = keys - low
        inside = (offset >= 0) & (offset < len(table))
        if inside.all():
            codes = table[offset]
        else:
            codes = np.full(len(keys), -1, dtype=np.int32)
            codes[inside] = table[offset[inside]]
        hit = codes >= 0
        if hit.all():
            return np.arange(len(keys), dtype=np.int64), codes.astype(np.int64), True
        rows = np.flatnonzero(hit)
        return rows, codes[rows].astype(np.int64), False

    def probe(self, keys: Sequence[pa.Array | pa.ChunkedArray]) -> Matches:
        """The matching (probe row, build row) pairs of a chunk whose key columns are ``keys``,
        ordered by probe row (build rows of one key in their input order)."""
        cols = [k.combine_chunks() if isinstance(k, pa.ChunkedArray) else k for k in keys]
        n = len(cols[0]) if cols else 0
        if not n or not len(self.distinct):
            return Matches(np.zeros(0, np.int64), np.zeros(0, np.int64))
        if self._dense is not None and pa.types.is_integer(cols[0].type):
            probe_rows, codes, every = self._dense_lookup(cols[0])
            return self._expand(probe_rows, codes, every)
        if self.direct:
            found = pc.index_in(cols[0], value_set=self.distinct)
        else:
            h = self._hashes(cols)
            valid = self._valid(cols)
            found = pc.index_in(pa.array(h, pa.uint64(), mask=None if valid is None else ~valid),
                                value_set=self.distinct)
        if found.null_count:
            codes = found.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
            probe_rows = np.flatnonzero(codes >= 0)
            codes = codes[probe_rows]
            every = False
        else:
            codes = found.to_numpy(zero_copy_only=False).astype(np.int64)
            probe_rows = np.arange(n, dtype=np.int64)
            every = True
        matches = self._expand(probe_rows, codes, every)
        if not self.direct and len(matches):
            matches = self._verified(cols, matches)
        return matches

    def _expand(self, probe_rows: np.ndarray, codes: np.ndarray, every: bool) -> Matches:
        """The pairs of probe rows (matched key codes) with each build row of their key."""
        if self.unique:
            return Matches(probe_rows, self._row_of[codes], every)
        counts = self._counts[codes]
        total = int(counts.sum())
        probe_idx = np.repeat(probe_rows, counts)
        # each probe row's run of build rows: its key's start, then start + 1, ...
        first = np.repeat(self._starts[codes] - (np.cumsum(counts) - counts), counts)
        return Matches(probe_idx, self._rows[first + np.arange(total, dtype=np.int64)])

    def _verified(self, probe_cols: Sequence[pa.Array], m: Matches) -> Matches:
        """Only the pairs whose keys are equal column by column (a hash matched)."""
        pi, bi = pa.array(m.probe), pa.array(m.build)
        same = None
        for p, b in zip(probe_cols, self._build_keys):
            eq = pc.equal(p.take(pi), b.take(bi))
            if pa.types.is_floating(p.type):  # NaN keys join NaN keys (as Arrow's group-by groups them)
                eq = pc.or_kleene(eq, pc.and_(pc.is_nan(p.take(pi)), pc.is_nan(b.take(bi))))
            same = eq if same is None else pc.and_(same, eq)
        assert same is not None
        keep = same.fill_null(False).to_numpy(zero_copy_only=False)
        if keep.all():
            return m
        return Matches(m.probe[keep], m.build[keep])


class JoinLayout:
    """The output of a join of ``left`` and ``right`` (schemas) on their key columns: the left
    columns, then the right columns without the right keys (a name the left has too gets the
    suffix ``_right``); semi and anti joins give the left columns only. Rows that have no left
    side (right and full outer joins) take the right side's key values in the left key columns."""

    def __init__(self, left: pa.Schema, right: pa.Schema | None, left_keys: Sequence[str],
                 right_keys: Sequence[str], how: str) -> None:
        self.left, self.right = left, right
        self.left_keys, self.right_keys = list(left_keys), list(right_keys)
        self.how = how
        self.right_only = [] if right is None or how in ("left_semi", "left_anti") else \
            [f for f in right if f.name not in self.right_keys]
        self.right_names = [f"{f.name}_right" if f.name in left.names else f.name for f in self.right_only]
        self._key_of = dict(zip(self.left_keys, self.right_keys))
        fields = [f.with_nullable(True) if how in ("right_outer", "full_outer") else f for f in left]
        fields += [pa.field(n, f.type) for n, f in zip(self.right_names, self.right_only)]
        self.schema = pa.schema(fields)

    @staticmethod
    def _take(table: pa.Table | pa.RecordBatch, name: str, idx: np.ndarray, missing: bool) -> pa.Array:
        col = table.column(name)
        if isinstance(col, pa.ChunkedArray):
            col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
        if missing:
            return col.take(pa.array(idx, pa.int64(), mask=idx < 0))
        if len(idx) == len(col) and (len(idx) == 0 or (idx[0] == 0 and (np.diff(idx) == 1).all())):
            return col  # every row in order: no copy
        return col.take(pa.array(idx))

    def _column(self, table: pa.Table | pa.RecordBatch | None, idx: np.ndarray | None, f: pa.Field,
                missing: bool, n: int) -> pa.Array:
        """Column ``f`` (by name, cast to its type) of ``table``'s rows ``idx``: ``n`` nulls without them."""
        if table is None or idx is None:
            return pa.nulls(n, f.type)
        col = self._take(table, f.name, idx, missing)
        return col if col.type == f.type else col.cast(f.type)

    def assemble(self, left: pa.Table | pa.RecordBatch | None, left_idx: np.ndarray | None,
                 right: pa.Table | pa.RecordBatch | None, right_idx: np.ndarray | None) -> pa.RecordBatch:
        """Output rows made of ``left`` rows ``left_idx`` and ``right`` rows ``right_idx`` (-1, or
        a missing index array: that side is null for the row)."""
        n = len(left_idx) if left_idx is not None else len(right_idx)  # type: ignore[arg-type]
        cols: list[pa.Array] = []
        l_missing = left_idx is None or (n > 0 and bool((left_idx < 0).any()))
        r_missing = right_idx is None or (n > 0 and bool((right_idx < 0).any()))
        for f in self.left:
            col = self._column(left, left_idx, f, l_missing, n)
            rk = self._key_of.get(f.name)
            if rk is not None and l_missing and right is not None and right_idx is not None:
                col = pc.coalesce(col, self._column(right, right_idx, pa.field(rk, f.type), r_missing, n))
            cols.append(col)
        cols += [self._column(right, right_idx, f, r_missing, n) for f in self.right_only]
        return pa.RecordBatch.from_arrays(cols, schema=self.schema)
