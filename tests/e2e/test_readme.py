"""Every block of the README and every command in the examples' headers, run as written (issue
50): read from the files, filled in as tests/e2e/readme_runner.py says, each command exiting 0
and what it made checked where it says what it makes. A block that is not run is named in
NOT_RUN with the reason, and a test fails when a block is neither run nor named there, so the
README cannot drift from what works."""

from __future__ import annotations

import collections
import json
import re
import textwrap
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
import requests

from tests.e2e.readme_runner import REPO, Block, Runner, header_commands, readme_blocks, running_job_on_session
from tests.harness import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

#: the first line of each block that is not run here, and why
NOT_RUN = {
    "pip install . && yarnflow run examples/wordcount.py --parallelism 2":
        "the set-up commands: CI (.ci/run) runs the second in a fresh virtualenv; the first installs and runs "
        "the word count of examples/wordcount.py, whose header commands run below",
    "kinit -kt etl.keytab etl@EXAMPLE.COM":
        "a real Hadoop cluster's edge node (Kerberos, HDFS, skein's own driver): none can run here; the same "
        "commands run against the YARN sandbox in the YARN blocks",
}


def _block(first: str) -> Block:
    [found] = [b for b in readme_blocks() if b.first.startswith(first)]
    return found


#: the blocks the tests below run, by their first line
RUN = ("import re", "import pyarrow as pa", "a.connect(b).map(fn1, fn2)", "class Lookup(yarnflow.AsyncFunction):",
       "from yarnflow.windows import TumblingEventTimeWindows", 'orders = env.read_parquet("hdfs:///w3/orders.parquet")',
       "yarnflow run [options] JOB.py [job args]", "TOKEN=$(yarnflow session token", "yarnflow session start -D rest",
       "yarnflow logs --address HOST:PORT", "yarnflow savepoint --address HOST:PORT", "yarnflow run --target yarn-per-job",
       "yarnflow yarn-sandbox &")


def test_every_block_is_run_or_says_why_not() -> None:
    blocks = readme_blocks()
    assert blocks[0].first == "pip install . && yarnflow run examples/wordcount.py --parallelism 2"
    assert len(blocks[0].lines) == 2  # exactly two set-up commands; .ci/run runs the second
    assert blocks[0].lines[1].startswith(".ci/install-test-deps && pip install -e '.[test]' && python -m pytest")
    for block in blocks:
        run = [f for f in RUN if block.first.startswith(f)]
        skipped = [f for f in NOT_RUN if block.first.startswith(f)]
        assert len(run) + len(skipped) == 1, f"README line {block.line}: {block.first!r} is neither run nor excused"


# -- the Python blocks ---------------------------------------------------------------------------

def test_the_word_count_job_runs_as_written(cli: Any, tmp_path: Path) -> None:
    job = _block("import re")
    books = tmp_path / "data" / "books"
    books.mkdir(parents=True)
    (books / "a.txt").write_text("The cat, the hat.\n")
    (books / "b.txt").write_text("A cat!\n")
    (tmp_path / "wordcount.py").write_text("\n".join(job.lines) + "\n")
    cli.run("run", "--no-progress", str(tmp_path / "wordcount.py"), check=True)
    table = pads.dataset(str(tmp_path / "out" / "counts"), format="parquet").to_table()
    assert dict(zip(table["word"].to_pylist(), table["count"].to_pylist())) == {"the": 2, "cat": 2, "hat": 1, "a": 1}


#: what a fragment's names stand for (the streams and functions the surrounding text means)
PRELUDES = {
    "import pyarrow as pa": 'words = env.from_collection({"word": ["a", "b", "a"]})',
    "a.connect(b).map(fn1, fn2)": textwrap.dedent("""\
        from yarnflow import (CoProcessFunction, KeyedBroadcastProcessFunction, KeyedCoProcessFunction,
                              MapStateDescriptor)
        a = env.from_collection({"x": [1]}); b = env.from_collection({"y": [2]})
        fn1 = fn2 = lambda row: row
        orders = env.from_collection({"customer": [1], "amount": [3]})
        customers = env.from_collection({"customer": [1], "name": ["c"]})
        events = env.from_collection({"account": [1], "amount": [5]})
        rules = env.from_collection({"name": ["big"], "limit": [3]})"""),
    "class Lookup(yarnflow.AsyncFunction):": 'rows = env.from_collection({"id": [1, 2]})',
    "from yarnflow.windows import TumblingEventTimeWindows": (
        'events = env.from_collection({"key": [1], "value": [2.0], "ts": [3]})'),
}


@pytest.mark.parametrize("first", list(PRELUDES))
def test_each_python_fragment_runs_against_the_api(first: str) -> None:
    """A fragment shows a part of a pipeline: with its names bound (PRELUDES) it must build
    against yarnflow's API as written."""
    import yarnflow

    env = yarnflow.StreamExecutionEnvironment(parallelism=1)
    scope: dict[str, Any] = {"yarnflow": yarnflow, "env": env}
    exec(PRELUDES[first], scope)  # noqa: S102 - the test's own prelude
    exec("\n".join(_block(first).lines), scope)  # noqa: S102 - the README's fragment
    assert env.transformations, "the fragment added nothing to the pipeline"


