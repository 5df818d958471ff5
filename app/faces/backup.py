"""Backup and restore of the gallery, as DeepStack's admin API had them (/v1/backup hands out the database file,
/v1/restore takes one back): here a backup is one self-contained SQLite file, and a restore replaces the whole
gallery with one, atomically, after checking it.

- **Backup** uses SQLite's online backup API in one step: one read transaction, so the copy is the gallery as of
  one commit, while the other processes keep registering and searching. It is written to a temporary file beside
  the target (mode 0600: it holds faces), checked, switched to a rollback journal (one file, no -wal beside it),
  fsynced and renamed into place: a crash leaves the old backup or the new one, never half of one.
- **Restore** copies the file it is handed to a private temporary file first (the original is never opened by
  SQLite, so nothing is written into it), and checks the copy: an SQLite header, integrity_check, the gallery's
  application_id, schema version and exact schema (a file with an extra trigger or view is refused: it would run
  inside the service), foreign keys, and the contents (valid userids, embedder ids, vectors of their embedder's
  dimension, finite and unit length, face images that are JPEGs or PNGs). Then the backup API writes it over the
  live gallery in one write transaction: every process sees the old gallery or the new one, never a mix, and a
  SIGKILL at any moment leaves one of them. Every process's next search reads the restored vectors
  (data_version changes). The WAL is then truncated: what the restore replaced is erased like a delete.

A DeepStack backup (its faceembedding.db) is refused as foreign: it holds one averaged vector per person from
DeepStack's own model and no face images, so nothing could re-embed it for another model.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import sqlite3
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.faces import schema
from app.faces.database import connect
from app.faces.errors import BadBackup, CorruptBackup, ForeignBackup, GalleryBusy, GalleryError, \
    InvalidEmbedderId, InvalidUserId
from app.faces.gallery import Gallery
from app.faces.userids import check_userid
from app.faces.vectors import NORM_TOLERANCE, check_embedder_id

_IMAGE_MAGIC = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n")


@dataclass(frozen=True)
class BackupSummary:
    """What a backup file holds."""

    path: Path
    people: int
    faces: int
    vectors: int
    size: int  # bytes


def backup(gallery: Gallery, target: Path) -> BackupSummary:
    """Write the gallery, as of one commit, to `target` (replaced atomically if it exists)."""
    target = Path(target)
    if target.exists() and os.path.samefile(target, gallery.path):
        raise BadBackup(f"{target} is the gallery itself: a backup goes to another file")
    temporary = _private_file(target.parent, f".{target.name}")
    try:
        try:
            source = connect(gallery.path, gallery.busy_timeout_s)
            try:
                copy = sqlite3.connect(temporary, isolation_level=None)
                try:
                    source.backup(copy, progress=_deadline(gallery, "backup"))
                    copy.execute("PRAGMA journal_mode = DELETE").fetchall()
                    summary = _check(copy, target)
                finally:
                    copy.close()
            finally:
                source.close()
        except sqlite3.Error as error:
            raise GalleryError(f"backing up {gallery.path} to {target} failed: {error}") from error
        _fsync(temporary)
        os.replace(temporary, target)
        _fsync(target.parent)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return BackupSummary(target, summary.people, summary.faces, summary.vectors, target.stat().st_size)


def check_backup(source: Path) -> BackupSummary:
    """What the backup at `source` holds, if restore() would take it; CorruptBackup or ForeignBackup if not. The
    file is read from a private copy, never opened by SQLite itself."""
    source = Path(source)
    with _private_copy(source, Path(tempfile.gettempdir())) as copy:
        connection = sqlite3.connect(copy, isolation_level=None)
        try:
            return _check(connection, source)
        finally:
            connection.close()


def restore(gallery: Gallery, source: Path) -> BackupSummary:
    """Replace the whole gallery with the backup at `source`, in one transaction, after checking it (BadBackup
    and the gallery untouched if it is not one)."""
    source = Path(source)
    if source.exists() and os.path.samefile(source, gallery.path):
        raise BadBackup(f"{source} is the gallery itself, not a backup of it")
    with _private_copy(source, gallery.path.parent) as copy:
        connection = sqlite3.connect(copy, isolation_level=None)
        try:
            summary = _check(connection, source)
            try:
                live = connect(gallery.path, gallery.busy_timeout_s)
            except sqlite3.Error as error:
                raise GalleryError(f"opening {gallery.path} to restore into it failed: {error}") from error
            try:
                with _as_database_errors(source):
                    connection.execute("PRAGMA query_only = OFF")
                    _match_page_size(connection, live.execute("PRAGMA page_size").fetchone()[0])
                    connection.execute("PRAGMA journal_mode = WAL").fetchall()  # as the live file, which keeps it
                connection.backup(live, progress=_deadline(gallery, "restore"))  # one step, one write transaction
                live.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            except sqlite3.Error as error:
                raise GalleryError(f"restoring {source} into {gallery.path} failed, the gallery is as it was: "
                                   f"{error}") from error
            finally:
                live.close()
        finally:
            connection.close()
    return summary


def _deadline(gallery: Gallery, what: str):
    """A progress callback for sqlite3's backup, which retries a busy step for ever: GalleryBusy once the
    gallery's lock has been held by another connection for twice the busy timeout (each step waits one)."""
    deadline = time.monotonic() + 2 * gallery.busy_timeout_s

    def progress(status: int, remaining: int, total: int) -> None:
        if status in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED) and time.monotonic() > deadline:
            raise GalleryBusy(f"the {what} waited {2 * gallery.busy_timeout_s:g} s for another process's lock on "
                              f"{gallery.path}; the gallery is as it was")
    return progress


