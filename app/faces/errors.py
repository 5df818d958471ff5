"""What can go wrong with the face gallery, as typed errors that carry their HTTP status (app/errors.py's rule).

No web import: the face routes map these through the same tables as every other ServeError. A message says what
was got and what was expected, so that a client (or the operator reading a 500) can fix it without the code.
"""

from __future__ import annotations

from app.errors import Busy, ServeError


class GalleryError(ServeError):
    """Base of every gallery error; as itself, a fault of the gallery's file or its host (500)."""

    status = 500


class GalleryInputError(GalleryError):
    """Something the caller handed the gallery is wrong (400)."""

    status = 400


class InvalidUserId(GalleryInputError):
    """A userid that is empty, too long, not one line of text, or reserved (app/faces/userids.py)."""


class UnknownUser(GalleryError):
    """No person of that userid is registered."""

    status = 404


class InvalidEmbedderId(GalleryInputError):
    """An embedder is named by its model file's sha256: 64 hexadecimal digits."""


class InvalidVector(GalleryInputError):
    """An embedding that is not a finite, L2-normalized float vector of a plausible dimension."""


class DimensionMismatch(InvalidVector):
    """A vector whose dimension differs from the one the gallery holds for the same embedder: two models would
    be mixed under one sha256, so it is refused (409: it conflicts with what is stored)."""

    status = 409


class InvalidFace(GalleryInputError):
    """A face region that does not hold together: an image that is not a JPEG or PNG of the stated size, a
    box or landmarks outside it, no face at all."""


class TooManyFaces(InvalidFace):
    """A person would hold more faces than FACES_PER_PERSON_MAX."""

    status = 409


class UnknownEmbedder(GalleryError):
    """No vector of that embedder is stored."""

    status = 404


class GalleryBusy(Busy, GalleryError):
    """Another process held the gallery's write lock for longer than the busy timeout: a refusal to retry (503
    with Retry-After, as every Busy)."""

    def __init__(self, message: str, retry_after_s: float = 1.0):
        super().__init__(message, retry_after_s)


class ForeignDatabase(GalleryError):
    """The gallery's path holds a file that is not a gallery of this service (another application's database,
    not SQLite at all, or a gallery written by a newer version). It is left untouched."""


class GalleryMoved(GalleryError):
    """A gallery opened in one process and used in another (after a fork): SQLite's connections must not cross
    a fork. Open the gallery in the worker, after the fork."""


class BadBackup(GalleryInputError):
    """A file handed to restore that cannot replace the gallery; the gallery is left as it was."""


class CorruptBackup(BadBackup):
    """Not an SQLite database, a damaged one, or a gallery whose contents do not hold together."""


class ForeignBackup(BadBackup):
    """A sound SQLite database that is not a gallery of this service (another application's, DeepStack's own,
    a newer schema, or one with tables, triggers or views this service does not make)."""


class FacesUnavailable(ServeError):
    """The face routes cannot answer as the service is set up: no face detector or embedder is set, or the one
    set names no served model of its task, or the embedder has no calibration. The message says the fix (503: the
    service is up, its face part is not)."""

    status = 503


class NoFace(InvalidFace):
    """A photo in which the detector found no face (a registration needs one in each photo)."""
