"""What the ZMQ door knows of the models it answers with: a detector as it sees one (`ServedDetector`), where they
come from (`Detectors`: the service's are app/frontdoors/serving.py's), and what an upload came to (`UploadResult`).
Shared by the door (zmq_door.py), its model messages (zmq_models.py) and the uploads (uploads.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class ServedDetector:
    """A detection model as this door sees it: its input, its family (Frigate's model_type), whether it serves."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    family: str              # "ssd": ends in TFLite_Detection_PostProcess
    names: frozenset[str]    # the file names it answers a model_request to, besides its own name (lower case)
    loaded: bool
    state: str               # the registry's: ready, degraded, loading, failed, unhealthy
    hashes: frozenset[str] = frozenset()   # its files' sha256 (an upload of one of them is this model)

    @property
    def input_bytes(self) -> int:
        return int(np.prod(self.shape)) * self.dtype.itemsize


class Detectors(Protocol):
    """The detection models this door may answer with, and a run of one (the service's: app/frontdoors/serving.py)."""

    def detectors(self) -> list[ServedDetector]: ...

    def detector(self, name: str) -> ServedDetector | None:
        """The one of detectors() named `name` (None: not a detector served here), without making the others."""

    def default(self) -> str | None: ...

    async def settled(self, timeout_s: float) -> None:
        """Return once the models configured at start have loaded (or failed), at most timeout_s."""

    async def rows(self, model: str, tensor: np.ndarray) -> tuple[np.ndarray, str]:
        """Frigate's [20, 6] rows for one tensor, and the backend that ran it; a ServeError says why not."""


@dataclass(frozen=True)
class UploadResult:
    saved: bool
    loaded: bool
    model: str | None   # the model that answers this name from now on
    message: str
