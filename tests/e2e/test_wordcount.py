"""The walking skeleton through the CLI: wordcount on an embedded local cluster."""

from __future__ import annotations

import os

import pyarrow.parquet as pq
import pytest

from tests.e2e.jobs import SAMPLE, WORDCOUNT, reference_wordcount, write_text_corpus

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


def test_wordcount_files_to_parquet_is_exact(cli, tmp_path):
    lines = write_text_corpus(str(tmp_path / "in"))
    out = tmp_path / "out"
    proc = cli.run("run", WORDCOUNT, "--parallelism", "2", "--input", str(tmp_path / "in"), "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    assert f"word counts written to {out}" in proc.stdout
    assert "FINISHED" in proc.stderr
    assert f"results written to {out}" in proc.stderr  # the CLI says where the result went
    files = sorted(os.listdir(out))
    assert files == ["part-00000.parquet", "part-00001.parquet"], files  # one per sink subtask, no leftovers
    table = pq.read_table(str(out))
    assert table.column_names == ["word", "count"]
    got = dict(zip(table["word"].to_pylist(), table["count"].to_pylist()))
    assert len(got) == table.num_rows, "a word was emitted twice"
    assert got == reference_wordcount(lines)
    # hash partitioning: the two sink subtasks hold disjoint sets of words
    a = set(pq.read_table(str(out / files[0]))["word"].to_pylist())
    b = set(pq.read_table(str(out / files[1]))["word"].to_pylist())
    assert a and b and not (a & b)


def test_wordcount_sample_to_stdout(cli):
    proc = cli.run("run", WORDCOUNT, "--parallelism", "2")
    assert proc.returncode == 0, proc.stderr
    rows = proc.stdout.strip().splitlines()
    assert rows[0] == "word\tcount"
    got = {w: int(c) for w, c in (r.split("\t") for r in rows[1:])}
    with open(SAMPLE) as fh:
        assert got == reference_wordcount(fh.read().splitlines())
    assert "Submitted job wordcount" in proc.stderr
    assert "results printed above" in proc.stderr
    assert "sample -> tokenize" in proc.stderr  # the progress display names the chained vertices


def test_job_args_after_the_job_file_go_to_the_job(cli, tmp_path):
    proc = cli.run("run", WORDCOUNT, "--help")
    assert proc.returncode == 0
    assert "usage: wordcount" in proc.stdout  # the job's own argparse answered, not yarnflow


def test_python_job_file_runs_without_the_cli(cli, tmp_path):
    """`python job.py` uses an embedded local cluster too."""
    import subprocess
    import sys

    lines = write_text_corpus(str(tmp_path / "in"), files=1, lines_per_file=500)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, WORDCOUNT, "--input", str(tmp_path / "in"), "--output", str(out)],
                          capture_output=True, text=True, timeout=120, env=cli.env)
    assert proc.returncode == 0, proc.stderr
    t = pq.read_table(str(out))
    assert dict(zip(t["word"].to_pylist(), t["count"].to_pylist())) == reference_wordcount(lines)
