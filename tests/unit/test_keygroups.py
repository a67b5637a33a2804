"""Keys -> key groups -> subtasks (worker/key_assignment.py): stable hashes, every key type,
nulls, both hashing paths (small arrays and dictionary-encoded large ones), and Flink's
KeyGroupRangeAssignment formulas."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest

from yarnflow.common.errors import JobDefinitionError
from yarnflow.worker.key_assignment import (
    hash_keys,
    key_group_range,
    key_groups,
    operator_index_for_key_groups,
)

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

UTC = datetime.timezone.utc

#: one column per key type; every list repeats its values so equal keys sit at different rows
SAMPLES: dict[str, pa.Array] = {
    "string": pa.array(["apple", "pear", "", "apple", None, "pear", "ü-ñ", None], pa.string()),
    "large_string": pa.array(["apple", "pear", "", "apple", None, "pear", "ü-ñ", None], pa.large_string()),
    "binary": pa.array([b"\x00a", b"b", b"", b"\x00a", None, b"b", b"\xff", None], pa.binary()),
    "int64": pa.array([1, -7, 0, 1, None, -7, 2**62, None], pa.int64()),
    "int32": pa.array([1, -7, 0, 1, None, -7, 2**30, None], pa.int32()),
    "uint8": pa.array([1, 7, 0, 1, None, 7, 255, None], pa.uint8()),
    "float64": pa.array([1.5, -7.25, 0.0, 1.5, None, -7.25, 1e300, None], pa.float64()),
    "float32": pa.array([1.5, -7.25, 0.0, 1.5, None, -7.25, 3.0, None], pa.float32()),
    "bool": pa.array([True, False, True, True, None, False, False, None], pa.bool_()),
    "timestamp_ms": pa.array([datetime.datetime(2024, 1, 1), datetime.datetime(1960, 5, 5, 1, 2, 3),
                              datetime.datetime(1970, 1, 1), datetime.datetime(2024, 1, 1), None,
                              datetime.datetime(1960, 5, 5, 1, 2, 3), datetime.datetime(2099, 12, 31), None],
                             pa.timestamp("ms")),
    "timestamp_us_tz": pa.array([datetime.datetime(2024, 1, 1, tzinfo=UTC), datetime.datetime(2000, 2, 2, tzinfo=UTC),
                                 datetime.datetime(1970, 1, 1, tzinfo=UTC), datetime.datetime(2024, 1, 1, tzinfo=UTC),
                                 None, datetime.datetime(2000, 2, 2, tzinfo=UTC),
                                 datetime.datetime(2030, 3, 3, tzinfo=UTC), None], pa.timestamp("us", tz="UTC")),
    "date32": pa.array([datetime.date(2024, 1, 1), datetime.date(1960, 5, 5), datetime.date(1970, 1, 1),
                        datetime.date(2024, 1, 1), None, datetime.date(1960, 5, 5), datetime.date(2099, 1, 1), None],
                       pa.date32()),
    "time32": pa.array([datetime.time(1, 2, 3), datetime.time(23, 0), datetime.time(0, 0), datetime.time(1, 2, 3),
                        None, datetime.time(23, 0), datetime.time(12, 0), None], pa.time32("s")),
    "duration": pa.array([datetime.timedelta(seconds=5), datetime.timedelta(seconds=-3), datetime.timedelta(0),
                          datetime.timedelta(seconds=5), None, datetime.timedelta(seconds=-3),
                          datetime.timedelta(days=9), None], pa.duration("s")),
}

MAXP = 128


def _batch(**columns: pa.Array) -> pa.RecordBatch:
    return pa.record_batch(list(columns.values()), names=list(columns))


def _groups_by_value(batch: pa.RecordBatch, keys: list[str], maxp: int = MAXP) -> dict[tuple, set[int]]:
    kgs = key_groups(batch, keys, maxp)
    rows = batch.select(keys).to_pylist()
    seen: dict[tuple, set[int]] = {}
    for row, kg in zip(rows, kgs, strict=True):
        seen.setdefault(tuple(row[k] for k in keys), set()).add(int(kg))
    return seen


# -- determinism -------------------------------------------------------------------------------

_HASHES = """
import pyarrow as pa
from yarnflow.worker.key_assignment import hash_keys


