"""Response models: the JSON contract of the HTTP API."""

from __future__ import annotations

from pydantic import BaseModel, Field, model_serializer


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
