"""Job files and reference computations shared by the e2e tests."""

from __future__ import annotations

import os
import random
import textwrap

import pyarrow as pa
import pyarrow.compute as pc

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORDCOUNT = os.path.join(REPO, "examples", "wordcount.py")
SAMPLE = os.path.join(REPO, "examples", "data", "sample.txt")


def reference_wordcount(lines: list[str]) -> dict[str, int]:
    """Word counts computed with pyarrow alone (ASCII text: RE2's \\w matches Python's there)."""
    arr = pc.utf8_lower(pa.array(lines, pa.string()))
    words = pc.list_flatten(pc.split_pattern_regex(arr, r"\W+"))
    words = words.filter(pc.not_equal(words, ""))
    counts = pa.table({"word": words}).group_by("word").aggregate([("word", "count")])
    return dict(zip(counts["word"].to_pylist(), counts["word_count"].to_pylist()))


def write_text_corpus(folder: str, files: int = 3, lines_per_file: int = 4000, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(500)] + ["The", "quick", "BROWN", "fox_1", "x2y", "a"]
    os.makedirs(folder, exist_ok=True)
    all_lines: list[str] = []
    for f in range(files):
        lines = []
        for _ in range(lines_per_file):
            n = rng.randint(0, 12)
            words = [rng.choice(vocab) if rng.random() < 0.5 else vocab[int(rng.paretovariate(1.2)) % len(vocab)]
                     for _ in range(n)]
            seps = [rng.choice([" ", ", ", "; ", " -- ", "\t", "!? "]) for _ in words]
            lines.append("".join(w + s for w, s in zip(words, seps)).strip())
        with open(os.path.join(folder, f"part-{f}.txt"), "w") as fh:
            fh.write("\n".join(lines) + "\n")
        all_lines += lines
    # files the source must skip, as Spark and Flink do
    with open(os.path.join(folder, "_SUCCESS"), "w") as fh:
        fh.write("ignored words here\n")
    with open(os.path.join(folder, ".hidden.txt"), "w") as fh:
        fh.write("ignored words here\n")
    return all_lines


def slow_job(path: str, out: str, rows: int = 400, sleep_s: float = 0.05, name: str = "slow",
             mode: str = "STREAMING") -> str:
    """A job that takes about rows * sleep_s / 2 seconds at parallelism 2 (STREAMING: every
    task runs at once)."""
    with open(path, "w") as fh:
        fh.write(textwrap.dedent(f"""
            import time
            import yarnflow

            def slow(row):
                time.sleep({sleep_s})
                return row

            env = yarnflow.StreamExecutionEnvironment.get_execution_environment()
            env.set_parallelism(2)
            env.set_runtime_mode({mode!r})
            (env.from_collection({{"k": list(range({rows}))}})
                .map(slow, name="slow_map")
                .key_by("k").sum("k")
                .sink_to_parquet({out!r}))
            env.execute({name!r})
        """))
    return path