def compute():
    words = ["w%d" % (i % 300) for i in range(1000)]
    large = pa.table({"s": words, "i": list(range(1000)), "f": [i / 3 for i in range(1000)]})
    small = pa.table({"s": pa.array(["w1", None, "w299", ""]), "i": [1, None, 3, 4], "f": [0.5, 1.5, None, 3.5]})
    cases = [("s", large, ["s"]), ("i", large, ["i"]), ("f", large, ["f"]), ("multi", large, ["s", "i", "f"]),
             ("small_s", small, ["s"]), ("small_multi", small, ["s", "i", "f"])]
    return {name: [int(h) for h in hash_keys(tab, cols)] for name, tab, cols in cases}
"""


def _hashes_in_child(seed: str) -> dict[str, list[int]]:
    env = dict(os.environ, PYTHONHASHSEED=seed)
    code = _HASHES + "\nimport json, sys\njson.dump(compute(), sys.stdout)\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=25,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_hashes_are_the_same_in_processes_with_different_hash_seeds():
    namespace: dict = {}
    exec(compile(_HASHES, "<hashes>", "exec"), namespace)  # the same code, with this process's seed
    here = namespace["compute"]()
    assert _hashes_in_child("1") == _hashes_in_child("4242") == here
    assert len(set(here["s"])) == 300 and len(set(here["multi"])) == 1000  # not trivially constant


# -- same key -> same key group ------------------------------------------------------------------

@pytest.mark.parametrize("kind", sorted(SAMPLES))
def test_equal_values_get_equal_key_groups(kind: str):
    arr = SAMPLES[kind]
    batch = _batch(k=arr)
    seen = _groups_by_value(batch, ["k"])
    assert all(len(kgs) == 1 for kgs in seen.values()), seen
    # the same values in another batch, reversed and with different neighbours, land alike
    other = _batch(k=pa.concat_arrays([arr[::-1], arr]))
    for value, kgs in _groups_by_value(other, ["k"]).items():
        assert kgs == seen[value], value


@pytest.mark.parametrize("kind", sorted(SAMPLES))
def test_nulls_hash_alike_and_apart_from_the_zero_value(kind: str):
    arr = SAMPLES[kind]
    h = hash_keys(_batch(k=arr), ["k"])
    nulls = [i for i, v in enumerate(arr.to_pylist()) if v is None]
    assert len(nulls) == 2 and h[nulls[0]] == h[nulls[1]]
    # index 2 holds the type's "zero" ("", 0, 1970-01-01, ...): it is a key of its own
    assert h[2] != h[nulls[0]]
    all_null = pa.nulls(5, arr.type)
    assert len(set(hash_keys(_batch(k=all_null), ["k"]).tolist())) == 1


@pytest.mark.parametrize("kind", sorted(SAMPLES))
def test_small_and_large_arrays_hash_the_same_values_alike(kind: str):
    """Arrays over 64 rows take another path (strings are dictionary-encoded first)."""
    small = SAMPLES[kind]
    large = pa.concat_arrays([small] * 20)  # 160 rows
    assert len(small) < 64 < len(large)
    hs, hl = hash_keys(_batch(k=small), ["k"]), hash_keys(_batch(k=large), ["k"])
    assert hl.tolist() == hs.tolist() * 20


@pytest.mark.parametrize("n", [10, 65, 200])
def test_an_all_null_string_key_column_is_one_key(n: int):
    batch = _batch(k=pa.nulls(n, pa.string()), v=pa.array(range(n)))
    assert len(set(key_groups(batch, ["k"], MAXP).tolist())) == 1


def test_dictionary_encoded_and_chunked_columns_hash_like_plain_ones():
    values = ["a", "b", None, "a", "c"] * 30
    plain = pa.table({"k": pa.array(values)})
    h = hash_keys(plain, ["k"]).tolist()
    assert hash_keys(pa.table({"k": pa.array(values).dictionary_encode()}), ["k"]).tolist() == h
    chunked = pa.table({"k": pa.chunked_array([pa.array(values[:7]), pa.array(values[7:])])})
    assert hash_keys(chunked, ["k"]).tolist() == h


def test_multi_column_keys_combine_every_column():
    batch = _batch(a=pa.array(["x", "x", "y", "x", None, None]), b=pa.array([1, 2, 1, 1, 1, None]),
                   c=pa.array([True, True, True, True, False, None]))
    h = hash_keys(batch, ["a", "b", "c"])
    assert h[0] == h[3]  # ("x", 1, True) twice
    assert len({int(x) for x in h[[0, 1, 2, 4, 5]]}) == 5  # every other combination differs
    # the order of the key columns matters, as for a tuple
    assert hash_keys(batch, ["b", "a", "c"]).tolist() != h.tolist()
    seen = _groups_by_value(batch, ["a", "b", "c"])
    assert all(len(kgs) == 1 for kgs in seen.values())


def test_many_distinct_multi_column_keys_rarely_collide():
    n = 20_000
    batch = _batch(s=pa.array([f"k{i % 100}" for i in range(n)]), i=pa.array([i // 100 for i in range(n)]))
    assert len(set(hash_keys(batch, ["s", "i"]).tolist())) == n


# -- key groups and subtasks ---------------------------------------------------------------------

@pytest.mark.parametrize("maxp", [1, 7, 128, 32768])
def test_key_groups_are_within_max_parallelism(maxp: int):
    batch = _batch(s=pa.array([f"key-{i}" for i in range(5000)]), i=pa.array(range(-2500, 2500)))
    for keys in (["s"], ["i"], ["s", "i"]):
        kg = key_groups(batch, keys, maxp)
        assert kg.dtype == np.int64 and kg.min() >= 0 and kg.max() < maxp
        if maxp > 1:
            assert len(set(kg.tolist())) > min(maxp, 5000) // 2


def _flink_range(maxp: int, p: int, i: int) -> range:
    # KeyGroupRangeAssignment.computeKeyGroupRangeForOperatorIndex (inclusive end)
    start = (i * maxp + p - 1) // p
    end = ((i + 1) * maxp - 1) // p
    return range(start, end + 1)


@pytest.mark.parametrize("maxp", [1, 2, 3, 7, 10, 128, 1000, 4096])
def test_subtask_ranges_match_flink_and_own_every_key_group_once(maxp: int):
    all_kg = np.arange(maxp, dtype=np.int64)
    for p in range(1, min(maxp, 40) + 1):
        owners = operator_index_for_key_groups(all_kg, maxp, p)
        # Flink's computeOperatorIndexForKeyGroup
        assert owners.tolist() == [kg * p // maxp for kg in range(maxp)]
        ranges = [key_group_range(maxp, p, i) for i in range(p)]
        assert ranges == [_flink_range(maxp, p, i) for i in range(p)]
        assert ranges[0].start == 0 and ranges[-1].stop == maxp
        for prev, nxt in zip(ranges, ranges[1:], strict=False):
            assert prev.stop == nxt.start  # contiguous, no overlap
        for i, r in enumerate(ranges):
            assert len(r) >= 1
            assert set(np.flatnonzero(owners == i).tolist()) == set(r)
        assert max(len(r) for r in ranges) - min(len(r) for r in ranges) <= 1


def test_missing_key_column_names_the_column():
    batch = _batch(word=pa.array(["a"]), n=pa.array([1]))
    with pytest.raises(JobDefinitionError, match=r"'wrod'.*\['word', 'n'\]"):
        key_groups(batch, ["word", "wrod"], MAXP)
    with pytest.raises(JobDefinitionError, match="'nope'"):
        hash_keys(pa.Table.from_batches([batch]), ["nope"])


@pytest.mark.parametrize("kind", ["string", "int"])
def test_ten_thousand_keys_spread_evenly_over_two_to_eight_subtasks(kind: str):
    n = 10_000
    col = pa.array([f"user-{i}" for i in range(n)]) if kind == "string" else pa.array(range(n), pa.int64())
    kg = key_groups(_batch(k=col), ["k"], MAXP)
    per_group = Counter(kg.tolist())
    assert len(per_group) == MAXP
    assert max(per_group.values()) < 2.0 * n / MAXP
    for p in range(2, 9):
        counts = np.bincount(operator_index_for_key_groups(kg, MAXP, p), minlength=p)
        assert counts.sum() == n
        expected = n / p
        assert counts.min() > 0.85 * expected and counts.max() < 1.15 * expected, (p, counts.tolist())


@pytest.mark.parametrize("kind", sorted(SAMPLES))
def test_slices_hash_like_the_rows_they_view(kind: str):
    """Sources slice tables; a slice (an array with an offset) hashes like its rows."""
    arr = pa.concat_arrays([SAMPLES[kind]] * 10)
    whole = hash_keys(_batch(k=arr), ["k"]).tolist()
    for start, length in [(3, 4), (5, 70), (1, 79)]:
        assert hash_keys(_batch(k=arr.slice(start, length)), ["k"]).tolist() == whole[start:start + length]


# -- pandas' hash, without pandas ------------------------------------------------------------------

@pytest.mark.parametrize("values", [
    np.array([1, -7, 0, 2**62]), np.array([1, -2], np.int32), np.array([255, 0], np.uint8),
    np.array([1.5, -7.25, 0.0, 1e300]), np.array([1.5, -0.5], np.float32), np.array([True, False]),
    np.array(["apple", "ü-ñ", ""], dtype=object), np.array([b"\x00a", b""], dtype=object),
    np.array([1, "a", 2.5], dtype=object), np.array(["2024-01-01", "1960-05-05"], dtype="datetime64[ms]"),
    np.array([5, -3], dtype="timedelta64[s]"),
], ids=lambda v: str(v.dtype) + "-" + str(v[0]))
def test_the_hash_is_pandas_hash_array(values: np.ndarray):
    """Key groups are stored in checkpoints: the hash must stay pandas' ``hash_array``."""
    from pandas.util import hash_array as pandas_hash

    from yarnflow.worker.key_assignment import hash_array

    assert hash_array(values.copy(), categorize=False).tolist() == pandas_hash(values.copy(), categorize=False).tolist()


