"""Property-based fuzzing of the HTTP API from its own OpenAPI schema (schemathesis):
no server errors, and every response matches the schema, against the real stack."""

from __future__ import annotations

import collections

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.integration.conftest import ApiStack

# Short waits on /v1/context and no rate limit: the fuzzer explores instead of waiting.
API_ENV = {"WEBCTX_API_CONTEXT_TIMEOUT_S": "1", "WEBCTX_API_RATE_LIMIT_PER_MINUTE": "1000000"}
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
    negative_data_rejection,
]
MAX_EXAMPLES = 30


@pytest.mark.slow
def test_api_conforms_to_its_openapi_schema(api_stack: ApiStack) -> None:
    # Loaded by hand rather than with schemathesis.pytest.from_fixture, which does not
    # run under pytest 9 (it reads a private attribute pytest removed).
    schema = schemathesis.openapi.from_url(f"{api_stack.url}/openapi.json")
    auth = {"Authorization": f"Bearer {api_stack.keys['alpha']}"}
    counts: collections.Counter[str] = collections.Counter()
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 8

    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=MAX_EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def run(case: schemathesis.Case) -> None:
            response = case.call_and_validate(headers=auth, checks=CHECKS, timeout=30)
            counts["cases"] += 1
            counts[str(response.status_code)] += 1

        run()
    print(f"fuzz: {len(operations)} operations, {dict(counts)}")
    assert counts["cases"] >= len(operations) * 5
    assert not any(code.startswith("5") for code in counts)
