"""A native answer's JSON, per request, three ways: what one type per result can cost on the hot path.

For each task's answer (a classification of 5 classes, a detection of 20 objects, a pose of 17 keypoints, a
segmentation of 6 classes), on one thread of the event loop's kind:
  - orjson: `Answer.json`, straight from the result's dataclasses (what the native routes send);
  - TypeAdapter: the same dataclasses dumped by the schema's own pydantic TypeAdapter (`answer_adapter`), the flat
    answer built from the envelope first (what "dataclasses checked by one TypeAdapter" would cost if it serialized);
  - pydantic models: the result as pydantic BaseModels (made field for field from the dataclasses, as a task would
    build its result if its one type were pydantic), built validated and dumped with model_dump_json (the
    classify route's cost before orjson, with its pydantic copy of the result, was of this kind).
Each figure is the median over rounds of the mean per call, in microseconds, beside its ratio to orjson's; the bytes
of the first two are checked equal first.

Example usage:
    python bench/answer_json.py              # medians of 7 rounds of 2000 calls
    python bench/answer_json.py -n 200 --rounds 3
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import operator
import sys
import time
import types
import typing
from pathlib import Path
from typing import Annotated

import numpy as np
from pydantic import BaseModel, create_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.tasks import TASKS, Answer  # noqa: E402
from app.tasks.classify import Classification, Prediction  # noqa: E402
from app.tasks.detect import Box, DetectedObject, Detection  # noqa: E402
from app.tasks.pose import KEYPOINT_NAMES, Keypoint, Pose, Poses  # noqa: E402
from app.tasks.results import ImageSize, answer_adapter, answer_schema, wire_fields  # noqa: E402
from app.tasks.segment import ClassShare, Sampling, Segmentation  # noqa: E402
from bench.common import load_average  # noqa: E402
from bench.stats import median  # noqa: E402

TIMING = {"decode": 1.1234567, "preprocess": 2.62, "queue": 0.118, "inference": 7.41, "postprocess": 0.2, "total": 11.5}
WARMUP = {"load_ms": 7.5, "first_inference_ms": 7.8}


def results(rng: np.random.Generator) -> dict[str, object]:
    """One result of each task, shaped as the committed models give them."""
    image = ImageSize(640, 480)
    # Python floats, as the tasks give them (numpy scalars are a slower path for every serializer)
    boxes = [Box(*sorted(rng.uniform(0, 640, 2).tolist()), *sorted(rng.uniform(0, 480, 2).tolist())) for _ in range(20)]
    return {
        "classification": Classification([Prediction(i, f"label {i}", s)
                                          for i, s in enumerate(sorted(rng.random(5).tolist(), reverse=True))]),
        "detection": Detection(image, [DetectedObject("person", 0, float(rng.random()), box,
                                                      Box(box.x_min / 640, box.y_min / 480, box.x_max / 640,
                                                          box.y_max / 480)) for box in boxes]),
        "pose": Poses(image, [Pose(0.6, [Keypoint(name, *rng.uniform(0, 480, 3).tolist()) for name in
                                         KEYPOINT_NAMES])]),
        "segmentation": Segmentation(image, [ClassShare(i, f"class {i}", 1 / 6) for i in range(6)], 1.0,
                                     np.zeros((513, 513), np.int64), Sampling(*(np.zeros(4, np.int64),) * 4), 21),
    }


@functools.cache
def as_model(kind: type) -> type[BaseModel]:
    """A pydantic model with a dataclass's wire fields, field for field (nested dataclasses as models too)."""
    hints = typing.get_type_hints(kind, include_extras=True)
    return create_model(f"{kind.__name__}Model", **{name: (_modelled(hints[name]), ...) for name in wire_fields(kind)})


def _modelled(hint):
    if typing.get_origin(hint) is Annotated:
        return Annotated[(_modelled(typing.get_args(hint)[0]), *typing.get_args(hint)[1:])]
    if typing.get_origin(hint) is list:
        return list[_modelled(typing.get_args(hint)[0])]
    if typing.get_origin(hint) is tuple:
        return tuple[_modelled(typing.get_args(hint)[0]), ...]
    if isinstance(hint, types.UnionType):  # detection's objects, with landmarks or without
        return functools.reduce(operator.or_, [_modelled(arg) for arg in typing.get_args(hint)])
    return as_model(hint) if dataclasses.is_dataclass(hint) else hint


def modelled(value):
    """A dataclass value as its pydantic model, built (validated) field for field."""
    if isinstance(value, (list, tuple)):
        return type(value)(modelled(v) for v in value)
    if dataclasses.is_dataclass(value):
        return as_model(type(value))(**{name: modelled(getattr(value, name)) for name in wire_fields(type(value))})
    return value


def ways(answer: Answer) -> dict[str, typing.Callable[[], bytes]]:
    kind = type(answer.result)
    task = next(t for t in TASKS.values() if t.result is kind)
    name = f"{task.verb.capitalize()}Response"
    flat, adapter = answer_schema(kind, name), answer_adapter(kind, name)
    response = create_model(name + "Model", model=(str, ...), backend=(str, ...), **{
        field: (_modelled(typing.get_type_hints(kind, include_extras=True)[field]), ...) for field in wire_fields(kind)},
        timing_ms=(dict, ...), warmup=(dict, ...), cold=(bool, ...))

    def envelope() -> dict:
        return {"model": answer.model, "backend": answer.backend, "timing_ms": answer.timing_ms,
                "warmup": answer.warmup, "cold": answer.cold}

    def type_adapter() -> bytes:
        return adapter.dump_json(flat(**envelope(), **{f: getattr(answer.result, f) for f in wire_fields(kind)}))

    def pydantic_models() -> bytes:
        fields = {f: modelled(getattr(answer.result, f)) for f in wire_fields(kind)}
        return response(**envelope(), **fields).model_dump_json().encode()

    return {"orjson": answer.json, "TypeAdapter": type_adapter, "pydantic models": pydantic_models}


def per_call_us(fn, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=2000, help="calls per round")
    parser.add_argument("--rounds", type=int, default=7, help="rounds; medians are reported")
    args = parser.parse_args(argv)
    print(f"a native answer's JSON per call, us (median of {args.rounds} rounds of {args.n}; load average "
          f"{load_average()})")
    print(f"{'answer':<16}{'orjson':>10}{'TypeAdapter':>14}{'ratio':>8}{'pydantic models':>18}{'ratio':>8}")
    for task, result in results(np.random.default_rng(5)).items():
        answer = Answer(model="m", backend="cpu", result=result, timing_ms=TIMING, warmup=WARMUP, cold=False)
        made = ways(answer)
        if made["orjson"]() != made["TypeAdapter"]():
            raise SystemExit(f"{task}: orjson's bytes are not the TypeAdapter's")
        figures = {way: median([per_call_us(fn, args.n) for _ in range(args.rounds)]) for way, fn in made.items()}
        base = figures["orjson"]
        print(f"{task:<16}{base:>10.2f}{figures['TypeAdapter']:>14.2f}{figures['TypeAdapter'] / base:>8.2f}"
              f"{figures['pydantic models']:>18.2f}{figures['pydantic models'] / base:>8.2f}")


if __name__ == "__main__":
    main()
