"""The face routes' JSON contract (GET /openapi.json): DeepStack's face answers and forms, the native /v1/faces
answers, and the statuses each may answer besides 200."""

from __future__ import annotations

from pydantic import BaseModel, Field

from app.api.schemas import DeepStackError, ErrorResponse

# DeepStack's face routes: their statuses besides 200 (403: an admin route with no admin key set, off loopback)
DEEPSTACK_ERRORS = {status: {"model": DeepStackError} for status in (400, 401, 403, 413, 503)}
# /v1/faces: {"error": ...} with the gallery's statuses
NATIVE_ERRORS = {status: {"model": ErrorResponse} for status in (400, 401, 403, 404, 409, 413, 503)}
KEY_FIELD = {"description": "one of the service's API keys, when keys are set"}
ADMIN_FIELD = {"description": "an admin key (for backup and restore; for register and delete with "
                              "FACE_EDITS_NEED_ADMIN)"}
PHOTO = {"type": "string", "format": "binary"}


def form(description: str, required: tuple[str, ...] = (), **properties: dict) -> dict:
    """openapi_extra of a route that reads a multipart form (app/api/face_forms.py)."""
    return {"requestBody": {"required": bool(required), "description": description, "content": {
        "multipart/form-data": {"schema": {"type": "object", "required": list(required), "properties": {
            **properties, "api_key": KEY_FIELD, "admin_key": ADMIN_FIELD}}}}}}


class DeepStackAnswer(BaseModel):
    success: bool
    duration: float = Field(description="the request's time in the service, ms")
    command: str
    moduleId: str
    analysisRoundTripMs: int
    timestampUTC: str
    message: str | None = None


class FaceBox(BaseModel):
    x_min: int = Field(description="pixels of the photo as a viewer shows it, rounded")
    y_min: int
    x_max: int
    y_max: int


class DetectedFace(FaceBox):
    confidence: float = Field(description="the detector's")


class RecognizedFace(FaceBox):
    userid: str = Field(description="the person, or \"unknown\" below min_confidence")
    confidence: float = Field(description="the similarity through the embedder's calibration: 0.5 at its threshold; "
                                          "0 for unknown")


class FaceDetectAnswer(DeepStackAnswer):
    count: int
    predictions: list[DetectedFace] = Field(description="best first")


class FaceRecognizeAnswer(DeepStackAnswer):
    count: int
    predictions: list[RecognizedFace]


class FaceRegisterAnswer(DeepStackAnswer):
    userid: str
    faces: int = Field(description="the person's faces now")


class FaceListAnswer(DeepStackAnswer):
    count: int
    faces: list[str] = Field(description="the userids, in the order first registered")


class FaceMatchAnswer(DeepStackAnswer):
    similarity: float = Field(description="DeepStack's and CodeProject.AI's: (cosine + 1) / 2 of the two photos' "
                                          "largest faces, in [0, 1]")
    cosine: float = Field(description="their cosine similarity, in [-1, 1]")
    confidence: float | None = Field(default=None, description="where the embedder is calibrated")


class PersonOut(BaseModel):
    userid: str
    faces: int
    registered: str = Field(description="when first registered (UTC, ISO 8601)")
    covered: bool = Field(description="every face has a vector of the embedder served")


class EmbedderOut(BaseModel):
    sha256: str = Field(description="the embedder's model file's")
    dimension: int
    vectors: int
    served: bool


class PeopleOut(BaseModel):
    count: int
    faces: int
    embedder: str = Field(description="the embedder served: its model file's sha256")
    people: list[PersonOut]
    embedders: list[EmbedderOut]


class RegisteredOut(BaseModel):
    userid: str
    created: bool = Field(description="a person new to the gallery")
    added: int
    replaced: int = Field(description="earlier faces replaced (replace=true)")
    faces: int = Field(description="the person's faces now")
    several_faces: list[int] = Field(description="0-based indices of the photos with more than one face (their "
                                                 "largest was registered)")


class DeletedOut(BaseModel):
    userid: str
    faces: int
    erased: bool = Field(description="the faces' bytes gone from every file of the gallery (else at the next erase)")
