"""The classify route's JSON (orjson, straight from the dataclasses) is ClassifyResponse's own."""

import numpy as np

from app.api.classify import response_body
from app.tasks import Answer
from app.tasks.classify import TASK, Classification, ClassifyResponse, scores, top_predictions
from app.model_dir.reading import read_model_dir
from tests.conftest import DEFAULT_MODEL, MODELS


def classification(first_inference_ms, cold) -> Answer[Classification]:
    model_dir = read_model_dir(MODELS / DEFAULT_MODEL)
    out = np.random.default_rng(3).integers(0, 256, (1, 1000), np.uint8)
    predictions = top_predictions(scores(out, 0.093, 127, model_dir), model_dir.labels, 7, 0.0)
    return Answer(model=DEFAULT_MODEL, backend="cpu", result=Classification(predictions),
                          timing_ms={"decode": 0.1234567890123, "preprocess": 1e-7, "queue": 0.03125, "inference": 2.5,
                                     "postprocess": 0.0, "total": 1234.5},
                          warmup={"load_ms": 161.25, "first_inference_ms": first_inference_ms}, cold=cold)


def test_the_body_is_byte_identical_to_the_schemas_serialization():
    for first, cold in ((2.75, False), (None, True)):
        answer = classification(first, cold)
        fields = {name: answer.field(name) for name in ClassifyResponse.model_fields}  # the answer's, its result's
        expected = ClassifyResponse.model_validate(fields, from_attributes=True).model_dump_json().encode()
        assert response_body(answer) == expected
        assert list(TASK.native(answer)) == list(ClassifyResponse.model_fields)