def _check(connection: sqlite3.Connection, source: Path) -> BackupSummary:
    """The checks the module docstring lists, on an open copy."""
    with _as_database_errors(source):
        for pragma in ("PRAGMA trusted_schema = OFF", "PRAGMA cell_size_check = ON", "PRAGMA query_only = ON"):
            connection.execute(pragma)
        problems = [row[0] for row in connection.execute("PRAGMA integrity_check(5)")]
        if problems != ["ok"]:
            raise CorruptBackup(f"{source} is a damaged SQLite database: {'; '.join(problems)}")
        problem = schema.mismatch(connection)
        if problem:
            deepstack = connection.execute("SELECT 1 FROM sqlite_master WHERE name = 'TB_EMBEDDINGS'").fetchone()
            hint = ("; it is DeepStack's face database, which holds one vector per person from DeepStack's own "
                    "model and no face images: register the people again here") if deepstack else ""
            raise ForeignBackup(f"{source} is not a face gallery backup of this service: {problem}{hint}")
        if connection.execute("PRAGMA foreign_key_check").fetchone() is not None:
            raise CorruptBackup(f"{source}: a face or vector refers to a person, face or embedder that is not there")
        _check_contents(connection, source)
        people, faces, vectors = connection.execute(
            "SELECT (SELECT count(*) FROM person), (SELECT count(*) FROM face), (SELECT count(*) FROM vector)"
        ).fetchone()
    return BackupSummary(source, people, faces, vectors, source.stat().st_size if source.exists() else 0)


def _check_contents(connection: sqlite3.Connection, source: Path) -> None:
    try:
        for (userid,) in connection.execute("SELECT userid FROM person"):
            check_userid(userid)
        for (sha256,) in connection.execute("SELECT sha256 FROM embedder"):
            if check_embedder_id(sha256) != sha256:
                raise InvalidEmbedderId(f"an embedder id in upper case: {sha256}")
    except (InvalidUserId, InvalidEmbedderId) as error:
        raise CorruptBackup(f"{source}: {error}") from None
    for embedder, dimension in connection.execute("SELECT id, dimension FROM embedder").fetchall():
        blobs = [row[0] for row in connection.execute("SELECT data FROM vector WHERE embedder = ?", (embedder,))]
        if any(not isinstance(blob, bytes) or len(blob) != 4 * dimension for blob in blobs):
            raise CorruptBackup(f"{source}: a vector's length is not its embedder's {dimension} float32 values")
        if blobs:
            vectors = np.frombuffer(b"".join(blobs), "<f4").reshape(len(blobs), dimension).astype(np.float64)
            norms = np.sqrt((vectors * vectors).sum(axis=1))
            if not np.isfinite(vectors).all() or (np.abs(norms - 1.0) > NORM_TOLERANCE).any():
                raise CorruptBackup(f"{source}: a vector is not finite and of unit length")
    bad = connection.execute(
        "SELECT id FROM face WHERE typeof(image) != 'blob' OR NOT (substr(image, 1, 3) = ? OR substr(image, 1, 8) = ?) "
        "OR width > 4096 OR height > 4096 OR NOT (box_right > box_left AND box_bottom > box_top) LIMIT 1",
        _IMAGE_MAGIC).fetchone()
    if bad is not None:
        raise CorruptBackup(f"{source}: face {bad[0]} is not a JPEG or PNG region with a box in it")


def _match_page_size(connection: sqlite3.Connection, page_size: int) -> None:
    """The copy rewritten at the live gallery's page size if it differs (the backup API cannot change the page
    size of a WAL database)."""
    if connection.execute("PRAGMA page_size").fetchone()[0] != page_size:
        connection.execute("PRAGMA journal_mode = DELETE").fetchall()
        connection.execute(f"PRAGMA page_size = {int(page_size)}")
        connection.execute("VACUUM")


@contextlib.contextmanager
def _as_database_errors(source: Path):
    try:
        yield
    except BadBackup:
        raise
    except sqlite3.DatabaseError as error:
        raise CorruptBackup(f"{source} is not a sound SQLite database: {error}") from None


@contextlib.contextmanager
def _private_copy(source: Path, directory: Path):
    """`source` copied to a private (0600) file in `directory`, removed afterwards with SQLite's side files;
    CorruptBackup at once if it does not begin as an SQLite database."""
    try:
        handle = source.open("rb")
    except (FileNotFoundError, IsADirectoryError):
        raise BadBackup(f"no backup file at {source}") from None
    with handle:
        head = handle.read(len(schema.SQLITE_MAGIC))
        if head != schema.SQLITE_MAGIC:
            raise CorruptBackup(f"{source} is not an SQLite database (it begins with {head[:16]!r})")
        copy = _private_file(directory, ".restore")
        try:
            handle.seek(0)
            with copy.open("wb") as out:
                shutil.copyfileobj(handle, out, 1 << 20)
            yield copy
        finally:
            for path in (copy, *(copy.with_name(copy.name + side) for side in ("-wal", "-shm", "-journal"))):
                path.unlink(missing_ok=True)


def _private_file(directory: Path, prefix: str) -> Path:
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = directory / f"{prefix}.{os.getpid()}.{secrets.token_hex(6)}.tmp"
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
    return path


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
