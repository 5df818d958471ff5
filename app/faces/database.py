"""One SQLite connection to the gallery's file: opened (and the schema made) safely, used in transactions, and
how this process learns that another one changed the file.

- **WAL**: readers never wait for a writer, and a writer appends to the -wal file, so a SIGKILL at any moment
  leaves either the last commit or the one before it (SQLite's own guarantee; tests/test_face_gallery_kill.py
  kills registrations, deletions, re-embeddings and restores at random moments).
- **Writes are BEGIN IMMEDIATE**: the write lock is taken first, so two processes registering at once queue on
  the busy timeout instead of failing on a lock upgrade; past it, GalleryBusy (a 503 to retry).
- **Changes seen by every process**: PRAGMA data_version changes whenever another connection, in this process
  or another, committed. It reads the WAL index in shared memory, a few microseconds, so it is asked before every
  search (app/faces/gallery.py keeps its matrices until it changes).
- **Erasure**: after a transaction that deleted faces, wal_checkpoint(TRUNCATE) copies the zeroed pages into the
  database file and empties the -wal file, which otherwise keeps the deleted rows' old pages until they are
  overwritten (secure_delete zeroes the database's pages, not the WAL's history).
- **Files are 0600 in a 0700 directory**: they hold faces. SQLite gives the -wal and -shm files the database
  file's mode.
- **One process**: a connection must not cross a fork; a Database used in a process other than the one that
  opened it raises GalleryMoved instead of corrupting the file.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from app.faces import schema
from app.faces.errors import ForeignDatabase, GalleryBusy, GalleryError, GalleryMoved

BUSY_TIMEOUT_S = 10.0  # how long a write waits for another process's write (a registration takes milliseconds)


class Database:
    """A connection to the gallery at `path`, made (with the schema) if the file is new or empty. Thread-safe:
    one transaction at a time."""

    def __init__(self, path: Path, busy_timeout_s: float = BUSY_TIMEOUT_S, *, query_only: bool = False):
        self.path = Path(path)
        self.busy_timeout_s = busy_timeout_s
        self._lock = threading.RLock()
        self._pid = os.getpid()
        _prepare_file(self.path)
        with _opening_errors(self.path):
            self._connection = connect(self.path, busy_timeout_s)
        try:
            with _opening_errors(self.path):
                self._adopt()
            if query_only:  # a reading connection that cannot write, even by mistake
                self._connection.execute("PRAGMA query_only = ON")
        except BaseException:
            self._connection.close()
            raise

    def _adopt(self) -> None:
        """Make the schema in an empty file; check that any other file is a gallery, touching nothing if not."""
        connection = self._connection
        with _mapped_errors():
            if schema.is_empty(connection):
                connection.execute("PRAGMA auto_vacuum = INCREMENTAL")  # before anything writes the first page
                connection.execute("PRAGMA journal_mode = WAL").fetchall()
                connection.execute("BEGIN IMMEDIATE")
                try:
                    if schema.is_empty(connection):  # another process may have made it meanwhile
                        schema.create(connection)
                    connection.execute("COMMIT")
                except BaseException:
                    connection.execute("ROLLBACK")
                    raise
            problem = schema.mismatch(connection)
            if problem:
                raise ForeignDatabase(f"{self.path} is not a face gallery of this service: {problem}; "
                                      "it is left untouched (set FACE_DB to another path)")
            mode = connection.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode != "wal":
                raise GalleryError(f"{self.path}: SQLite could not put the gallery in WAL mode (got {mode!r}); "
                                   "WAL needs a local file system with shared memory, not NFS or SMB")

    @contextmanager
    def transaction(self, write: bool = False) -> Iterator[sqlite3.Connection]:
        """The connection inside one transaction: committed when the block ends, rolled back if it raises.
        A write takes the database's write lock first (BEGIN IMMEDIATE)."""
        connection = self._connection
        with self._lock:
            self._check_process()
            with _mapped_errors():
                connection.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                try:
                    yield connection
                    connection.execute("COMMIT")
                finally:
                    if connection.in_transaction:  # the block raised, or the commit failed
                        connection.execute("ROLLBACK")

    def data_version(self) -> int:
        """A number that changes when another connection (of any process) commits to the gallery."""
        with self._lock:
            self._check_process()
            return self._connection.execute("PRAGMA data_version").fetchone()[0]

    def truncate_wal(self) -> bool:
        """Checkpoint the WAL into the database file and empty it; True when done, False when another connection
        kept it past the busy timeout (a reader on an older snapshot, or a writer): its pages then stay until the
        next call. Never raises for that: it runs after a commit, which stands."""
        with self._lock:
            self._check_process()
            try:
                busy, _, _ = self._connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            except sqlite3.OperationalError as error:
                if "locked" in str(error) or "busy" in str(error):
                    return False
                raise GalleryError(f"the face gallery's checkpoint failed: {error}") from error
        return busy == 0

    def close(self) -> None:
        with self._lock:
            if os.getpid() == self._pid:
                self._connection.close()

    def _check_process(self) -> None:
        if os.getpid() != self._pid:
            raise GalleryMoved(f"the face gallery {self.path} was opened in process {self._pid} and used in "
                               f"{os.getpid()}: open it in each worker, after the fork")


def connect(path: Path, busy_timeout_s: float) -> sqlite3.Connection:
    """A connection with the gallery's settings (schema.CONNECTION_PRAGMAS), in autocommit mode: transactions are
    the caller's explicit BEGIN and COMMIT."""
    connection = sqlite3.connect(path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False)
    try:
        for pragma in schema.CONNECTION_PRAGMAS:
            connection.execute(pragma)
    except BaseException:
        connection.close()
        raise
    return connection


def _prepare_file(path: Path) -> None:
    """The gallery's directory (0700) and file (0600) made if missing. An existing file is never opened here:
    closing any descriptor of a database file drops every POSIX lock this process holds on it, those of its
    open SQLite connections included, and another process would then take the WAL for its own and delete it."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
        except FileExistsError:
            pass
    except OSError as error:
        raise GalleryError(f"cannot make the face gallery at {path}: {error}") from error


@contextmanager
def _opening_errors(path: Path) -> Iterator[None]:
    """While opening: a file SQLite cannot read as a database is ForeignDatabase (SQLite wrote nothing to it)."""
    try:
        yield
    except (sqlite3.DatabaseError, GalleryError) as error:
        cause = error if isinstance(error, sqlite3.DatabaseError) else error.__cause__
        if isinstance(cause, sqlite3.DatabaseError) and "not a database" in str(cause):
            raise ForeignDatabase(f"{path} is not an SQLite database ({cause}); it is left untouched "
                                  "(set FACE_DB to another path)") from None
        if isinstance(error, GalleryError):
            raise
        raise GalleryError(f"opening the face gallery {path} failed: {error}") from error


@contextmanager
def _mapped_errors() -> Iterator[None]:
    """SQLite's errors as the gallery's: a lock held too long is GalleryBusy, anything else a GalleryError."""
    try:
        yield
    except sqlite3.OperationalError as error:
        if "locked" in str(error) or "busy" in str(error):
            raise GalleryBusy(f"the face gallery is busy with another process's write: {error}") from error
        raise GalleryError(f"the face gallery's database failed: {error}") from error
    except sqlite3.DatabaseError as error:
        raise GalleryError(f"the face gallery's database failed: {error}") from error
