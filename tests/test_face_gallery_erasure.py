"""A deleted face is gone from the disk's files, not only from the answers: after delete() (and after a
registration that replaces faces, forget_embedder() and restore()), no run of its bytes (its region's JPEG, its
vector, its userid) is in the database file, the -wal or the -shm. secure_delete zeroes the rows SQLite frees;
the WAL, which keeps old pages until they are overwritten, is emptied by a TRUNCATE checkpoint.

The files are read by another process: reading them here would open and close the database file beside this
process's SQLite connections, and closing any descriptor of a file drops the process's POSIX locks on it.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from app.faces import Gallery, NewFace, backup, restore
from tests.face_gallery_people import EMBEDDER_A, EMBEDDER_B, face_region, key_vector, unit_vector

SCAN = ("import sys, pathlib; d = pathlib.Path(sys.argv[1]); "
        "markers = [bytes.fromhex(m) for m in sys.stdin.read().split()]; "
        "files = [p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()]; "
        "print(' '.join(str(i) for i, m in enumerate(markers) if any(m in f for f in files)))")


def found(directory: Path, markers: list[bytes]) -> list[int]:
    """The indices of the markers that some file in `directory` holds, read by another process."""
    done = subprocess.run([sys.executable, "-c", SCAN, str(directory)], input=" ".join(m.hex() for m in markers),
                          capture_output=True, text=True, timeout=120, check=True)
    return [int(i) for i in done.stdout.split()]


def person(userid: str, seed: int, count: int = 2) -> tuple[list[NewFace], list[bytes]]:
    """Faces with large noisy regions (they span overflow pages), and the runs of bytes that identify them."""
    faces = [NewFace(face_region(seed + index, side=200), unit_vector(seed + index)) for index in range(count)]
    markers = [userid.encode()]
    for face in faces:
        image = face.region.image
        markers += [image[at: at + 32] for at in (len(image) // 5, len(image) // 2, 4 * len(image) // 5)]
        markers.append(face.vector.tobytes())
    return faces, markers


@pytest.fixture
def folder(tmp_path):
    folder = tmp_path / "gallery"
    folder.mkdir()
    return folder


def test_a_deleted_person_leaves_no_byte_in_any_file(folder):
    zelda, zelda_markers = person("zelda-7f3a9c1e", 100)
    bob, bob_markers = person("bob-55d01b", 200)
    with Gallery(folder / "faces.db") as gallery:
        gallery.register("zelda-7f3a9c1e", zelda, EMBEDDER_A)
        gallery.register("bob-55d01b", bob, EMBEDDER_A)
        assert found(folder, zelda_markers) == list(range(len(zelda_markers)))  # the scan sees them before
        deletion = gallery.delete("zelda-7f3a9c1e")
        assert (deletion.faces, deletion.erased) == (2, True)
        assert found(folder, zelda_markers) == []
        assert found(folder, bob_markers) == list(range(len(bob_markers)))
        assert (folder / "faces.db-wal").stat().st_size == 0
    assert found(folder, zelda_markers) == []


def test_faces_replaced_by_a_new_registration_are_erased(folder):
    old, old_markers = person("ann", 300)
    new, new_markers = person("ann", 400)
    with Gallery(folder / "faces.db") as gallery:
        gallery.register("ann", old, EMBEDDER_A)
        registration = gallery.register("ann", new, EMBEDDER_A)
        assert (registration.replaced, registration.erased) == (2, True)
        assert found(folder, old_markers[1:]) == []  # the userid stays: ann is still registered
        assert found(folder, new_markers) == list(range(len(new_markers)))


def test_a_forgotten_embedder_s_vectors_are_erased(folder):
    faces, _ = person("ann", 500)
    with Gallery(folder / "faces.db") as gallery:
        gallery.register("ann", faces, EMBEDDER_A)
        stored = gallery.faces("ann")
        vectors = [unit_vector(600 + index) for index in range(len(stored))]
        gallery.add_vectors(EMBEDDER_B, {face.face_id: vector for face, vector in zip(stored, vectors)})
        markers = [vector.tobytes() for vector in vectors]
        assert found(folder, markers) == [0, 1]
        assert gallery.forget_embedder(EMBEDDER_B) == 2
        assert found(folder, markers) == []


def test_a_reader_holding_the_wal_delays_the_erasure_and_erase_freed_finishes_it(folder):
    """A reader of another connection that holds its snapshot past the busy timeout keeps the WAL: the deletion is
    committed and says it is not erased yet; once the reader is done, erase_freed() finishes it."""
    zelda, markers = person("zelda-7f3a9c1e", 700)
    path = folder / "faces.db"
    with Gallery(path, busy_timeout_s=0.2) as gallery:
        gallery.register("zelda-7f3a9c1e", zelda, EMBEDDER_A)
        reader = sqlite3.connect(path, isolation_level=None)
        reader.execute("BEGIN")
        assert reader.execute("SELECT count(*) FROM face").fetchone() == (2,)  # a snapshot with zelda in it
        deletion = gallery.delete("zelda-7f3a9c1e")
        assert deletion.erased is False and gallery.userids() == []
        reader.execute("COMMIT")
        reader.close()
        assert gallery.erase_freed() is True
        assert found(folder, markers) == []


def test_people_a_restore_replaces_are_erased(folder, tmp_path):
    zelda, markers = person("zelda-7f3a9c1e", 800)
    with Gallery(tmp_path / "other.db") as other:
        other.register("bob", [NewFace(face_region(1), key_vector("bob", 0, 0))], EMBEDDER_A)
        backup(other, tmp_path / "bob.backup")
    with Gallery(folder / "faces.db") as gallery:
        gallery.register("zelda-7f3a9c1e", zelda, EMBEDDER_A)
        restore(gallery, tmp_path / "bob.backup")
        assert gallery.userids() == ["bob"]
        assert found(folder, markers) == []
