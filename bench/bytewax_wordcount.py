"""The realistic word count as a Bytewax 0.21 dataflow, for ``rowpath --function realistic``:
each Parquet file of the input is one partition of the source, each word goes through
``str.strip`` (the map yarnflow's job calls; with ``WC_FINDALL``, each line is split with
``re.findall``, the flat_map's) and is counted per word (``count_final``); each
worker writes its ``word<TAB>count`` lines to ``$WC_OUTPUT/part-<worker>.tsv``.

Run by the benchmark in an environment of its own (Bytewax is not a yarnflow dependency), as
``python -m bytewax.run bytewax_wordcount:flow -i <process> -a <addresses>`` once per process,
with ``WC_INPUT`` (the Parquet folder) and ``WC_OUTPUT`` set. Not imported by yarnflow."""

from __future__ import annotations

import os
import re
from typing import Any

import bytewax.operators as op  # type: ignore[import-not-found]
import pyarrow.parquet as pq
from bytewax.dataflow import Dataflow  # type: ignore[import-not-found]
from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition  # type: ignore[import-not-found]
from bytewax.outputs import DynamicSink, StatelessSinkPartition  # type: ignore[import-not-found]

INPUT, OUTPUT = os.environ.get("WC_INPUT", ""), os.environ.get("WC_OUTPUT", "")
#: with WC_FINDALL set, the input is lines (column ``line``) and the words are ``re.findall``'s
FINDALL = bool(os.environ.get("WC_FINDALL"))
COLUMN = "line" if FINDALL else "word"
WORD = re.compile(r"\w+")


class _File(StatefulSourcePartition):  # type: ignore[misc]
    def __init__(self, path: str) -> None:
        self._batches = pq.ParquetFile(path).iter_batches(batch_size=65536, columns=[COLUMN])

    def next_batch(self) -> list[Any]:
        return next(self._batches).column(0).to_pylist()  # StopIteration ends the partition

    def snapshot(self) -> None:
        return None


class _Files(FixedPartitionedSource):  # type: ignore[misc]
    def list_parts(self) -> list[str]:
        return sorted(f for f in os.listdir(INPUT) if f.endswith(".parquet"))

    def build_part(self, step_id: str, for_part: str, resume_state: Any) -> _File:
        return _File(os.path.join(INPUT, for_part))


class _Lines(StatelessSinkPartition):  # type: ignore[misc]
    def __init__(self, worker: int) -> None:
        self._out = open(os.path.join(OUTPUT, f"part-{worker}.tsv"), "w", encoding="utf-8")

    def write_batch(self, items: list[Any]) -> None:
        self._out.writelines(f"{word}\t{count}\n" for word, count in items)

    def close(self) -> None:
        self._out.close()


class _Output(DynamicSink):  # type: ignore[misc]
    def build(self, step_id: str, worker_index: int, worker_count: int) -> _Lines:
        return _Lines(worker_index)


flow = Dataflow("wordcount")
words = op.input("files", flow, _Files())
stripped = op.flat_map("findall", words, WORD.findall) if FINDALL else op.map("strip", words, str.strip)
op.output("out", op.count_final("count", stripped, lambda word: word), _Output())
