"""schemathesis against the REST API's own OpenAPI document (``/v1/openapi.json``) on a live
local cluster: generated ids, queries and bodies for every operation must get an answer that
the document describes (status, content type, JSON schema), never a 500 or a dropped
connection; then the same operations on the real running job, vertex and TaskExecutor."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from tests.harness import wait_until
from tests.integration.test_rest_api import cluster  # noqa: F401 - the fixture
from tests.rest import generator_job, get, submit, wait_flowing

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_the_api_keeps_to_its_openapi_document(cluster: Any, tmp_path: Path) -> None:  # noqa: F811
    web = cluster.web
    job_id = submit(cluster, generator_job(str(tmp_path / "out")), "fuzzed",
                    {"execution.checkpointing.interval": "300 ms", "state.savepoints.dir": str(tmp_path / "sp")})
    details = wait_flowing(web, job_id)
    schema = schemathesis.openapi.from_url(f"{web}/v1/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == 64

    for operation in operations:
        if operation.method.upper() == "PATCH" or operation.path == "/cluster":
            continue  # generated cancels and rescales would only meet unknown jobs (the real ones are tested);
            # a shutdown ends the cluster (tests/integration/test_rest_flink_client.py)

        @given(case=operation.as_strategy())
        @settings(max_examples=12, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        def fuzz(case: Any) -> None:
            # a generated artifact never hashes to the sha256 it is sent with: rightly refused (400)
            # although the document cannot say so; the real upload is checked below
            # (and an uploaded job file must be named .py or .zip, which multipart's schema cannot say)
            case.call_and_validate(excluded_checks=[positive_data_acceptance]
                                   if case.path in ("/artifacts", "/jars/upload") else None)

        fuzz()

    # the same operations on what exists: every documented answer, with the real ids
    vertex = details["vertices"][0]["id"]
    checkpoint = wait_until(lambda: get(f"{web}/jobs/{job_id}/checkpoints")["latest"]["completed"], 30,
                            "no checkpoint completed")
    real = {"jobid": job_id, "vertexid": vertex, "tmid": get(f"{web}/taskmanagers")["taskmanagers"][0]["id"],
            "checkpointid": checkpoint["id"], "index": 0,
            "attempt": get(f"{web}/jobs/{job_id}/vertices/{vertex}/subtasks/0")["attempt"]}
    for operation in operations:
        if operation.method.upper() != "GET" or "triggerid" in operation.path or "jarid" in operation.path:
            continue
        names = [p for p in real if "{" + p + "}" in operation.path]
        case = operation.Case(path_parameters={p: real[p] for p in names})
        response = case.call_and_validate()
        assert response.status_code == 200, (operation.path, response.text)
    trigger = operations_by_path(operations, "/jobs/{jobid}/savepoints", "POST").Case(
        path_parameters={"jobid": job_id}, body={}, media_type="application/json")
    response = trigger.call_and_validate()
    assert response.status_code == 202
    status = operations_by_path(operations, "/jobs/{jobid}/savepoints/{triggerid}", "GET").Case(
        path_parameters={"jobid": job_id, "triggerid": response.json()["request-id"]})
    assert status.call_and_validate().status_code == 200
    artifact = b"PK\x05\x06" + b"\0" * 18  # an empty zip
    upload = operations_by_path(operations, "/artifacts", "POST").Case(
        query={"sha256": hashlib.sha256(artifact).hexdigest()}, body=artifact, media_type="application/octet-stream")
    assert upload.call_and_validate().status_code == 201
    cancel = operations_by_path(operations, "/jobs/{jobid}", "PATCH").Case(
        path_parameters={"jobid": job_id}, query={"mode": "cancel"})
    assert cancel.call_and_validate().status_code in (202, 409)  # 409: the savepoint's cancel came first


def operations_by_path(operations: list[Any], path: str, method: str) -> Any:
    return next(op for op in operations if op.path == path and op.method.upper() == method)
