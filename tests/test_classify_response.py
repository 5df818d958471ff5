"""The classify route's JSON (orjson, straight from the dataclasses: Answer.json) is byte for byte what its schema's
TypeAdapter dumps, on a real classification of the committed model's 1000 classes."""

import numpy as np

from app.model_dir.reading import read_model_dir
from app.tasks import Answer
from app.tasks.results import answer_adapter, answer_schema
from app.tasks.classify import TASK, Classification, scores, top_predictions
from tests.conftest import DEFAULT_MODEL, MODELS

NAME = "ClassifyResponse"


def classification(first_inference_ms, cold) -> Answer[Classification]:
    model_dir = read_model_dir(MODELS / DEFAULT_MODEL)
    out = np.random.default_rng(3).integers(0, 256, (1, 1000), np.uint8)
    predictions = top_predictions(scores(out, 0.093, 127, model_dir), model_dir.labels, 7, 0.0)
    return Answer(model=DEFAULT_MODEL, backend="cpu", result=Classification(predictions),
                  timing_ms={"decode": 0.1234567890123, "preprocess": 1e-7, "queue": 0.03125, "inference": 2.5,
                             "postprocess": 0.0, "total": 1234.5},
                  warmup={"load_ms": 161.25, "first_inference_ms": first_inference_ms}, cold=cold)


def test_the_body_is_byte_identical_to_the_schemas_serialization():
    assert TASK.result is Classification
    for first, cold in ((2.75, False), (None, True)):
        answer = classification(first, cold)
        flat = answer_schema(Classification, NAME)(model=answer.model, backend=answer.backend,
                                                   predictions=answer.result.predictions, timing_ms=answer.timing_ms,
                                                   warmup=answer.warmup, cold=answer.cold)
        assert answer.json() == answer_adapter(Classification, NAME).dump_json(flat)
        assert list(answer_adapter(Classification, NAME).json_schema()["properties"]) == [
            "model", "backend", "predictions", "timing_ms", "warmup", "cold"]
