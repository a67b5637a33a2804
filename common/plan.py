"""A job's dataflow plan in Flink's JobPlanInfo shape (``/jobs/:jobid/plan``, ``/jars/:jarid/plan``,
``yarnflow plan``): its vertices with their parallelism, operators and inputs."""

from __future__ import annotations

from typing import Any, Mapping

from yarnflow.common.messages import JobGraph


def job_plan(graph: JobGraph, name: str, parallelism: Mapping[str, int] | None = None,
             names: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``{"plan": {...}}``; ``parallelism`` and ``names`` (by vertex id): a running job's own,
    where they differ from the JobGraph's (an adaptive scheduler's decision)."""
    nodes = []
    for jv in graph.vertices:
        vid = str(jv.vertex_id)
        inputs = [{"num": e.input_index, "id": str(e.source_vertex_id), "ship_strategy": e.partitioner.name,
                   "exchange": e.exchange_mode.name.lower()}
                  for e in graph.edges if e.target_vertex_id == jv.vertex_id]
        nodes.append({"id": vid, "parallelism": (parallelism or {}).get(vid, jv.parallelism), "operator": "",
                      "operator_strategy": "", "description": " -> ".join(jv.operator_names) or jv.name,
                      "optimizer_properties": {}, "inputs": inputs, "name": (names or {}).get(vid, jv.name)})
    return {"plan": {"jid": str(graph.job_id), "name": name, "type": graph.runtime_mode, "nodes": nodes}}
