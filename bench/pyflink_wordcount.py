"""pyflink-wordcount: a PyFlink-style word count (FileSource -> flat_map -> map to typed
(word, 1) tuples -> key_by -> reduce -> FileSink, BATCH) over N words of text files, run
unchanged by ``yarnflow run`` (embedded local cluster, parallelism 2), against the same count
written with yarnflow's own per-row API (read_text -> flat_map -> key_by().reduce() ->
sink_to_text) on the same files, and PyFlink itself when ``--pyflink-python`` names an
interpreter with apache-flink (not a test dependency). The figure is the time from
``env.execute()`` to its return (the job, cluster start and stop included; not the
interpreter's start), and the whole command's wall time beside it; each variant runs once
before it is timed. Both outputs are checked against a Counter of the files (``verified``).

Prints ``ratio_to_native_api`` (native seconds / PyFlink-layer seconds: 1.0 is as fast as
yarnflow's own API; target >= 0.5) and ``ratio_to_pyflink`` (when PyFlink ran)."""

from __future__ import annotations

import ast
import collections
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

PYFLINK_JOB = '''
import sys, time
from pyflink.common import Encoder, Types, WatermarkStrategy
from pyflink.datastream import RuntimeExecutionMode, StreamExecutionEnvironment
from pyflink.datastream.connectors.file_system import FileSink, FileSource, StreamFormat

def split(line):
    yield from line.split()

env = StreamExecutionEnvironment.get_execution_environment()
env.set_runtime_mode(RuntimeExecutionMode.BATCH)
env.set_parallelism(2)
lines = env.from_source(FileSource.for_record_stream_format(StreamFormat.text_line_format(), sys.argv[1]).build(),
                        WatermarkStrategy.no_watermarks(), "lines")
lines.flat_map(split) \\
    .map(lambda w: (w, 1), output_type=Types.TUPLE([Types.STRING(), Types.INT()])) \\
    .key_by(lambda t: t[0]) \\
    .reduce(lambda a, b: (a[0], a[1] + b[1])) \\
    .sink_to(FileSink.for_row_format(sys.argv[2], Encoder.simple_string_encoder()).build())
started = time.time()
env.execute("pyflink-wordcount")
print("__EXECUTE_S__", time.time() - started)
'''

NATIVE_JOB = '''
import sys, time
import yarnflow
env = yarnflow.StreamExecutionEnvironment.get_execution_environment()
env.set_runtime_mode("BATCH")
env.set_parallelism(2)
(env.read_text(sys.argv[1]).flat_map(lambda r: ({"word": w, "n": 1} for w in r["line"].split()))
    .key_by("word").reduce(lambda a, b: {"word": a["word"], "n": a["n"] + b["n"]})
    .map(lambda r: {"line": repr((r["word"], r["n"]))}).sink_to_text(sys.argv[2]))
started = time.time()
env.execute("native-wordcount")
print("__EXECUTE_S__", time.time() - started)
'''


def _write(folder: str, words: int, files: int = 8, per_line: int = 10, vocabulary: int = 50_000
           ) -> collections.Counter[str]:
    rnd = random.Random(56)
    vocab = [f"w{i}" for i in range(vocabulary)]
    counts: collections.Counter[str] = collections.Counter()
    os.makedirs(folder)
    per_file = words // files
    for f in range(files):
        chosen = rnd.choices(vocab, k=per_file)
        counts.update(chosen)
        with open(os.path.join(folder, f"part-{f}.txt"), "w") as out:
            for i in range(0, per_file, per_line):
                out.write(" ".join(chosen[i:i + per_line]) + "\n")
    return counts


def _read(folder: str) -> collections.Counter[str]:
    got: collections.Counter[str] = collections.Counter()
    for name in os.listdir(folder):
        if name.startswith("."):
            continue
        with open(os.path.join(folder, name)) as f:
            for line in f:
                word, n = ast.literal_eval(line)
                got[word] += n
    return got


def _run(python: str, cmd: list[str], job: str, src: str, out: str, work: str) -> tuple[float, float]:
    shutil.rmtree(out, ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    started = time.time()
    proc = subprocess.run([*cmd, job, src, out], capture_output=True, text=True, timeout=3600, cwd=work, env=env)
    wall = time.time() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} {job} failed ({proc.returncode}): {proc.stderr[-3000:]}")
    execute = next(float(line.split()[1]) for line in proc.stdout.splitlines() if line.startswith("__EXECUTE_S__"))
    return execute, wall


def run_pyflink_wordcount(words: int = 5_000_000, pyflink_python: str | None = None,
                          work_dir: str | None = None) -> dict[str, Any]:
    work = tempfile.mkdtemp(prefix="pyflink-wc-", dir=work_dir)
    try:
        src = os.path.join(work, "in")
        expected = _write(src, words)
        yarnflow = [os.path.join(os.path.dirname(sys.executable), "yarnflow"), "run"]
        for name, text in (("pyflink_job.py", PYFLINK_JOB), ("native_job.py", NATIVE_JOB)):
            with open(os.path.join(work, name), "w") as f:
                f.write(text)
        out: dict[str, Any] = {"bench": "pyflink-wordcount", "words": words, "parallelism": 2}
        verified = True
        for label, job in (("pyflink_layer", "pyflink_job.py"), ("native_api", "native_job.py")):
            _run(sys.executable, yarnflow, job, src, os.path.join(work, "out-" + label), work)  # (warm-up)
            execute, wall = _run(sys.executable, yarnflow, job, src, os.path.join(work, "out-" + label), work)
            ok = _read(os.path.join(work, "out-" + label)) == expected
            verified = verified and ok
            out[label] = {"execute_s": round(execute, 3), "wall_s": round(wall, 3),
                          "words_per_s": round(words / execute), "verified": ok}
        out["ratio_to_native_api"] = round(out["native_api"]["execute_s"] / out["pyflink_layer"]["execute_s"], 3)
        if pyflink_python:
            execute, wall = _run(pyflink_python, [pyflink_python], "pyflink_job.py", src,
                                 os.path.join(work, "out-pyflink"), work)
            out["pyflink"] = {"execute_s": round(execute, 3), "wall_s": round(wall, 3)}
            out["ratio_to_pyflink"] = round(execute / out["pyflink_layer"]["execute_s"], 2)
        out["verified"] = verified
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)
