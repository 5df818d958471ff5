"""A new embedder's vectors, made from the regions the gallery keeps: what changing the face model takes.

Resumable rather than one long transaction: the faces the new embedder has no vector for are taken a batch at a
time, embedded, and each batch stored in one transaction. A run that is killed, or whose embed function fails,
leaves every stored batch whole, and the next run goes on from where it stopped (it only ever looks for faces
still without a vector). Meanwhile a search with the new embedder sees the people done so far and nobody
half-done with another model's vectors: each vector is tagged with its embedder, and Gallery.coverage() names
the people still missing. The old embedder's vectors stay until Gallery.forget_embedder() (so switching back
costs nothing); faces registered while a run goes on get the new embedder's vector at registration, or from
this run if they were registered under the old one.

    reembed(gallery, new_sha256, embed)   # embed(FaceRegion) -> unit vector, from region.pixels()
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from app.faces.gallery import Gallery
from app.faces.regions import FaceRegion

BATCH_FACES = 32  # faces embedded before one commit: a kill loses at most this much work


@dataclass(frozen=True)
class Reembedding:
    """What a run did: the vectors it stored, and the people the embedder still lacks (none when complete)."""

    embedder: str
    stored: int
    missing: tuple[str, ...]


def reembed(gallery: Gallery, embedder: str, embed: Callable[[FaceRegion], np.ndarray], *,
            batch: int = BATCH_FACES, progress: Callable[[int], None] | None = None) -> Reembedding:
    """Give every face of the gallery a vector of `embedder` (its sha256) made by `embed` from the face's region,
    a batch per transaction. `progress(stored so far)` is called after each batch."""
    if batch < 1:
        raise ValueError(f"a batch holds at least one face; got {batch}")
    stored, after = 0, 0
    while faces := gallery.faces_without(embedder, batch, after):
        stored += gallery.add_vectors(embedder, {face.face_id: embed(face.region) for face in faces})
        after = faces[-1].face_id
        if progress is not None:
            progress(stored)
    return Reembedding(embedder, stored, gallery.coverage(embedder).missing)