def test_hashing_keys_does_not_import_pandas():
    """pandas costs every process ~50 MB; key hashing loads only its compiled hash function (in a
    process that keeps pyarrow from loading pandas, as TaskExecutors do)."""
    code = ("import sys, pyarrow as pa\nfrom yarnflow.common.memory import defer_pandas_import\n"
            "defer_pandas_import()\nfrom yarnflow.worker.key_assignment import key_groups\n"
            "key_groups(pa.table({'s': ['a'] * 100, 'i': list(range(100))}), ['s', 'i'], 128)\n"
            "print('pandas' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=25,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


# -- the per-thread cache of string hashes ---------------------------------------------------------

def _uncached(arr: pa.Array) -> list[int]:
    """The hashes as computed without the cache: every distinct value hashed afresh."""
    from yarnflow.worker.key_assignment import hash_array

    values = arr.to_pylist()
    distinct = sorted({v for v in values if v is not None}, key=repr)
    h = dict(zip(distinct, hash_array(np.array(distinct, dtype=object), categorize=False).tolist()))
    null = hash_keys(_batch(k=pa.array([None] * 65, arr.type)), ["k"]).tolist()[0]
    return [null if v is None else h[v] for v in values]


@pytest.mark.parametrize("type_", [pa.string(), pa.large_string(), pa.binary()], ids=str)
def test_batches_of_known_new_and_mixed_strings_hash_as_without_the_cache(type_: pa.DataType):
    """A thread remembers the hashes of the strings it hashed (so a vocabulary seen before costs
    no Python string per value): batches all known, all new, mixed and with nulls hash exactly as
    each value hashes on its own."""
    import random
    from concurrent.futures import ThreadPoolExecutor

    rng = random.Random(7)

    def value(i: int) -> object:
        return f"w{i}-ü".encode() if type_ == pa.binary() else f"w{i}-ü"

    def run() -> None:  # in a thread of its own: a fresh cache
        vocabulary = [value(i) for i in range(500)]
        batches = [[rng.choice(vocabulary) for _ in range(300)],                       # learns them
                   [rng.choice(vocabulary) for _ in range(300)],                       # all known
                   [rng.choice(vocabulary) if rng.random() < 0.5 else value(1000 + i)  # mixed
                    for i in range(300)],
                   [None if rng.random() < 0.2 else rng.choice(vocabulary) for _ in range(300)]]
        for rows in batches:
            arr = pa.array(rows, type_)
            assert hash_keys(_batch(k=arr), ["k"]).tolist() == _uncached(arr)

    with ThreadPoolExecutor(1) as pool:
        pool.submit(run).result()


def test_unique_keys_make_the_cache_stop_looking_and_hash_alike():
    """Batch after batch of new values (unique ids): the cache gives up looking them up (it would
    only cost), and the hashes stay the same."""
    from concurrent.futures import ThreadPoolExecutor

    from yarnflow.worker import key_assignment

    def run() -> int:
        for b in range(key_assignment._StringHashCache.GIVE_UP_AFTER + 3):
            arr = pa.array([f"id-{b}-{i}" for i in range(200)])
            assert hash_keys(_batch(k=arr), ["k"]).tolist() == _uncached(arr)
        return key_assignment._STRING_HASHES._misses

    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(run).result() >= key_assignment._StringHashCache.GIVE_UP_AFTER
