"""Response models: the JSON contract of the HTTP API."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_serializer

from app.engines import BACKENDS


class ErrorResponse(BaseModel):
    error: str


# What the native inference routes (/v1 classify, detect, segment, pose) may answer besides 200: {"error": ...}.
V1_ERRORS = {status: {"model": ErrorResponse} for status in (400, 404, 413, 415, 422, 503, 504)}


class DeepStackPrediction(BaseModel):
    label: str
    confidence: float
    x_min: int = Field(description="pixels of the original image, rounded")
    y_min: int
    x_max: int
    y_max: int


class DeepStackResponse(BaseModel):
    """DeepStack's detection answer, with CodeProject.AI's fields."""

    success: bool
    predictions: list[DeepStackPrediction] = Field(description="best first")
    duration: float = Field(description="the request's time in the service, ms")
    message: str
    count: int
    inferenceMs: int = Field(description="the model's invoke, ms")
    processMs: int = Field(description="decode, preprocess, invoke and post-processing, ms")
    analysisRoundTripMs: int = Field(description="from the request's arrival to its answer, body read included, ms")
    moduleId: str
    moduleName: str
    command: str
    executionProvider: str = Field(description="TPU on the Edge TPU, else CPU")
    timestampUTC: str


class DeepStackError(BaseModel):
    success: bool = False
    error: str
    duration: float = 0


def _plugin_keys(declared: str):
    """json_schema_extra: the keys the registered plug-ins declare (Backend.model_keys or backend_keys),
    listed with what they mean, when GET /openapi.json is built."""

    def add(schema: dict) -> None:
        for key, plugin in BACKENDS.items():
            for name, meaning in getattr(plugin, declared).items():
                schema["properties"].setdefault(name, {"title": name, "description": f"{meaning} (plug-in {key!r})"})

    return add


class TensorOut(BaseModel):
    name: str
    shape: list[int]
    dtype: str
    scale: float
    zero_point: int


class BackendOut(BaseModel):
    """One backend's interpreters of a model. Backend plug-ins add their own keys (Backend.describe_backend):
    an accelerator's plug-in, say, what its compiler would make of the graph this backend runs."""

    model_config = ConfigDict(extra="allow", json_schema_extra=_plugin_keys("backend_keys"))

    interpreters: int
    warm: bool
    load_ms: float
    first_inference_ms: float | None
    input: TensorOut
    output: TensorOut


class FileOut(BaseModel):
    path: str
    sha256: str
    bytes: int


class ImportedFileOut(BaseModel):
    name: str = Field(description="the file's name as it was given to `converter import`")
    sha256: str
    bytes: int
    kind: str = Field(description="the file kind it became in the model directory (int8, or an accelerator's compiled file)")


class ProvenanceOut(BaseModel):
    """Where the model came from: built here from a recipe or by quantize, or imported as a file."""

    origin: str = Field(description="built (a recipe or quantize made it here) or imported (converter import)")
    command: str | None = Field(default=None, description="the command that made the directory (model.json build)")
    files: list[ImportedFileOut] = Field(default_factory=list, description="imported: the files as given")
    labels: str | None = Field(default=None, description="imported: where the labels came from")
    input: str | None = Field(default=None, description="imported: where the input spec came from")
    metadata: dict | None = Field(default=None, description="imported: the file's own TFLite metadata (name, "
                                                              "author, license, ...)")


class ModelOut(BaseModel):
    """A model, its state and its backends. Backend plug-ins add their own keys (Backend.describe_model):
    an accelerator's plug-in, say, the latency model.json estimates on its device (an estimate, not a
    measurement)."""

    model_config = ConfigDict(extra="allow", json_schema_extra=_plugin_keys("model_keys"))

    name: str
    task: str = Field(default="classification", description="what the model answers (model.json `task`): "
                      "classification (/v1/models/NAME/classify) or detection (/v1/models/NAME/detect)")
    state: str = Field(description="loading, ready, degraded (serving, with a problem in `error`), unhealthy, failed")
    error: str | None = None
    since: str | None = Field(default=None, description="when this state began (UTC, ISO 8601)")
    version: int | None = Field(default=None, description="the version serving: 1 at start, +1 per reload")
    loaded_at: str | None = Field(default=None, description="when the serving version loaded (UTC, ISO 8601)")
    default: bool = Field(description="the model of /v1/classify, or for a detector of /v1/detect and "
                                      "/v1/vision/detection")
    description: str
    source: str
    licence: str
    labels: int
    input: dict
    output: dict
    backends: dict[str, BackendOut] = Field(description="backend key -> its interpreters of this model")
    files: dict[str, FileOut]
    quality: dict | None = None
    provenance: ProvenanceOut
    segments: dict | None = Field(default=None, description="a segmented model, served as a pipeline: its "
                                  "segments in order (model.json `segments`, docs/pipelines.md)")


class ModelsOut(BaseModel):
    default_model: str | None  # None: no classification model is served
    default_detection_model: str | None = None  # None: no detection model is served
    default_backend: str
    models: list[ModelOut]


class ModelStateOut(BaseModel):
    state: str = Field(description="loading, ready, degraded (serving, with a problem in `error`), unhealthy, failed")
    error: str | None = None
    since: str | None = Field(default=None, description="when this state began (UTC, ISO 8601)")


class WorkerStateOut(BaseModel):
    slot: int = Field(description="the worker's slot (0 to N-1), kept by the worker that replaces it")
    pid: int | None = Field(description="its process; null when it did not answer")
    answering: bool = Field(description="false: gone (a replacement on its way), or not started yet")
    ready: bool
    versions: dict[str, int | None] = Field(description="model -> the version it serves (+1 per reload)")
    devices: list[str] = Field(default=[], description="the devices it serves on (its TPUs: each is one worker's)")


class ReadyOut(BaseModel):
    ready: bool
    models: dict[str, ModelStateOut]
    error: str | None = None
    workers: list[WorkerStateOut] | None = Field(
        default=None, description="several worker processes (EDGETPU_SERVE_PROCESSES): each one's own view; "
                                  "`models` then merges them (degraded where some worker does not serve a model)")

    @model_serializer(mode="wrap")
    def _workers_only_when_several(self, handler):
        """One process answers as it always has: no `workers` key rather than a null."""
        data = handler(self)
        if data.get("workers") is None:
            data.pop("workers", None)
        return data


class LiveOut(BaseModel):
    live: bool
