"""Connected streams on a real local cluster (issue 33): a rules engine (a keyed event stream
connected to a broadcast rules stream whose rules arrive while the events flow) survives a
SIGKILLed TaskExecutor with every event decided once, by the rule it names, on the hashmap and
the RocksDB backends; a KeyedCoProcessFunction enriches one file-source stream from another's
state, exactly; CoMap and CoFlatMap functions merge two streams of different shapes."""

from __future__ import annotations

import collections
import os
import random
import textwrap
import time
from pathlib import Path
from typing import Any

import pyarrow.dataset as pads
import pytest

import yarnflow
from tests.harness import savepoint_after_a_checkpoint, wait_until
from tests.integration.test_streaming_exactly_once import CHECKPOINTS, run_killing_one_taskexecutor
from yarnflow import (
    KeyedBroadcastProcessFunction,
    KeyedCoProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    ValueStateDescriptor,
)

pytestmark = [pytest.mark.integration]

EVENTS, KEYS, VERSIONS, EVENT_FILES = 4000, 11, 20, 8
REPO_ROOT = str(Path(__file__).resolve().parents[2])
RULES = MapStateDescriptor("rules")
WAITING = ListStateDescriptor("waiting")
DECIDED = ValueStateDescriptor("decided", default=0)


def threshold(version: int) -> int:
    return (version * 53) % 100


def value(seq: int) -> int:
    return (seq * 37) % 100


def write_inputs(root: Path) -> None:
    """Events ``k<key> <seq> <value> <version>`` in EVENT_FILES files; one file per rule version
    (``<version> <threshold>``), so the rules arrive one batch at a time while events flow."""
    events, rules = root / "events", root / "rules"
    events.mkdir(parents=True)
    rules.mkdir(parents=True)
    per_file = EVENTS // EVENT_FILES
    for f in range(EVENT_FILES):
        lines = [f"k{s % KEYS} {s} {value(s)} {s % VERSIONS + 1}" for s in range(f * per_file, (f + 1) * per_file)]
        (events / f"events-{f:02d}.txt").write_text("\n".join(lines) + "\n")
    for v in range(1, VERSIONS + 1):
        (rules / f"rule-{v:02d}.txt").write_text(f"{v} {threshold(v)}\n")


def parse_events(batch: Any) -> Any:
    import pyarrow as pa
    import pyarrow.compute as pc

    time.sleep(0.06)  # (the job takes a few seconds: checkpoints and the kill land inside it)
    parts = pc.split_pattern(batch.column("line"), " ")
    return pa.record_batch({"k": pc.list_element(parts, 0),
                            "seq": pc.cast(pc.list_element(parts, 1), pa.int64()),
                            "value": pc.cast(pc.list_element(parts, 2), pa.int64()),
                            "version": pc.cast(pc.list_element(parts, 3), pa.int64())})


def parse_rules(batch: Any) -> Any:
    import pyarrow as pa
    import pyarrow.compute as pc

    time.sleep(0.15)
    parts = pc.split_pattern(batch.column("line"), " ")
    return pa.record_batch({"version": pc.cast(pc.list_element(parts, 0), pa.int64()),
                            "threshold": pc.cast(pc.list_element(parts, 1), pa.int64())})


