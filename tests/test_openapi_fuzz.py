"""schemathesis against the live service's OpenAPI: whatever it sends, no 5xx and no schema drift.

Every operation, `/v1/models/{name}/reload` included, with schemathesis' full check set (response
bodies against their schemas, status codes and content types as documented, schema-valid data
accepted, schema-invalid data rejected, ...), on fixed examples (derandomized: the same requests
every run, so a failure reproduces). Driven through its Hypothesis strategies (its pytest plugin
does not run on pytest 9), both for requests the schema allows and for requests it forbids.
"""

import re
from collections import Counter

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import CHECKS, load_all_checks
from schemathesis.config import SchemathesisConfig

from tests.conftest import ROOT, Service
from tests.hostile_json import HOSTILE_BODIES

EXAMPLES_PER_OPERATION = 40
CLASSIFY = {"POST /v1/classify", "POST /v1/models/{name}/classify"}
V2_INFER = {"POST /v2/models/{name}/infer", "POST /v2/models/{name}/versions/{version}/infer"}
RELOAD = "POST /v1/models/{name}/reload"
BACKENDS = ["cpu", "emulated"]
# A schema-valid request may still be refused for what a schema cannot say: bytes that are not an
# image (400), a model that does not exist (404), a body over the byte or pixel limit (413), every
# interpreter busy (503). Anything else is drift: a 422 for a value the schema allows, a backend the
# enum offers refused (a wrong backend is a 422, as any value outside the schema: app.errors.BackendNotAvailable).
ACCEPTED_REFUSALS = ["2xx", "400", "404", "413", "503"]
# The face routes answer 503 here, saying the fix (no face models are set: none is committed); they are fuzzed where
# they are set, in tests/test_face_api.py
FACE_PATHS = ("/v1/vision/face", "/v1/faces", "/v1/backup", "/v1/restore")
# The fuzzer's first examples of a body-less operation are few and alike; that is not a defect here.
SUPPRESSED = [HealthCheck.too_slow, HealthCheck.filter_too_much]
load_all_checks()
ALL_CHECKS = CHECKS.get_all()


@pytest.fixture(scope="module")
def fuzzed_service():
    """A service of its own: reload makes requests cold, which other tests of the shared one would see."""
    with Service({"EDGETPU_SERVE_BACKENDS": ",".join(BACKENDS), "EDGETPU_SERVE_WORKERS": "1"}) as service:
        yield service


def test_the_schema_has_the_served_backends_and_the_top_k_limit(fuzzed_service):
    spec = httpx.get(f"{fuzzed_service.url}/openapi.json").json()
    for path in ("/v1/classify", "/v1/models/{name}/classify"):
        parameters = {p["name"]: p for p in spec["paths"][path]["post"]["parameters"]}
        assert parameters["backend"]["schema"]["enum"] == BACKENDS and not parameters["backend"].get("required", False)
        assert parameters["top_k"]["schema"]["maximum"] == 1000  # MAX_TOP_K's default, from the settings
    assert "422" in spec["paths"]["/v1/classify"]["post"]["responses"]


def test_a_backend_outside_the_enum_is_a_422_as_the_schema_and_the_docs_say(fuzzed_service, cat_png):
    """One contract for a wrong backend name: the schema's enum refuses it, the service answers 422 naming
    the served ones (never 400, which is for the image), and docs/api.md's error table says 422."""
    with httpx.Client(base_url=fuzzed_service.url, timeout=30) as client:
        for path in ("/v1/classify", "/v1/models/fashion_mnist/classify"):
            refused = client.post(f"{path}?backend=gpu", files={"image": cat_png.read_bytes()})
            assert refused.status_code == 422, refused.text
            assert "'gpu'" in refused.json()["error"] and all(b in refused.json()["error"] for b in BACKENDS)
    api = (ROOT / "docs" / "api.md").read_text()
    assert re.search(r"^\| 422 \|[^\n]*`backend`", api, re.M), "docs/api.md: the 422 row names `backend`"


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_server_errors_and_no_drift(fuzzed_service, mode):
    config = SchemathesisConfig.from_dict(
        {"checks": {"positive_data_acceptance": {"expected-statuses": ACCEPTED_REFUSALS}}})
    schema = schemathesis.openapi.from_url(f"{fuzzed_service.url}/openapi.json", config=config)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.label for op in operations} >= CLASSIFY | V2_INFER | {RELOAD, "GET /readyz", "GET /v1/models",
                                                                      "GET /v2/models/{name}", "GET /metrics"}
    assert {"response_schema_conformance", "positive_data_acceptance"} <= {c.__name__ for c in ALL_CHECKS}
    ran = Counter()
    for operation in operations:
        if operation.path.startswith(FACE_PATHS):
            continue

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, database=None, derandomize=True,
                  suppress_health_check=SUPPRESSED)
        def check(case):
            case.call_and_validate(base_url=fuzzed_service.url, checks=ALL_CHECKS)
            ran[case.operation.label] += 1

        try:
            check()
        except Unsatisfiable:
            # nothing in this operation's request can be made invalid (no parameters, or only a
            # free-form string in the path, as reload's model name)
            assert mode == GenerationMode.NEGATIVE and operation.label not in CLASSIFY | V2_INFER
    exercised = CLASSIFY | V2_INFER | ({RELOAD} if mode == GenerationMode.POSITIVE else set())
    assert all(ran[label] >= EXAMPLES_PER_OPERATION // 2 for label in exercised), ran


@pytest.mark.parametrize("path", ["/v2/models/fashion_mnist/infer", "/v2/models/fashion_mnist/versions/1/infer"])
def test_hostile_json_bodies_get_a_400_that_says_why(fuzzed_service, path):
    """What a schema-driven fuzzer does not think of: nesting past the decoder's stack, numbers
    past Python's digits limit, NaN, a key twice, ... over the wire: each a 400, none a 500."""
    with httpx.Client(base_url=fuzzed_service.url, timeout=30) as client:
        for case, body, message in HOSTILE_BODIES:
            response = client.post(path, content=body, headers={"content-type": "application/json"})
            assert response.status_code == 400, (case, response.status_code, response.text[:200])
            assert message in response.json()["error"], case
