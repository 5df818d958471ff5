"""Backup and restore of the face gallery (app/faces/backup.py): a backup is one self-contained file, consistent
while other processes write; a restore takes back exactly what was backed up, in one transaction, and refuses
(with a typed error, the gallery and the file handed over untouched) anything that is not a sound backup."""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from app.faces import (BadBackup, CorruptBackup, ForeignBackup, Gallery, NewFace, backup, check_backup, reembed,
                       restore)
from tests.face_gallery_people import (EMBEDDER_A, EMBEDDER_B, Worker, embed_b, face_region, faces_of, key_vector,
                                       unit_vector)


def _content(gallery: Gallery) -> list:
    """Everything a gallery holds that a restore must bring back."""
    return [(person.userid, person.faces, person.embedded,
             [(face.region.image, face.region.box, face.region.landmarks) for face in gallery.faces(person.userid)])
            for person in gallery.people()]


@pytest.fixture
def filled(tmp_path):
    with Gallery(tmp_path / "live" / "faces.db") as gallery:
        for userid, count in (("ann", 2), ("bob", 1), ("Zoë", 3)):
            gallery.register(userid, faces_of(userid, 0, count), EMBEDDER_A)
        reembed(gallery, EMBEDDER_B, embed_b)
        yield gallery


def test_a_backup_restored_into_another_gallery_brings_back_everything(filled, tmp_path):
    summary = backup(filled, tmp_path / "gallery.backup")
    assert (summary.people, summary.faces, summary.vectors) == (3, 6, 12)
    assert summary.size == (tmp_path / "gallery.backup").stat().st_size
    with Gallery(tmp_path / "elsewhere" / "faces.db") as other:
        other.register("someone", faces_of("someone", 0, 1), EMBEDDER_A)
        assert restore(other, tmp_path / "gallery.backup").people == 3
        assert _content(other) == _content(filled)
        assert other.search(EMBEDDER_A, key_vector("Zoë", 0, 2))[0].userid == "Zoë"
        assert other.search(EMBEDDER_A, key_vector("someone", 0, 0))[0].userid != "someone"
        other.register("cy", faces_of("cy", 0, 1), EMBEDDER_A)  # and it goes on as a gallery
        assert other.userids() == ["ann", "bob", "Zoë", "cy"]
    connection = sqlite3.connect(tmp_path / "elsewhere" / "faces.db")
    assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert connection.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    connection.close()


def test_a_backup_is_one_private_file_that_check_backup_reads(filled, tmp_path):
    target = tmp_path / "backups" / "gallery.backup"
    backup(filled, target)
    assert sorted(p.name for p in target.parent.iterdir()) == ["gallery.backup"]  # no -wal, no temporary left
    assert target.stat().st_mode & 0o777 == 0o600
    assert target.read_bytes()[18:20] == b"\x01\x01"  # a rollback-journal file: whole by itself
    backup(filled, target)  # replaced in place
    summary = check_backup(target)
    assert (summary.path, summary.people, summary.faces) == (target, 3, 6)


def test_a_backup_taken_while_another_process_registers_is_consistent(tmp_path):
    """Backups taken while a worker registers people (two faces each, one more for "shared" after each): each
    backup is a sound gallery of the people registered by then, every one of them whole."""
    db = tmp_path / "faces.db"
    Gallery(db).close()
    worker = Worker(tmp_path, "register", db, "w", 30)
    worker.wait_ready()
    try:
        with Gallery(db) as gallery:
            for index in range(3):
                worker.wait_for_line("registered", 5 * (index + 1))
                backup(gallery, tmp_path / f"{index}.backup")
    finally:
        worker.kill()
    counts = []
    for index in range(3):
        check_backup(tmp_path / f"{index}.backup")
        with Gallery(tmp_path / f"restored-{index}" / "faces.db") as scratch:
            restore(scratch, tmp_path / f"{index}.backup")
            people = {person.userid: person for person in scratch.people()}
            shared = people.pop("shared")
            assert all(person.faces == person.embedded[EMBEDDER_A] == 2 for person in people.values())
            assert sorted(people) == sorted(f"w-{i}" for i in range(len(people)))  # in order, none half there
            assert shared.faces == shared.embedded[EMBEDDER_A] in (len(people) - 1, len(people))
            counts.append(len(people))
    assert counts == sorted(counts) and counts[0] >= 5, counts


def _variant(tmp_path: Path, name: str, good: Path, *statements: str) -> Path:
    """A copy of a good backup with SQL applied to it directly."""
    path = tmp_path / name
    shutil.copy(good, path)
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute("PRAGMA foreign_keys = OFF")
    for statement in statements:
        connection.execute(statement)
    connection.close()
    return path


