"""What a v2 model looks like on the wire, and one inference request run through the core.

Each model has one input, `image`, in either of two forms told apart by its datatype:
  - the model's own input tensor, already resized: UINT8 (or INT8) [N, H, W, C]; no decoding;
  - encoded images (JPEG, PNG, ...) as BYTES [N], preprocessed by the service as /v1 does.
Its outputs are its task's named outputs (app/tasks/: Task.named_outputs), each [N, ...]; a classifier
has two: `scores` FP32 [N, classes] (dequantized, softmax for logit models: the scores /v1 reports)
and `raw` [N, classes], the output tensor as the model gave it (its scale and zero point in the
model's config). N inputs run as N invokes spread over the pool, answered in order. No web
framework here: the router hands this module an InferRequest, the core and the request's ticket on the model.

Admission: the router holds the model through the core (the model version, and a 503 at once if
the line is full) before it reads the body; once the body is here, a request of N inputs takes N
places on that version before any decoding, all or none (Core.tensors): a line too short for the
whole batch refuses it at once (Busy, 503).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from app.api.v2.wire import BYTES, InferRequest, InputTensor, OutputTensor, classification, datatype_of
from app.core import Core, ImageInput, ModelDescription, Tensors, TensorInput, Ticket
from app.errors import RequestError
from app.registry import ModelVersion
from app.tasks import NamedOutput

INPUT = "image"
VERSION = "1"  # one version per model name today
PLATFORM = "tflite"


@dataclass(frozen=True)
class Limits:
    max_batch: int
    max_classification: int


def named_outputs(model: ModelVersion, backend: str) -> tuple[NamedOutput, ...]:
    """The model's outputs on the wire: its task's named tensors on that backend's pool (made at load)."""
    model.pool(backend)  # BackendNotAvailable for a backend not loaded
    return model.roles[backend].named


def model_metadata(model: ModelDescription, backend: str) -> dict:
    """The model's v2 metadata, from the core's description of it: its input and its task's named outputs on
    `backend`."""
    served = model.backends[backend]
    return {
        "name": model.name,
        "versions": [VERSION],
        "platform": PLATFORM,
        "inputs": [{"name": INPUT, "datatype": datatype_of(np.dtype(served.input.dtype)),
                    "shape": [-1, *served.input.shape[1:]]}],
        "outputs": [{"name": out.name, "datatype": datatype_of(np.dtype(out.dtype)), "shape": [-1, *out.shape]}
                    for out in served.outputs],
    }


def model_config(model: ModelDescription, backend: str, limits: Limits) -> dict:
    """Triton's model configuration, as far as clients read it (perf_analyzer: inputs, outputs,
    max_batch_size 0 = the batch dimension is part of each shape)."""
    meta = model_metadata(model, backend)
    quantized = {}  # a tensor as the model gave it: its quantization (a classifier's raw_scale, raw_zero_point)
    for out in model.backends[backend].outputs:
        if out.scale is not None:
            quantized[f"{out.name}_scale"] = {"string_value": repr(out.scale)}
            quantized[f"{out.name}_zero_point"] = {"string_value": str(out.zero_point)}
    return {
        "name": model.name,
        "platform": PLATFORM,
        "backend": backend,
        "max_batch_size": 0,
        "input": [{"name": t["name"], "data_type": f"TYPE_{t['datatype']}", "dims": t["shape"]}
                  for t in meta["inputs"]],
        "output": [{"name": t["name"], "data_type": f"TYPE_{t['datatype']}", "dims": t["shape"]}
                   for t in meta["outputs"]],
        "parameters": {
            "backends": {"string_value": ",".join(model.backends)},
            **quantized,
            "max_inputs_per_request": {"string_value": str(limits.max_batch)},
            "bytes_input": {"string_value": f"{INPUT} may also be BYTES [N]: encoded images (JPEG, PNG, ...)"},
        },
    }