def test_the_spark_fragment_runs_with_its_files_here(tmp_path: Path) -> None:
    """The Spark fragment names HDFS files: with local ones in their place (the same names), it
    builds against the API as written (its Spark stages run in the Spark tests)."""
    import yarnflow

    w3 = tmp_path / "w3"
    w3.mkdir()
    pq.write_table(pa.table({"customer_id": [1, 2], "amount": [5.0, 20.0]}), w3 / "orders.parquet")
    pq.write_table(pa.table({"customer_id": [1, 2], "region": ["n", "s"]}), w3 / "customers.parquet")
    env = yarnflow.StreamExecutionEnvironment(parallelism=1)
    code = "\n".join(_block('orders = env.read_parquet("hdfs:///w3/orders.parquet")').lines)
    code = code.replace("hdfs:///w3/", f"file://{w3}/").replace("hdfs:///out/", f"file://{tmp_path}/out/")
    exec(code, {"env": env})  # noqa: S102 - the README's fragment
    assert len(env.transformations) >= 5


# -- the command blocks ----------------------------------------------------------------------------

def _runner(cli: Any, tmp_path: Path) -> Runner:
    runner = Runner.make(tmp_path / "user", cli.env)
    runner.ensure_job = running_job_on_session
    return runner


def test_the_running_jobs_savepoint_token_and_logs_blocks(cli: Any, zookeeper_server: Any, tmp_path: Path) -> None:
    runner = _runner(cli, tmp_path)
    runner.values["ZK"] = zookeeper_server.quorum
    jobs = _block("yarnflow run [options] JOB.py [job args]").commands()
    stop_at = next(i for i, c in enumerate(jobs) if c.startswith("yarnflow session stop"))
    try:
        for command in jobs[:stop_at]:
            done = runner.run(command)
            if command.startswith("yarnflow list"):
                assert re.search(r"\bRUNNING\b|\bFINISHED\b", done.stdout), done.stdout
        assert _words(runner.cwd / "out-1") == _words_of(runner.cwd / "in")  # the embedded cluster's run
        assert _words(runner.cwd / "out-2") == _words_of(runner.cwd / "in")  # the session's
        # while the session runs: its REST token, the logs block's session line, the savepoints block
        for command in _block("TOKEN=$(yarnflow session token").commands():
            done = runner.run(command)
        assert json.loads(done.stdout)["taskmanagers"] == 3, (done.stdout, runner.values, runner.ran[-12:])  # (scaled to 3 above)
        runner.run(_block("yarnflow logs --address HOST:PORT").commands()[0])
        for command in _block("yarnflow savepoint --address HOST:PORT").commands():
            runner.run(command)
        for command in jobs[stop_at:]:  # the session stops; an HA session starts in the background
            runner.run(command)
        wait_until(lambda: _leads(runner), 60, "the HA session never had a leader")
    finally:
        runner.stop_background()


def _leads(runner: Runner) -> bool:
    keys = ("-D high-availability.type=zookeeper -D high-availability.zookeeper.quorum="
            f"{runner.values['ZK']} -D high-availability.storageDir=file://{runner.cwd / 'shared'}")
    done = runner._bash(f"yarnflow list {keys} --json || true", 60)
    return done.stdout.strip() == "" and "error" not in done.stderr


def test_the_rest_block_on_a_session_open_to_flinks_tools(cli: Any, tmp_path: Path) -> None:
    runner = _runner(cli, tmp_path)
    block = _block("yarnflow session start -D rest").commands()
    try:
        for command in block:
            command = command.replace("/tmp/in/", f"{runner.cwd}/in/").replace("/tmp/out/", f"{runner.cwd}/jar-out/")
            done = runner.run(command)
            if "/jars/" in command and "/run" in command:
                job_id = json.loads(done.stdout)["jobid"]
                url = f"{runner.values['WEB']}/jobs/{job_id}"
                wait_until(lambda url=url: requests.get(url, timeout=10).json()["state"] == "FINISHED", 60,
                           "the uploaded job did not finish")
                assert _words(runner.cwd / "jar-out") == _words_of(runner.cwd / "in")
        assert block[-1] == "curl -X DELETE $WEB/cluster        # cancel every job and shut the cluster down"
        wait_until(lambda: all(p.poll() is not None for p in runner.background), 30, "the session did not stop")
    finally:
        runner.stop_background()