def _bad_files(tmp_path: Path, good: Path) -> list[tuple[Path, type, str]]:
    text = tmp_path / "text.backup"
    text.write_text("userid,embedding\nann,0.1 0.2\n")
    empty = tmp_path / "empty.backup"
    empty.write_bytes(b"")
    half = tmp_path / "half.backup"
    half.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    damaged = tmp_path / "damaged.backup"
    data = bytearray(good.read_bytes())
    for at in range(4096 + 100, len(data), 4096):  # every page but the first, in its middle
        data[at: at + 64] = os.urandom(64)
    damaged.write_bytes(bytes(data))
    deepstack = tmp_path / "faceembedding.db"
    connection = sqlite3.connect(deepstack)
    connection.execute("CREATE TABLE TB_EMBEDDINGS (userid TEXT PRIMARY KEY, embedding TEXT NOT NULL)")
    connection.execute("INSERT INTO TB_EMBEDDINGS VALUES ('ann', '[0.1, 0.2]')")
    connection.commit()
    connection.close()
    zeros = bytes(len(unit_vector(5).tobytes())).hex()
    return [
        (tmp_path / "missing.backup", BadBackup, "no backup file"),
        (empty, CorruptBackup, "not an SQLite database"),
        (text, CorruptBackup, "not an SQLite database"),
        (half, CorruptBackup, "damaged|not a sound"),
        (damaged, CorruptBackup, "damaged|not a sound"),
        (deepstack, ForeignBackup, "DeepStack"),
        (_variant(tmp_path, "trigger.backup", good, "CREATE TRIGGER t AFTER INSERT ON person BEGIN "
                  "DELETE FROM face; END"), ForeignBackup, "schema is not the gallery's"),
        (_variant(tmp_path, "view.backup", good, "CREATE VIEW v AS SELECT 1"), ForeignBackup, "schema"),
        (_variant(tmp_path, "newer.backup", good, "PRAGMA user_version = 2"), ForeignBackup, "newer"),
        (_variant(tmp_path, "length.backup", good, "UPDATE vector SET data = x'00' WHERE id = 1"), CorruptBackup,
         "length"),
        (_variant(tmp_path, "norm.backup", good, f"UPDATE vector SET data = x'{zeros}'"),
         CorruptBackup, "unit length"),
        (_variant(tmp_path, "unknown.backup", good, "UPDATE person SET userid = 'unknown' WHERE userid = 'bob'"),
         CorruptBackup, "matches nobody"),
        (_variant(tmp_path, "image.backup", good, "UPDATE face SET image = x'474946383961' WHERE id = 1"),
         CorruptBackup, "JPEG or PNG"),
        (_variant(tmp_path, "orphan.backup", good, "DELETE FROM person WHERE userid = 'bob'"), CorruptBackup,
         "refers to"),
    ]


def test_anything_but_a_sound_backup_is_refused_and_nothing_changes(filled, tmp_path):
    good = tmp_path / "good.backup"
    backup(filled, good)
    before = _content(filled)
    for path, error, message in _bad_files(tmp_path, good):
        original = path.read_bytes() if path.exists() else None
        neighbours = sorted(p.name for p in path.parent.iterdir())
        with pytest.raises(error, match=message) as raised:
            restore(filled, path)
        assert raised.value.status == 400, path
        with pytest.raises(error):
            check_backup(path)
        assert _content(filled) == before, path
        assert (path.read_bytes() if path.exists() else None) == original, path  # the file handed over: untouched
        assert sorted(p.name for p in path.parent.iterdir()) == neighbours, path  # nothing left beside it
    assert sorted(p.name for p in filled.path.parent.iterdir()) == ["faces.db", "faces.db-shm", "faces.db-wal"]


def test_the_gallery_is_neither_its_own_backup_nor_restored_from_itself(filled):
    with pytest.raises(BadBackup, match="the gallery itself"):
        backup(filled, filled.path)
    with pytest.raises(BadBackup, match="the gallery itself"):
        restore(filled, filled.path)
    assert len(filled.userids()) == 3


def test_a_backup_of_another_page_size_is_restored(filled, tmp_path):
    good = tmp_path / "good.backup"
    backup(filled, good)
    other = _variant(tmp_path, "8k.backup", good, "PRAGMA page_size = 8192", "VACUUM")
    assert sqlite3.connect(other).execute("PRAGMA page_size").fetchone()[0] == 8192
    with Gallery(tmp_path / "fresh" / "faces.db") as fresh:
        fresh.register("x", [NewFace(face_region(1), unit_vector(1))], EMBEDDER_A)
        restore(fresh, other)
        assert _content(fresh) == _content(filled)


def test_a_restore_that_waits_too_long_for_another_process_s_lock_is_busy(filled, tmp_path):
    """sqlite3's backup retries a busy step for ever; the restore gives up after twice the busy timeout."""
    from app.faces import GalleryBusy
    good = tmp_path / "good.backup"
    backup(filled, good)
    with Gallery(tmp_path / "other" / "faces.db", busy_timeout_s=0.1) as other:
        other.register("x", [NewFace(face_region(1), unit_vector(1))], EMBEDDER_A)
        holder = sqlite3.connect(other.path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(GalleryBusy, match="as it was"):
                restore(other, good)
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert other.userids() == ["x"]
        restore(other, good)
        assert other.userids() == ["ann", "bob", "Zoë"]
