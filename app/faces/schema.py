"""The gallery's SQLite schema, and the checks that a database file is one of ours.

A file is a gallery when its header's application_id is APPLICATION_ID and its user_version is SCHEMA_VERSION,
and its tables, indexes and triggers are exactly those SCHEMA makes (nothing more: a trigger or a view in a file
handed to restore would run inside the service). Later versions raise SCHEMA_VERSION and migrate from the
older ones here.

Rows (AUTOINCREMENT: an id is never reused, so a vector computed for face 17 can never land on another face
that took its id while a re-embedding ran):
- person: one per userid (case-sensitive, app/faces/userids.py);
- face: the region around one registered face (app/faces/regions.py): the encoded image, its size, the face's
  box and landmarks (float32 x, y pairs) in its pixels;
- embedder: one per embedding model, by its file's sha256, with the dimension of its vectors;
- vector: one float32 vector per face and embedder. Deleting a person deletes its faces and their vectors.
"""

from __future__ import annotations

import sqlite3

APPLICATION_ID = 0x65744647  # "etFG": edgetpu-serve's face gallery, in the header's application_id field
SCHEMA_VERSION = 1
SQLITE_MAGIC = b"SQLite format 3\x00"

SCHEMA = (
    """CREATE TABLE person (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    userid TEXT NOT NULL UNIQUE CHECK (typeof(userid) = 'text' AND length(userid) BETWEEN 1 AND 128),
    created REAL NOT NULL
)""",
    """CREATE TABLE face (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    person INTEGER NOT NULL REFERENCES person(id) ON DELETE CASCADE,
    image BLOB NOT NULL CHECK (typeof(image) = 'blob'),
    width INTEGER NOT NULL CHECK (width > 0),
    height INTEGER NOT NULL CHECK (height > 0),
    box_left REAL NOT NULL,
    box_top REAL NOT NULL,
    box_right REAL NOT NULL,
    box_bottom REAL NOT NULL,
    landmarks BLOB CHECK (landmarks IS NULL OR length(landmarks) % 8 = 0),
    created REAL NOT NULL
)""",
    "CREATE INDEX face_by_person ON face(person)",
    """CREATE TABLE embedder (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    sha256 TEXT NOT NULL UNIQUE CHECK (length(sha256) = 64),
    dimension INTEGER NOT NULL CHECK (dimension > 0)
)""",
    """CREATE TABLE vector (
    id INTEGER PRIMARY KEY,
    embedder INTEGER NOT NULL REFERENCES embedder(id) ON DELETE CASCADE,
    face INTEGER NOT NULL REFERENCES face(id) ON DELETE CASCADE,
    data BLOB NOT NULL CHECK (typeof(data) = 'blob'),
    UNIQUE (embedder, face)
)""",
    "CREATE INDEX vector_by_face ON vector(face)",
)

# Every connection's settings. secure_delete: deleted rows are overwritten with zeros (with the WAL truncated
# after a delete, app/faces/database.py, a deleted face leaves no byte in any file). synchronous FULL: a commit is
# on disk when register() returns, power cut included (WAL with NORMAL survives a killed process, not a power
# cut; a registration is rare, so the fsync is cheap). trusted_schema OFF and cell_size_check ON: a damaged or
# hostile file is refused rather than believed.
CONNECTION_PRAGMAS = (
    "PRAGMA foreign_keys = ON",
    "PRAGMA secure_delete = ON",
    "PRAGMA synchronous = FULL",
    "PRAGMA trusted_schema = OFF",
    "PRAGMA cell_size_check = ON",
)


def create(connection: sqlite3.Connection) -> None:
    """Make the schema in an empty database, inside the caller's write transaction (auto_vacuum is set first,
    outside it: freed pages are then given back to the file system by incremental_vacuum after a delete)."""
    for statement in SCHEMA:
        connection.execute(statement)
    connection.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def expected_objects() -> list[tuple]:
    """(type, name, tbl_name, sql) of every object SCHEMA makes, as sqlite_master lists them."""
    memory = sqlite3.connect(":memory:")
    try:
        create(memory)
        return _objects(memory)
    finally:
        memory.close()


def mismatch(connection: sqlite3.Connection) -> str | None:
    """Why the database behind `connection` is not a gallery of this schema, or None when it is one."""
    application_id = connection.execute("PRAGMA application_id").fetchone()[0]
    if application_id != APPLICATION_ID:
        tables = [row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return (f"its application_id is {application_id:#x}, not the gallery's {APPLICATION_ID:#x} "
                f"(tables: {', '.join(tables[:8]) or 'none'})")
    version = connection.execute("PRAGMA user_version").fetchone()[0]
    if version != SCHEMA_VERSION:
        newer = "a newer" if version > SCHEMA_VERSION else "an older"
        return f"it is a gallery of schema {version}, written by {newer} edgetpu-serve; this one reads schema " \
               f"{SCHEMA_VERSION}"
    found, expected = _objects(connection), expected_objects()
    if found != expected:
        extra = sorted({row[:2] for row in found} - {row[:2] for row in expected})
        missing = sorted({row[:2] for row in expected} - {row[:2] for row in found})
        changed = sorted({row[:2] for row in found} & {row[:2] for row in expected}
                         - {row[:2] for row in set(found) & set(expected)})
        return f"its schema is not the gallery's (extra: {extra}, missing: {missing}, changed: {changed})"
    return None


def is_empty(connection: sqlite3.Connection) -> bool:
    """A database with no object in it and no application_id: a file just made, ready for create()."""
    return (connection.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0
            and connection.execute("PRAGMA application_id").fetchone()[0] == 0)


def _objects(connection: sqlite3.Connection) -> list[tuple]:
    return sorted(tuple(row) for row in connection.execute("SELECT type, name, tbl_name, sql FROM sqlite_master"))
