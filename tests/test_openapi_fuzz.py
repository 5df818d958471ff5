"""schemathesis against the live service's OpenAPI: whatever it sends, no 5xx and no schema drift.

Driven through its Hypothesis strategies (its pytest plugin does not run on pytest 9),
both for requests the schema allows and for requests it forbids.
"""

from collections import Counter

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import negative_data_rejection, status_code_conformance

EXAMPLES_PER_OPERATION = 40
CLASSIFY = {"POST /v1/classify", "POST /v1/models/{name}/classify"}


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_server_errors(service, mode):
    schema = schemathesis.openapi.from_url(f"{service.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.label for op in operations} >= CLASSIFY | {"GET /readyz", "GET /v1/models"}
    ran = Counter()
    for operation in operations:
        if operation.path.endswith("/reload"):
            continue  # reloading makes requests cold for the other tests; covered in test_api

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        def check(case):
            checks = [not_a_server_error, status_code_conformance]
            if mode == GenerationMode.NEGATIVE:
                checks.append(negative_data_rejection)
            case.call_and_validate(base_url=service.url, checks=checks)
            ran[case.operation.label] += 1

        try:
            check()
        except Unsatisfiable:
            # nothing in this operation's request can be made invalid (e.g. no parameters)
            assert mode == GenerationMode.NEGATIVE and operation.label not in CLASSIFY
    assert all(ran[label] >= EXAMPLES_PER_OPERATION // 2 for label in CLASSIFY), ran
