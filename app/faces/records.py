"""What the gallery takes and hands back: plain frozen records, no database handles in them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from app.faces.regions import FaceRegion


@dataclass(frozen=True)
class NewFace:
    """A face to register: its region (app/faces/regions.py cut_region) and its embedding by the current embedder,
    made from `region.pixels()` and L2-normalized."""

    region: FaceRegion
    vector: np.ndarray


@dataclass(frozen=True)
class StoredFace:
    """A registered face: its id (never reused), its person's userid, its region."""

    face_id: int
    userid: str
    region: FaceRegion


@dataclass(frozen=True)
class Registration:
    """What register() did: whether the person is new, the faces it added and those it replaced."""

    userid: str
    created: bool
    added: int
    replaced: int
    faces: int  # the person's faces now
    erased: bool  # the replaced faces' bytes are gone from every file (True when none were replaced)
    held: int = 0  # faces given that the person had already (the same region and vector): not added again


@dataclass(frozen=True)
class Deletion:
    """What delete() did. `erased` is False only when another connection's reader kept the WAL past the busy
    timeout: the faces are deleted (committed) and their bytes go at the next erase, Gallery.erase_freed()."""

    userid: str
    faces: int
    erased: bool


@dataclass(frozen=True)
class Person:
    """A registered person: faces, and how many of them each embedder (by sha256) has a vector for."""

    userid: str
    faces: int
    created: float  # Unix time of the first registration
    embedded: dict[str, int]


@dataclass(frozen=True)
class Coverage:
    """How much of the gallery one embedder can recognize: the people whose every face has its vector, and those
    that need re-embedding (app/faces/reembed.py) before it recognizes them fully."""

    embedder: str
    people: int
    faces: int
    embedded_faces: int
    missing: tuple[str, ...]  # userids with at least one face this embedder has no vector for

    @property
    def complete(self) -> bool:
        return not self.missing


@dataclass(frozen=True)
class EmbedderVectors:
    """An embedder the gallery holds vectors of: its sha256, their dimension, how many."""

    sha256: str
    dimension: int
    vectors: int


@dataclass(frozen=True)
class Match:
    """The person nearest a query face: cosine similarity of unit vectors, in [-1, 1]. How similar is similar
    enough is the embedder's calibrated threshold, the caller's (the gallery only ranks)."""

    userid: str
    similarity: float
