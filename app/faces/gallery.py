"""The face gallery: people, the regions around their faces, and their embeddings, in one SQLite file that the
service's processes share (app/faces/database.py), with each embedder's vectors kept in memory for the search
(app/faces/matrix.py) and read again only when the file changed.

Each process opens its own Gallery (after any fork) on the same path. A Gallery has two connections: writes go
through one, searches and reads through the other, so a search never waits for a registration's fsync, and the
reading connection's data_version says when any writer (this process's included) committed.

Vectors are tagged with their embedder's sha256, and a search names the embedder it asks with: it sees that
embedder's vectors only, never another model's. When the embedder changes, app/faces/reembed.py makes the new
one's vectors from the stored regions; until then coverage() names the people the new one cannot recognize.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np

from app.faces.database import BUSY_TIMEOUT_S, Database
from app.faces.errors import DimensionMismatch, InvalidFace, TooManyFaces, UnknownEmbedder, UnknownUser
from app.faces.location import default_gallery_path
from app.faces.matrix import Matrix
from app.faces.records import (Coverage, Deletion, EmbedderVectors, Match, NewFace, Person, Registration,
                               StoredFace)
from app.faces.regions import FaceRegion, check_region
from app.faces.userids import check_userid
from app.faces.vectors import check_embedder_id, check_vector

FACES_PER_PERSON_MAX = 100  # bounds a person's rows, and with them the depth of a k-nearest search

_FACE_COLUMNS = ("face.id, person.userid, face.image, face.width, face.height, face.box_left, face.box_top, "
                 "face.box_right, face.box_bottom, face.landmarks")


class Gallery:
    """The gallery at `path` (default: default_gallery_path()), made if missing. Thread-safe."""

    def __init__(self, path: Path | None = None, *, busy_timeout_s: float = BUSY_TIMEOUT_S):
        self.path = Path(path) if path is not None else default_gallery_path()
        self.busy_timeout_s = busy_timeout_s
        self._writer = Database(self.path, busy_timeout_s)
        try:
            self._reader = Database(self.path, busy_timeout_s, query_only=True)
        except BaseException:
            self._writer.close()
            raise
        self._matrix_lock = threading.Lock()
        self._matrices: dict[str, Matrix] = {}
        self._matrices_version: int | None = None

    def __enter__(self) -> Gallery:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._reader.close()
        self._writer.close()

    def register(self, userid: str, faces: Iterable[NewFace], embedder: str, *, replace: bool = True) -> Registration:
        """Register `faces` (at least one) for `userid` in one transaction, their vectors tagged with `embedder`
        (its model file's sha256). replace=True: the person's earlier faces are deleted, and erased. replace=False:
        the faces are added to theirs, but for a face they have already (its region's bytes and its vector the same:
        a client training the same photo again), which is not added twice."""
        userid, embedder = check_userid(userid), check_embedder_id(embedder)
        faces = list(faces)
        if not faces:
            raise InvalidFace("no face to register: a registration holds at least one")
        if len(faces) > FACES_PER_PERSON_MAX:
            raise TooManyFaces(f"{len(faces)} faces in one registration; a person has at most {FACES_PER_PERSON_MAX}")
        checked = [_check_new_face(face) for face in faces]
        dimensions = sorted({len(vector) for _, vector in checked})
        if len(dimensions) > 1:
            raise DimensionMismatch(f"one registration's vectors have {dimensions} values: one embedder makes one")
        now = time.time()
        with self._writer.transaction(write=True) as db:
            embedder_id = _embedder_row(db, embedder, dimensions[0])
            row = db.execute("SELECT id FROM person WHERE userid = ?", (userid,)).fetchone()
            replaced = 0
            if row is None:
                person = db.execute("INSERT INTO person (userid, created) VALUES (?, ?)", (userid, now)).lastrowid
            else:
                person = row[0]
                if replace:
                    replaced = db.execute("DELETE FROM face WHERE person = ?", (person,)).rowcount
            kept = db.execute("SELECT count(*) FROM face WHERE person = ?", (person,)).fetchone()[0]
            given = len(checked)
            checked = _not_held(db, person, embedder_id, checked)
            if kept + len(checked) > FACES_PER_PERSON_MAX:
                raise TooManyFaces(f"{userid!r} has {kept} faces; {len(checked)} more would pass the "
                                   f"{FACES_PER_PERSON_MAX} a person may have")
            for region, vector in checked:
                face = db.execute(
                    "INSERT INTO face (person, image, width, height, box_left, box_top, box_right, box_bottom, "
                    "landmarks, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (person, region.image, region.width, region.height, *region.box,
                     _landmarks_blob(region.landmarks), now)).lastrowid
                db.execute("INSERT INTO vector (embedder, face, data) VALUES (?, ?, ?)",
                           (embedder_id, face, vector.astype("<f4").tobytes()))
            if replaced:
                db.execute("PRAGMA incremental_vacuum").fetchall()
        erased = self._writer.truncate_wal() if replaced else True
        return Registration(userid, row is None, len(checked), replaced, kept + len(checked), erased,
                            given - len(checked))

    def delete(self, userid: str) -> Deletion:
        """Delete the person, their faces and vectors, in one transaction; then erase their bytes from the files."""
        userid = check_userid(userid)
        with self._writer.transaction(write=True) as db:
            row = db.execute("SELECT person.id, count(face.id) FROM person LEFT JOIN face ON face.person = person.id "
                             "WHERE person.userid = ? GROUP BY person.id", (userid,)).fetchone()
            if row is None:
                raise UnknownUser(f"no person {userid!r} is registered")
            db.execute("DELETE FROM person WHERE id = ?", (row[0],))
            db.execute("PRAGMA incremental_vacuum").fetchall()
        return Deletion(userid, row[1], self._writer.truncate_wal())

    def erase_freed(self) -> bool:
        """Erase what deleted rows left in the WAL (Deletion.erased False); True when nothing is left."""
        return self._writer.truncate_wal()

    def userids(self) -> list[str]:
        """Every registered userid, in the order they were first registered."""
        with self._reader.transaction() as db:
            return [row[0] for row in db.execute("SELECT userid FROM person ORDER BY id")]

    def people(self) -> list[Person]:
        """Every registered person, with their faces and the vectors each embedder has of them."""
        with self._reader.transaction() as db:
            found = db.execute("SELECT person.id, userid, person.created, count(face.id) FROM person LEFT JOIN face "
                               "ON face.person = person.id GROUP BY person.id ORDER BY person.id").fetchall()
            embedded: dict[int, dict[str, int]] = {}
            for person, sha256, count in db.execute(
                    "SELECT face.person, embedder.sha256, count(*) FROM vector JOIN face ON face.id = vector.face "
                    "JOIN embedder ON embedder.id = vector.embedder GROUP BY face.person, embedder.id"):
                embedded.setdefault(person, {})[sha256] = count
        return [Person(userid, faces, created, embedded.get(person, {})) for person, userid, created, faces in found]

    def faces(self, userid: str) -> list[StoredFace]:
        """The person's registered faces, oldest first."""
        userid = check_userid(userid)
        with self._reader.transaction() as db:
            rows = db.execute(f"SELECT {_FACE_COLUMNS} FROM face JOIN person ON person.id = face.person "
                              "WHERE person.userid = ? ORDER BY face.id", (userid,)).fetchall()
        if not rows:
            raise UnknownUser(f"no person {userid!r} is registered")
        return [_stored_face(row) for row in rows]

    def faces_without(self, embedder: str, limit: int, after: int = 0) -> list[StoredFace]:
        """Up to `limit` faces, by id after `after`, that `embedder` has no vector for: re-embedding's work list."""
        embedder = check_embedder_id(embedder)
        with self._reader.transaction() as db:
            rows = db.execute(
                f"SELECT {_FACE_COLUMNS} FROM face JOIN person ON person.id = face.person WHERE face.id > ? AND "
                "NOT EXISTS (SELECT 1 FROM vector JOIN embedder ON embedder.id = vector.embedder "
                "WHERE vector.face = face.id AND embedder.sha256 = ?) ORDER BY face.id LIMIT ?",
                (after, embedder, limit)).fetchall()
        return [_stored_face(row) for row in rows]

    def add_vectors(self, embedder: str, vectors: Mapping[int, np.ndarray]) -> int:
        """Store `embedder`'s vector of each face (by id) in one transaction; a face deleted meanwhile, or that
        already has this embedder's vector, is skipped. Returns how many were stored."""
        embedder = check_embedder_id(embedder)
        checked = {int(face): check_vector(vector) for face, vector in vectors.items()}
        if not checked:
            return 0
        dimensions = sorted({len(vector) for vector in checked.values()})
        if len(dimensions) > 1:
            raise DimensionMismatch(f"vectors of {dimensions} values for one embedder")
        stored = 0
        with self._writer.transaction(write=True) as db:
            embedder_id = _embedder_row(db, embedder, dimensions[0])
            for face, vector in checked.items():
                stored += db.execute("INSERT INTO vector (embedder, face, data) SELECT ?, id, ? FROM face WHERE id = ? "
                                     "ON CONFLICT (embedder, face) DO NOTHING",
                                     (embedder_id, vector.astype("<f4").tobytes(), face)).rowcount
        return stored

    def coverage(self, embedder: str) -> Coverage:
        """How much of the gallery `embedder` can recognize, and who needs re-embedding for it."""
        embedder = check_embedder_id(embedder)
        with self._reader.transaction() as db:
            people, faces = db.execute("SELECT (SELECT count(*) FROM person), (SELECT count(*) FROM face)").fetchone()
            embedded = db.execute("SELECT count(*) FROM vector JOIN embedder ON embedder.id = vector.embedder "
                                  "WHERE embedder.sha256 = ?", (embedder,)).fetchone()[0]
            missing = tuple(row[0] for row in db.execute(
                "SELECT userid FROM person WHERE EXISTS (SELECT 1 FROM face WHERE face.person = person.id AND "
                "NOT EXISTS (SELECT 1 FROM vector JOIN embedder ON embedder.id = vector.embedder "
                "WHERE vector.face = face.id AND embedder.sha256 = ?)) ORDER BY person.id", (embedder,)))
        return Coverage(embedder, people, faces, embedded, missing)

    def embedders(self) -> list[EmbedderVectors]:
        """Every embedder the gallery holds vectors of (or held, until forget_embedder)."""
        with self._reader.transaction() as db:
            rows = db.execute("SELECT sha256, dimension, count(vector.id) FROM embedder LEFT JOIN vector "
                              "ON vector.embedder = embedder.id GROUP BY embedder.id ORDER BY embedder.id").fetchall()
        return [EmbedderVectors(*row) for row in rows]

    def forget_embedder(self, embedder: str) -> int:
        """Delete every vector of `embedder` (a model no longer served), and erase them; returns how many."""
        embedder = check_embedder_id(embedder)
        with self._writer.transaction(write=True) as db:
            row = db.execute("SELECT embedder.id, count(vector.id) FROM embedder LEFT JOIN vector ON "
                             "vector.embedder = embedder.id WHERE sha256 = ? GROUP BY embedder.id",
                             (embedder,)).fetchone()
            if row is None:
                raise UnknownEmbedder(f"the gallery holds no vector of the embedder {embedder}")
            db.execute("DELETE FROM embedder WHERE id = ?", (row[0],))
            db.execute("PRAGMA incremental_vacuum").fetchall()
        self._writer.truncate_wal()
        return row[1]

    def matrix(self, embedder: str) -> Matrix:
        """`embedder`'s vectors as a Matrix, as the database holds them now: read again only when a connection
        committed since the last read (PRAGMA data_version, a few microseconds to ask)."""
        embedder = check_embedder_id(embedder)
        version = self._reader.data_version()
        with self._matrix_lock:
            if version != self._matrices_version:
                self._matrices, self._matrices_version = {}, version
            matrix = self._matrices.get(embedder)
            if matrix is None:
                matrix = self._matrices[embedder] = self._load_matrix(embedder)
        return matrix

    def search(self, embedder: str, queries: np.ndarray) -> list[Match | None]:
        """The nearest registered person to each query face ((D,) or (F, D) unit vectors from `embedder`), among
        the vectors of that embedder only; None for a face when it has none."""
        return self.matrix(embedder).best(queries)

    def _load_matrix(self, embedder: str) -> Matrix:
        with self._reader.transaction() as db:
            row = db.execute("SELECT id, dimension FROM embedder WHERE sha256 = ?", (embedder,)).fetchone()
            if row is None:
                return Matrix.from_rows(embedder, None, ())
            rows = db.execute("SELECT person.id, person.userid, vector.data FROM vector JOIN face ON "
                              "face.id = vector.face JOIN person ON person.id = face.person WHERE vector.embedder = ?",
                              (row[0],))
            return Matrix.from_rows(embedder, row[1], rows)


def _check_new_face(face: object) -> tuple[FaceRegion, np.ndarray]:
    if not isinstance(face, NewFace):
        raise InvalidFace(f"a face to register is a NewFace (region and vector); got {type(face).__name__}")
    return check_region(face.region), check_vector(face.vector)


def _embedder_row(db, embedder: str, dimension: int) -> int:
    """The embedder's row id, made with `dimension` if new; DimensionMismatch if it holds another."""
    row = db.execute("SELECT id, dimension FROM embedder WHERE sha256 = ?", (embedder,)).fetchone()
    if row is None:
        return db.execute("INSERT INTO embedder (sha256, dimension) VALUES (?, ?)", (embedder, dimension)).lastrowid
    if row[1] != dimension:
        raise DimensionMismatch(f"the embedder {embedder[:12]}... has vectors of {row[1]} values in the gallery; "
                                f"got {dimension}: two models under one sha256?")
    return row[0]


def _landmarks_blob(landmarks: tuple[tuple[float, float], ...]) -> bytes | None:
    return np.asarray(landmarks, "<f4").tobytes() if landmarks else None


def _stored_face(row: tuple) -> StoredFace:
    face, userid, image, width, height, left, top, right, bottom, landmarks = row
    points = np.frombuffer(landmarks, "<f4").reshape(-1, 2).tolist() if landmarks else ()
    return StoredFace(face, userid, FaceRegion(image, width, height, (left, top, right, bottom),
                                               tuple((x, y) for x, y in points)))


def _not_held(db, person: int, embedder: int, checked: list) -> list:
    """The faces of a registration the person does not hold already, each once: a face held is the same region's
    bytes with the same vector of this embedder (the same photo embedded again), not merely the same region."""
    held = {(bytes(image), bytes(data)) for image, data in db.execute(
        "SELECT face.image, vector.data FROM face JOIN vector ON vector.face = face.id "
        "WHERE face.person = ? AND vector.embedder = ?", (person, embedder))}
    fresh = []
    for region, vector in checked:
        key = (region.image, vector.astype("<f4").tobytes())
        if key not in held:
            held.add(key)
            fresh.append((region, vector))
    return fresh