async def infer(core: Core, ticket: Ticket, backend: str, request: InferRequest,
                limits: Limits) -> tuple[list[OutputTensor], dict]:
    """Run every input of the request on `backend` of the held version; the outputs asked for, and the timings
    as parameters."""
    start = time.perf_counter()
    model = ticket.version
    spec = ticket.input_on(backend)  # an unknown backend fails before any work
    outputs = named_outputs(model, backend)
    wanted = _wanted_outputs(request, limits, [out.name for out in outputs])
    tensor = _the_input(request)
    if tensor.datatype == BYTES:
        if len(tensor.shape) not in (1, 2) or (len(tensor.shape) == 2 and tensor.shape[1] != 1):
            raise RequestError(f"input {INPUT!r}: BYTES images have shape [N] (or [N, 1]), got {list(tensor.shape)}")
        _check_batch(len(tensor.data), limits)
        inputs = [ImageInput(data) for data in tensor.data]
    else:
        expected = datatype_of(spec.dtype)
        if tensor.datatype != expected:
            raise RequestError(f"input {INPUT!r}: model {model.name!r} takes {expected} tensors "
                               f"[N, {', '.join(map(str, spec.shape[1:]))}] or BYTES images; got {tensor.datatype}")
        if len(tensor.shape) != len(spec.shape) or tuple(tensor.shape[1:]) != tuple(spec.shape[1:]):
            raise RequestError(f"input {INPUT!r}: shape must be [N, {', '.join(map(str, spec.shape[1:]))}], "
                               f"got {list(tensor.shape)}")
        _check_batch(tensor.shape[0], limits)
        inputs = [TensorInput(tensor.data[i:i + 1]) for i in range(tensor.shape[0])]
    results = await core.tensors(ticket, inputs, backend)
    answer = [_output(name, binary, k, results, model) for name, binary, k in wanted]
    parameters = {"backend": backend, "cold": any(r.cold for r in results)}
    for stage in ("decode", "preprocess", "queue", "inference"):
        parameters[f"{stage}_ms"] = round(sum(r.stages_ms.get(stage, 0.0) for r in results), 3)
    parameters["total_ms"] = round((time.perf_counter() - start) * 1000, 3)
    return answer, parameters


def _the_input(request: InferRequest) -> InputTensor:
    if len(request.inputs) != 1 or request.inputs[0].name != INPUT:
        names = [t.name for t in request.inputs]
        raise RequestError(f"the model has one input, {INPUT!r}; the request has {names}")
    return request.inputs[0]


def _check_batch(n: int, limits: Limits) -> None:
    if n < 1:
        raise RequestError(f"input {INPUT!r} holds no images")
    if n > limits.max_batch:
        raise RequestError(f"input {INPUT!r} holds {n} images; at most {limits.max_batch} per request "
                           "(EDGETPU_SERVE_V2_MAX_BATCH)")


def _wanted_outputs(request: InferRequest, limits: Limits, names: list[str]) -> list[tuple[str, bool, int | None]]:
    if request.outputs is None:
        return [(name, request.binary_default, None) for name in names]
    wanted = []
    for out in request.outputs:
        if out.name not in names:
            raise RequestError(f"unknown output {out.name!r}; the model's outputs are {names}")
        if out.classification is not None and out.classification > limits.max_classification:
            raise RequestError(f"output {out.name!r}: classification {out.classification} exceeds "
                               f"{limits.max_classification}")
        wanted.append((out.name, out.binary, out.classification))
    return wanted


def _output(name: str, binary: bool, k: int | None, results: list[Tensors], model: ModelVersion) -> OutputTensor:
    rows = np.stack([each.values[name] for each in results])
    if k is None:
        return OutputTensor(name, datatype_of(rows.dtype), rows.shape, rows, binary)
    labels = model.model_dir.labels
    rows = rows.reshape(len(results), -1)  # the classification extension ranks each input's values
    k = min(k, rows.shape[1])
    elements = [e for row in rows for e in classification(row, k, labels)]
    return OutputTensor(name, BYTES, (len(results), k), elements, binary)