class RulesEngine(KeyedBroadcastProcessFunction):
    """Decides each event by the rule version it names: at once when that rule has arrived, else
    when it does (the event waits in its key's state)."""

    def process_element(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
        rules = ctx.get_broadcast_state(RULES)
        if rules.contains(row["version"]):
            self.decide(row, rules.get(row["version"]), out)
        else:
            self.get_state(WAITING).add(row)

    def process_broadcast_element(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
        rules = ctx.get_broadcast_state(RULES)
        rules.put(row["version"], row["threshold"])

        def release(key: Any, waiting: Any) -> None:
            keep = []
            for event in waiting.get():
                if rules.contains(event["version"]):
                    assert event["k"] == key
                    self.decide(event, rules.get(event["version"]), out)
                else:
                    keep.append(event)
            waiting.update(keep)

        ctx.apply_to_keyed_state(WAITING, release)

    def decide(self, event: dict[str, Any], limit: int, out: Any) -> None:
        decided = self.get_state(DECIDED)  # (follows the current key, also inside apply_to_keyed_state)
        decided.update(decided.value() + 1)
        out.collect({"k": event["k"], "seq": event["seq"], "version": event["version"],
                     "passed": event["value"] >= limit, "nth": decided.value()})


def rules_job(root: Path, out: Path) -> Any:
    def build(env: Any) -> None:
        env.set_runtime_mode("STREAMING")
        events = env.read_text(str(root / "events")).map_batches(parse_events, name="parse events")
        rules = env.read_text(str(root / "rules")).map_batches(parse_rules, name="parse rules")
        (events.key_by("k").connect(rules.broadcast(RULES)).process(RulesEngine(), name="rules engine")
            .uid("rules-engine").sink_to_parquet(str(out)))
    return build


@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend", ["hashmap", "rocksdb"])
def test_a_rules_engine_decides_every_event_once_across_a_killed_taskexecutor(
        local_cluster: Any, tmp_path: Path, backend: str) -> None:
    root, out = tmp_path / "in", tmp_path / "out"
    write_inputs(root)
    cluster = local_cluster(taskexecutors=2, slots=2)
    conf = {**CHECKPOINTS, "state.backend.type": backend, "state.backend.rocksdb.localdir": str(tmp_path / "local")}
    run_killing_one_taskexecutor(cluster, rules_job(root, out), f"rules-{backend}", conf, random.Random(7), (0.5, 1.5))

    table = pads.dataset(str(out), format="parquet").to_table()
    got = collections.Counter(zip(table["seq"].to_pylist(), table["passed"].to_pylist()))
    expected = collections.Counter((s, value(s) >= threshold(s % VERSIONS + 1)) for s in range(EVENTS))
    assert got == expected  # every event once, decided by the rule it names
    # each key's decisions counted 1, 2, ... without a gap or a repeat (its keyed state survived)
    per_key: dict[str, list[int]] = collections.defaultdict(list)
    for k, nth in zip(table["k"].to_pylist(), table["nth"].to_pylist()):
        per_key[k].append(nth)
    assert {k: sorted(v) for k, v in per_key.items()} == {
        f"k{i}": list(range(1, len(range(i, EVENTS, KEYS)) + 1)) for i in range(KEYS)}


class Enrich(KeyedCoProcessFunction):
    """Orders (input 1) get their customer's name (input 2) when both have arrived, in either order."""

    NAME = ValueStateDescriptor("name")
    PENDING = ListStateDescriptor("pending")

    def process_element1(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
        name = ctx.get_state(self.NAME).value()
        if name is None:
            ctx.get_state(self.PENDING).add(row)
        else:
            out.collect({"order": row["order"], "customer": ctx.current_key, "name": name})

    def process_element2(self, row: dict[str, Any], ctx: Any, out: Any) -> None:
        ctx.get_state(self.NAME).update(row["name"])
        pending = ctx.get_state(self.PENDING)
        for order in pending.get():
            out.collect({"order": order["order"], "customer": ctx.current_key, "name": row["name"]})
        pending.clear()


@pytest.mark.timeout(180)
def test_a_keyed_co_process_function_enriches_one_file_stream_from_another(run: Any, tmp_path: Path) -> None:
    orders, customers = tmp_path / "orders", tmp_path / "customers"
    orders.mkdir()
    customers.mkdir()
    for f in range(4):
        (orders / f"o{f}.csv").write_text("order,customer\n" + "".join(
            f"{o},c{o % 37}\n" for o in range(f * 500, (f + 1) * 500)))
    (customers / "c.csv").write_text("customer,name\n" + "".join(f"c{c},name-{c}\n" for c in range(37)))

    def build(env: Any) -> None:
        (env.read_csv(str(orders)).connect(env.read_csv(str(customers))).key_by("customer", "customer")
            .process(Enrich()).collect())

    rows = run(build, conf={"execution.runtime-mode": "STREAMING"}).collected().to_pylist()
    assert sorted((r["order"], r["customer"], r["name"]) for r in rows) == [
        (o, f"c{o % 37}", f"name-{o % 37}") for o in range(2000)]


def test_co_map_and_co_flat_map_merge_two_streams_of_different_shapes(run: Any) -> None:
    class Both(yarnflow.CoMapFunction):
        def map1(self, row: dict[str, Any]) -> dict[str, Any]:
            return {"what": "number", "text": str(row["n"])}

        def map2(self, row: dict[str, Any]) -> dict[str, Any]:
            return {"what": "word", "text": row["w"].upper()}

    def build(env: Any) -> None:
        numbers = env.from_collection([{"n": i} for i in range(5)])
        words = env.from_collection([{"w": w} for w in ("a", "bb")])
        numbers.connect(words).map(Both()).collect()
        numbers.connect(words).flat_map(lambda r: [{"x": r["n"]}] * 2, lambda r: [{"x": len(r["w"])}]).collect()
        numbers.connect(words).map_batches(lambda b: b.select(["n"]).rename_columns(["x"]),
                                           lambda b: pc_lengths(b)).collect()

    result = run(build)
    mapped, flat, batched = (result.collected(uid).to_pylist() for uid in result.collect_uids)
    assert sorted((r["what"], r["text"]) for r in mapped) == sorted(
        [("number", str(i)) for i in range(5)] + [("word", "A"), ("word", "BB")])
    assert sorted(r["x"] for r in flat) == sorted([0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 1, 2])
    assert sorted(r["x"] for r in batched) == [0, 1, 1, 2, 2, 3, 4]


def pc_lengths(batch: Any) -> Any:
    import pyarrow as pa
    import pyarrow.compute as pc

    return pa.record_batch({"x": pc.cast(pc.utf8_length(batch.column("w")), pa.int64())})


# argv: ROOT OUT PARALLELISM; the rules engine above as a job file, for the CLI
RULES_JOB = textwrap.dedent("""\
    import sys
    from pathlib import Path
    import yarnflow
    from tests.integration.test_connected_streams import rules_job

    env = yarnflow.StreamExecutionEnvironment.get_execution_environment()
    env.set_parallelism(int(sys.argv[3]))
    rules_job(Path(sys.argv[1]), Path(sys.argv[2]))(env)
    env.execute("rules rescaled")
""")


@pytest.mark.timeout(240)
def test_broadcast_state_is_copied_to_every_subtask_of_a_rescaled_job(cli: Any, local_cluster: Any,
                                                                      tmp_path: Path) -> None:
    """Savepointed at parallelism 2 after some rules arrived, restored at 3: the new third subtask
    has the rules from its copy of the broadcast state (the rules source does not read them
    again), so its keys' events are decided; every event once."""
    root, out = tmp_path / "in", tmp_path / "out"
    write_inputs(root)
    (tmp_path / "job.py").write_text(RULES_JOB)
    cli.env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO_ROOT, cli.env.get("PYTHONPATH", "")]))
    address = local_cluster(taskexecutors=2, slots=3).address
    conf = ["-D", "execution.checkpointing.interval=200 ms", "-D", "execution.batch-size=50"]
    cli.run("run", "-a", address, "--detached", *conf, "job.py", str(root), str(out), "2", check=True)

    job, path = savepoint_after_a_checkpoint(cli, address, str(tmp_path / "savepoints"))
    copies = list(Path(path.removeprefix("file://")).glob("rules-engine/*/operator.broadcast.rules.arrow"))
    assert len(copies) == 2 and all(pads.dataset(str(c), format="arrow").count_rows() > 0 for c in copies), copies
    cli.run("cancel", "-a", address, job, check=True)
    wait_until(lambda: cli.job_status("-a", address, job) == "CANCELED", 30, "not cancelled")

    restored = cli.run("run", "-a", address, "--no-progress", "-s", path, *conf, "job.py", str(root), str(out), "3",
                       timeout=150)
    assert restored.returncode == 0, restored.stderr
    table = pads.dataset(str(out), format="parquet").to_table()
    got = collections.Counter(zip(table["seq"].to_pylist(), table["passed"].to_pylist()))
    assert got == collections.Counter((s, value(s) >= threshold(s % VERSIONS + 1)) for s in range(EVENTS))
