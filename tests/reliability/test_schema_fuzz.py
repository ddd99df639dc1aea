"""schemathesis against the service's own OpenAPI schema: every operation, valid and invalid input.

A real server (uvicorn on 127.0.0.1, the bundled model, a small saved index) publishes its schema at
``/openapi.json``; schemathesis loads it from there and, for every operation in it, generates
requests that fit the schema (positive) and requests that break it (negative), sends them, and checks
each response: never a 5xx, a status code the schema documents for that operation, the content
type it documents, the body valid against the documented response schema. Examples per operation are few
(3 valid, 2 invalid, plus the schema's own examples: the budget is about half a minute on two cores); the
server's limits are set low (and the schema says so) so that generation stays short.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from rag.api import Settings
from tests.reliability.corpus import DOCUMENTS

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
EXAMPLES = {GenerationMode.POSITIVE: 3, GenerationMode.NEGATIVE: 2}


@pytest.fixture(scope="module")
def server(serve, engine, tmp_path_factory):
    from rag.api.services import build_pipeline

    config = Settings(
        index_dir=tmp_path_factory.mktemp("fuzz") / "index",
        max_tokens_limit=4,
        default_max_tokens=2,
        max_question_chars=300,
        max_messages=4,
        max_documents_per_request=4,
        max_body_bytes=64 * 1024,
    )
    pipeline = build_pipeline(config.model_copy(update={"warm_up": False}), engine)
    with serve(config, pipeline=pipeline) as srv:
        for part in (DOCUMENTS[:3], DOCUMENTS[3:]):
            assert httpx.post(srv.url + "/v1/documents", json=part, timeout=120).status_code == 201
        yield srv


@pytest.mark.slow
def test_every_operation_survives_schema_driven_fuzzing(server):
    schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 12, [op.label for op in operations]
    statuses: Counter[int] = Counter()
    per_op: Counter[str] = Counter()
    op_seconds: Counter[str] = Counter()
    skipped: list[str] = []
    t0 = time.perf_counter()

    with requests.Session() as session:

        def check(case: Any) -> None:
            t = time.perf_counter()
            reply = case.call(base_url=server.url, session=session, timeout=60)
            op_seconds[case.operation.label] += time.perf_counter() - t
            statuses[reply.status_code] += 1
            per_op[case.operation.label] += 1
            case.validate_response(reply, checks=CHECKS)

        for op in operations:
            for mode, n in EXAMPLES.items():
                try:
                    strategy = op.as_strategy(generation_mode=mode)
                except Unsatisfiable:
                    skipped.append(f"{op.label} ({mode.value})")
                    continue
                run = settings(
                    max_examples=n,
                    deadline=None,
                    derandomize=True,
                    database=None,
                    phases=[Phase.explicit, Phase.generate],
                    suppress_health_check=list(HealthCheck),
                )(given(case=strategy)(check))
                try:
                    run()
                except Unsatisfiable:  # e.g. no way to break a parameterless operation's input
                    skipped.append(f"{op.label} ({mode.value})")

    took = time.perf_counter() - t0
    print(
        f"schemathesis: {len(operations)} operations, {sum(statuses.values())} requests in {took:.1f} s, "
        f"statuses {dict(sorted(statuses.items()))}; per operation (requests, s in calls): "
        + ", ".join(f"{op} {per_op[op]} {op_seconds[op]:.1f}" for op in sorted(per_op))
        + f"; no invalid input possible for {len(skipped)}: {skipped}"
    )
    assert not [s for s in statuses if s >= 500], statuses
    assert all(per_op[op.label] > 0 for op in operations), per_op
    assert httpx.get(server.url + "/healthz").status_code == 200
