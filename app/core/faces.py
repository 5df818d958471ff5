"""The core's face commands, for every door (DeepStack's and CodeProject.AI's face routes, the native /v1/faces):
detect, register, recognize, list, delete, match, backup and restore. No web framework here.

    photo --the detector, through the core (Core.hold, Core.answer: its line, its image work, its task)-->
      faces in the photo's pixels, with 5 landmarks where the detector gives them
    --the photo decoded at full size, on a face thread (app/core/face_photos.py)-->
      recognize, match: each face aligned on its landmarks, else cropped around its box at the embedder's aspect
                        ratio enlarged by its face.crop_margin (app/faces/align.py face_input)
      register:         the largest face's region cut for the gallery (app/faces/regions.py), and the embedder's
                        input made from that region as stored (region_input), as a re-embedding will make it
    --the embedder, through the core (one held version for all the faces of a request: Core.tensors)-->
      unit vectors, tagged with the embedder file's sha256
    --the gallery, on a face thread (app/core/face_gallery.py)-->
      the nearest person, their similarity mapped to a confidence by the embedder's calibration (its threshold is 0.5)

The models are FACE_DETECTOR and FACE_EMBEDDER (app/core/face_models.py): while they are not both served, every
command raises FacesUnavailable (503) saying the fix. Errors are the domain's (app/faces/errors.py), with their
statuses.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from app.core.core import Core
from app.core.face_gallery import FaceGallery
from app.core.face_models import EmbedderFacts, FaceModels
from app.core.face_photos import (Face, Photo, embedder_tensor, full_photo, input_of_face, input_of_region, largest,
                                  region_of)
from app.core.inputs import ImageInput, TensorInput
from app.errors import RequestError, ServeError
from app.faces.backup import BackupSummary, backup, restore
from app.faces.errors import InvalidFace, NoFace
from app.faces.gallery import FACES_PER_PERSON_MAX
from app.faces.location import default_gallery_path
from app.faces.records import Deletion, NewFace, Person, Registration
from app.faces.regions import FaceRegion
from app.faces.userids import check_userid
from app.settings import Settings
from app.tasks.detect import TASK as DETECTION, DetectOptions
from app.tasks.embed import TASK as EMBEDDING

DEFAULT_MIN_CONFIDENCE = 0.5  # a recognition's cut without min_confidence: the embedder's threshold
UNKNOWN = "unknown"           # DeepStack's userid of a face that matches nobody
FACES_MAX = 32                # faces of one photo recognized (the largest first); a crowd is not a gallery's use
EMBED_BATCH = 8               # places taken at once in the embedder's line (all or none)
SETTLE_POLL_S = 0.5           # re-embedding at start asks this often whether the models have loaded


@dataclass(frozen=True)
class Recognized:
    """A face of the photo: who (UNKNOWN below the cut), the confidence, the raw similarity, where."""

    userid: str
    confidence: float
    similarity: float | None
    face: Face


@dataclass(frozen=True)
class Enrolment:
    """A registration: what the gallery did, and the photos with more than one face (their largest was taken)."""

    registration: Registration
    crowded: tuple[int, ...]  # 0-based indices of the photos


@dataclass(frozen=True)
class Comparison:
    similarity: float
    confidence: float | None  # None: the embedder has no calibration


class Faces:
    """The face commands of one process: its models (the settings against what is served), its gallery."""

    def __init__(self, settings: Settings, core: Core, reembeds: bool = True):
        self.core = core
        self.models = FaceModels(settings, core.models)
        self.configured = settings.face_detector is not None and settings.face_embedder is not None
        self.store = FaceGallery(settings.face_db or default_gallery_path(), settings.compute_nice)
        self.reembeds = reembeds  # the first worker of a group, or the only process, re-embeds at start

    # -- lifetime ------------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the gallery in this process (only where the face models are set: nothing else makes its file)."""
        if not self.configured:
            return
        await self.store.open()
        if self.reembeds:
            self.store.reembed_later(self._embedder_for_reembedding)

    async def stop(self) -> None:
        await self.store.close()

    def problem(self) -> str | None:
        """Why the face routes answer 503 now (the fix said); None when they serve."""
        return self.models.problem()

    # -- commands ------------------------------------------------------------------------------------------------

    async def detect(self, data: bytes, min_confidence: float | None = None) -> list[Face]:
        """The faces of the photo, best first (min_confidence: the detector's threshold, else the model's)."""
        return await self._faces(self.models.pair().detector, data, min_confidence)

    async def register(self, userid: str, photos: Sequence[bytes], replace: bool = True) -> Enrolment:
        """The largest face of each photo, registered for `userid` in one transaction (replace: their earlier faces
        go; else these are added). A photo without a face is NoFace, and nothing is registered."""
        pair = self.models.pair()
        userid = check_userid(userid)
        if not photos:
            raise RequestError("no image to register: send one or more (image, image1, ...)")
        if len(photos) > FACES_PER_PERSON_MAX:
            raise RequestError(f"{len(photos)} images; a person has at most {FACES_PER_PERSON_MAX} faces")
        regions, crowded = [], []
        for index, data in enumerate(photos):
            faces, photo = await self._faces_and_photo(pair.detector, data, index, len(photos))
            if len(faces) > 1:
                crowded.append(index)
            regions.append(await self.store.work(region_of, photo, largest(faces)))
        vectors, facts = await self._embed(pair.embedder, [_from_region(region) for region in regions])
        if not np.all(np.linalg.norm(vectors, axis=1) > 0):
            raise InvalidFace("the embedder gave the zero vector for a face: it cannot be told from anyone")
        new = [NewFace(region, vector) for region, vector in zip(regions, vectors)]
        registration = await self.store.on_gallery("register", userid, new, facts.sha256, replace=replace)
        return Enrolment(registration, tuple(crowded))

    async def recognize(self, data: bytes, min_confidence: float | None = None) -> list[Recognized]:
        """Each face of the photo (the FACES_MAX largest), the registered person nearest to it when their
        confidence is at least min_confidence (default 0.5: the embedder's threshold), else UNKNOWN."""
        pair = self.models.pair()
        faces = await self._faces(pair.detector, data, None)
        if not faces:
            return []
        faces = sorted(faces, key=lambda face: -face.area)[:FACES_MAX]
        photo = await self._photo(data)
        vectors, facts = await self._embed(pair.embedder, [_from_photo(photo, face) for face in faces])
        calibration = facts.calibrated()
        cut = DEFAULT_MIN_CONFIDENCE if min_confidence is None else min_confidence
        usable = np.linalg.norm(vectors, axis=1) > 0
        matches = iter(await self.store.on_gallery("search", facts.sha256, vectors[usable]) if usable.any() else ())
        answers = []
        for face, ok in zip(faces, usable):
            match = next(matches) if ok else None
            confidence = float(calibration.confidence(match.similarity)) if match is not None else 0.0
            if match is None or confidence < cut:
                answers.append(Recognized(UNKNOWN, 0.0, match.similarity if match else None, face))
            else:
                answers.append(Recognized(match.userid, confidence, match.similarity, face))
        return answers

    async def match(self, first: bytes, second: bytes) -> Comparison:
        """The similarity of the largest face of each photo, and its confidence where the embedder is calibrated."""
        pair = self.models.pair()
        makers = []
        for index, data in enumerate((first, second)):
            faces, photo = await self._faces_and_photo(pair.detector, data, index, 2)
            makers.append(_from_photo(photo, largest(faces)))
        vectors, facts = await self._embed(pair.embedder, makers)
        similarity = float(np.dot(vectors[0].astype(np.float64), vectors[1].astype(np.float64)))
        calibration = facts.calibration
        return Comparison(similarity, None if calibration is None else float(calibration.confidence(similarity)))

    async def people(self) -> list[Person]:
        self.models.pair()
        return await self.store.on_gallery("people")

    async def embedder_sha256(self) -> str:
        """The served embedder's id in the gallery (whose vectors the searches read)."""
        async with self.core.hold(EMBEDDING, self.models.pair().embedder) as ticket:
            return EmbedderFacts.of(ticket.model_dir).sha256

    async def delete(self, userid: str) -> Deletion:
        self.models.pair()
        return await self.store.on_gallery("delete", check_userid(userid))

    async def backup(self, target: Path) -> BackupSummary:
        self.models.pair()
        return await self.store.work(backup, self.store.gallery, target)

    async def restore(self, source: Path) -> BackupSummary:
        self.models.pair()
        return await self.store.work(restore, self.store.gallery, source)

    # -- the models, through the core ----------------------------------------------------------------------------

    async def _faces(self, detector: str, data: bytes, min_score: float | None) -> list[Face]:
        async with self.core.hold(DETECTION, detector) as ticket:
            answer = await self.core.answer(ticket, ImageInput(data), DetectOptions(min_score))
        return [Face.of(found) for found in answer.result.detections]

    async def _faces_and_photo(self, detector: str, data: bytes, index: int, count: int) -> tuple[list[Face], Photo]:
        faces = await self._faces(detector, data, None)
        if not faces:
            which = f"image {index + 1} of {count}" if count > 1 else "the image"
            raise NoFace(f"no face found in {which}: send a photo with a face at least about 1/7 of its shorter side "
                         "wide, facing the camera")
        return faces, await self._photo(data)

    async def _photo(self, data: bytes) -> Photo:
        images = self.core.images
        return await self.store.work(lambda: full_photo(data, images.max_pixels, **images.decode_options))

    async def _embed(self, embedder: str, makers: list[Callable[[EmbedderFacts], Image.Image]]
                     ) -> tuple[np.ndarray, EmbedderFacts]:
        """Each face's unit vector from one version of the embedder (a reload between batches is refused rather
        than mixing two models' vectors), with what that version says of itself."""
        vectors, facts = [], None
        for start in range(0, len(makers), EMBED_BATCH):
            async with self.core.hold(EMBEDDING, embedder) as ticket:
                these = EmbedderFacts.of(ticket.model_dir)
                if facts is not None and these.sha256 != facts.sha256:
                    raise ServeError(f"the face embedder {embedder!r} was reloaded with another file during this "
                                     "request; send it again")
                facts = these
                spec, quantizer = ticket.model_dir.manifest.input, self.core.images.quantizer(ticket)
                batch = makers[start:start + EMBED_BATCH]
                tensors = await self.store.work(
                    lambda: [embedder_tensor(make(these), spec, quantizer) for make in batch])
                answers = await self.core.tensors(ticket, [TensorInput(tensor) for tensor in tensors])
            vectors += [answer.values["embedding"] for answer in answers]
        return np.stack(vectors).astype(np.float32), facts

    async def _embedder_for_reembedding(self):
        """For the gallery's re-embedding at start: the served embedder's sha256, and how one region is embedded."""
        while not await self.core.settled(0):  # polled: a thread blocked in the wait would hold up the stop
            await asyncio.sleep(SETTLE_POLL_S)
        pair = self.models.pair()

        async def embed(region: FaceRegion) -> np.ndarray:
            vectors, _ = await self._embed(pair.embedder, [_from_region(region)])
            return vectors[0]

        return await self.embedder_sha256(), embed


def _from_region(region: FaceRegion) -> Callable[[EmbedderFacts], Image.Image]:
    return lambda facts: input_of_region(region, facts.size, facts.margin)


def _from_photo(photo: Photo, face: Face) -> Callable[[EmbedderFacts], Image.Image]:
    return lambda facts: input_of_face(photo, face, facts.size, facts.margin)
