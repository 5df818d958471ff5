"""The face gallery: who is registered, the region around each of their faces, and each embedder's vectors of
them, in one SQLite file the service's processes share (docs/faces.md).

    from app.faces import Gallery, NewFace, cut_region
    with Gallery(path) as gallery:
        region = cut_region(photo, box, landmarks)          # the photo decoded at full size
        vector = embed(region.pixels(), region.box)           # the face task's: unit length
        gallery.register("ann", [NewFace(region, vector)], embedder_sha256)
        gallery.search(embedder_sha256, query_vectors)        # -> [Match(userid, similarity) or None]

    face_input(photo, box, landmarks, (96, 112), margin)      # the embedder's input: aligned, or cropped
    Calibration.from_json(model_json_face).confidence(similarity)   # what a client sees; 0.5 at the threshold

No web framework here: errors are typed (app/faces/errors.py) and carry their HTTP status.
"""

from app.faces.align import DEFAULT_MARGIN, aligned, cropped, face_input, region_input
from app.faces.backup import BackupSummary, backup, check_backup, restore
from app.faces.confidence import Calibration, CalibrationError, ThresholdReport, calibrate, pair_similarities
from app.faces.errors import (BadBackup, CorruptBackup, DimensionMismatch, ForeignBackup, ForeignDatabase,
                              GalleryBusy, GalleryError, GalleryInputError, GalleryMoved, InvalidEmbedderId,
                              InvalidFace, InvalidUserId, InvalidVector, TooManyFaces, UnknownEmbedder, UnknownUser)
from app.faces.gallery import FACES_PER_PERSON_MAX, Gallery
from app.faces.location import default_data_dir, default_gallery_path
from app.faces.matrix import Matrix
from app.faces.records import (Coverage, Deletion, EmbedderVectors, Match, NewFace, Person, Registration,
                               StoredFace)
from app.faces.reembed import Reembedding, reembed
from app.faces.regions import FaceRegion, cut_region
from app.faces.userids import check_userid

__all__ = [
    "DEFAULT_MARGIN", "BackupSummary", "BadBackup", "Calibration", "CalibrationError", "ThresholdReport",
    "aligned", "calibrate", "cropped", "face_input", "pair_similarities", "region_input", "CorruptBackup", "Coverage", "Deletion", "DimensionMismatch", "EmbedderVectors",
    "FACES_PER_PERSON_MAX", "FaceRegion", "ForeignBackup", "ForeignDatabase", "Gallery", "GalleryBusy",
    "GalleryError", "GalleryInputError", "GalleryMoved", "InvalidEmbedderId", "InvalidFace", "InvalidUserId",
    "InvalidVector", "Match", "Matrix", "NewFace", "Person", "Reembedding", "Registration", "StoredFace",
    "TooManyFaces", "UnknownEmbedder", "UnknownUser", "backup", "check_backup", "check_userid", "cut_region",
    "default_data_dir", "default_gallery_path", "reembed", "restore",
]