def test_the_yarn_blocks_against_the_sandbox_the_readme_starts(cli: Any, tmp_path: Path) -> None:
    runner = _runner(cli, tmp_path)
    runner.ensure_job = None  # (JOB_ID: the per-job application's job)
    runner.env["SKEIN_CONFIG"] = str(tmp_path / "skein")
    sandbox = _block("yarnflow yarn-sandbox &").commands()
    try:
        runner.run(sandbox[0])
        wait_until(lambda: (tmp_path / "skein" / "driver").exists(), 60, "the sandbox never registered as skein's driver")
        done = runner.run(sandbox[1].replace("examples/", f"{REPO}/examples/"))
        assert dict(line.split("\t") for line in done.stdout.splitlines()[1:])["the"] == str(
            _words_of(REPO / "examples" / "data").get("the"))
        for command in _block("yarnflow run --target yarn-per-job").commands():
            done = runner.run(command)
            if command.startswith("yarnflow run --target yarn-per-job JOB.py"):
                per_job = (runner.values["APP_ID"], runner.values["SUBMITTED"])
        # the logs block's YARN line: the per-job application's job, through log aggregation
        runner.values["APP_ID"], runner.values["JOB_ID"] = per_job
        done = runner.run(_block("yarnflow logs --address HOST:PORT").commands()[1])
        assert f"[job {per_job[1]}]" in done.stdout
    finally:
        runner.stop_background()


# -- the examples' headers -----------------------------------------------------------------------------

EXAMPLES = sorted((REPO / "examples").glob("*.py"))


def test_every_example_has_commands_in_its_header() -> None:
    assert len(EXAMPLES) >= 6
    for example in EXAMPLES:
        assert header_commands(example), example


def test_the_examples_header_commands_run_as_written(cli: Any, tmp_path: Path, kafka_broker: Any) -> None:
    runner = _runner(cli, tmp_path)
    runner.ensure_job = None  # (JOB_ID: the job the header's own command submitted)
    (runner.cwd / "examples").symlink_to(REPO / "examples")
    _example_inputs(runner.cwd)
    events, sums = kafka_broker.create_topic(2), kafka_broker.create_topic(2)  # (kafka_windows.py's)
    kafka_broker.produce(events, [json.dumps({"key": f"k{i % 5}", "ts": i, "value": 1.0}).encode() for i in range(3000)])
    try:
        for example in EXAMPLES:
            for command in header_commands(example):
                command = (command.replace("s3://bucket/books/", "books/").replace("/tmp/counts", "out/counts")
                           .replace("--input DIR", "--input region-input").replace("/tmp/revenue", "out/revenue")
                           .replace("127.0.0.1:9092", kafka_broker.bootstrap)
                           .replace("--input events --output sums", f"--input {events} --output {sums}"))
                if "JOB_ID" in command:
                    runner.values["JOB_ID"] = runner.values["SUBMITTED"]
                runner.run(command)
        rows = pads.dataset(str(runner.cwd / "out" / "resumed"), format="parquet").to_table()
        seen = collections.Counter(zip(rows["partition"].to_pylist(), rows["offset"].to_pylist()))
        assert len(seen) == 8 * 10_000 and set(seen.values()) == {1}  # every (partition, offset) once
        assert _words(runner.cwd / "out" / "counts") == _words_of(runner.cwd / "books")
        windows = [json.loads(m.value()) for m in kafka_broker.read_all(sums)]
        assert sorted((w["key"], w["window_start"]) for w in windows) == \
            sorted((f"k{k}", s) for k in range(5) for s in range(0, 3000, 1000))
        assert sum(w["value"] for w in windows) == 3000.0
    finally:
        runner.stop_background()


def _example_inputs(cwd: Path) -> None:
    """The inputs the headers name, in the formats their docstrings give."""
    (cwd / "books").mkdir()
    (cwd / "books" / "one.txt").write_text("It was the best of times, it was the worst of times.\n")
    for name, shift in (("orders", 0), ("payments", 1500)):
        (cwd / name).mkdir()
        (cwd / name / "a.csv").write_text("customer,ts,amount\n" + "".join(
            f"{c},{1000 * i + shift},{10 + i}\n" for i in range(20) for c in (i % 3,)))
    (cwd / "events").mkdir()
    pq.write_table(pa.table({"key": [i % 4 for i in range(200)], "value": [float(i) for i in range(200)],
                             "ts": [10 * i for i in range(200)]}), cwd / "events" / "e.parquet")
    (cwd / "region-input").mkdir()
    pq.write_table(pa.table({"order_id": [1, 2, 3], "customer_id": [1, 2, 1], "amount": [10.0, 20.0, 30.0]}),
                   cwd / "region-input" / "orders.parquet")
    pq.write_table(pa.table({"customer_id": [1, 2], "region": ["north", "south"]}),
                   cwd / "region-input" / "customers.parquet")


def _words(out: Path) -> dict[str, int]:
    """A keyed count's committed output: each word's last (largest) total."""
    table = pads.dataset(str(out), format="parquet").to_table()
    totals: dict[str, int] = {}
    for w, n in zip(table["word"].to_pylist(), table["count"].to_pylist()):
        totals[w] = max(n, totals.get(w, 0))
    return totals


def _words_of(folder: Path) -> dict[str, int]:
    counts: collections.Counter[str] = collections.Counter()
    for path in sorted(folder.rglob("*.txt")):
        text = path.read_text()
        counts.update(re.findall(r"\w+", text.lower()) if folder.name in ("data", "books") else text.split())
    return dict(counts)
