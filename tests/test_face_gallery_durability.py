"""The face gallery across processes and SIGKILLs (app/faces/): whatever moment a process dies at, the gallery
opens and each person is whole or absent, as the last commit left them; several processes register at once
and each sees the others' work at its next search.

The killed processes are tests/face_gallery_people.py's workers. The kill moments are random (seeded), inside a
bounded number of runs; what is asserted is the invariant, never a timing.
"""

from __future__ import annotations

import random
import sqlite3
import time
from pathlib import Path

from app.faces import Gallery, backup
from tests.face_gallery_people import (EMBEDDER_A, EMBEDDER_B, WORKER_RUN_S, Worker, seed_of, embed_b, faces_of,
                                       key_vector, region_image)


def _sound(db: Path) -> sqlite3.Connection:
    """The gallery's file read as any SQLite reader would, after checking that it is whole."""
    connection = sqlite3.connect(db)
    assert connection.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    assert connection.execute("PRAGMA foreign_key_check").fetchall() == []
    assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    return connection


class People:
    """What the churn worker's lines say the gallery holds: userid -> the keys of their faces, in order."""

    def __init__(self):
        self.state: dict[str, tuple] = {}
        self.keys_by_vector: dict[bytes, tuple] = {}
        self._regions: dict[tuple, bytes] = {}

    def learn(self, op: str, userid: str, version: int, count: int) -> tuple:
        keys = tuple((userid, version, index) for index in range(count))
        for key in keys:
            self.keys_by_vector[key_vector(*key).tobytes()] = key
        return keys

    def after(self, state: dict, op: str, userid: str, keys: tuple) -> dict:
        new = dict(state)
        if op == "delete":
            new.pop(userid, None)
        else:
            new[userid] = (state.get(userid, ()) if op == "add" else ()) + keys
        return new

    def expected(self, lines: list[list[str]]) -> tuple[list[dict], bool]:
        """The states the gallery may be in after these lines: the last committed one, and the one the operation
        in flight would make, if one was (then True)."""
        state, pending = self.state, None
        for word, op, userid, version, count in lines[1:]:
            keys = self.learn(op, userid, int(version), int(count))
            if word == "begin":
                pending = self.after(state, op, userid, keys)
            else:
                state, pending = pending, None
        return [state] if pending is None else [state, pending], pending is not None

    def stored(self, db: Path) -> dict:
        """What the gallery holds, each face identified by its vector and checked whole (its region's bytes, one
        vector); opened through Gallery first, as the service would after the kill."""
        with Gallery(db) as gallery:
            userids = gallery.userids()
        connection = _sound(db)
        try:
            found: dict[str, list] = {userid: [] for userid in userids}
            rows = connection.execute(
                "SELECT person.userid, face.id, face.image, group_concat(hex(vector.data)), count(vector.id) "
                "FROM person JOIN face ON face.person = person.id LEFT JOIN vector ON vector.face = face.id "
                "GROUP BY face.id ORDER BY face.id").fetchall()
        finally:
            connection.close()
        for userid, face, image, vector, vectors in rows:
            assert vectors == 1, f"face {face} of {userid} has {vectors} vectors"
            key = self.keys_by_vector[bytes.fromhex(vector)]
            assert key[0] == userid and image == self.region(key), f"face {face} of {userid} is not {key}'s"
            found[userid].append(key)
        assert all(found.values()), f"a person without faces: {found}"
        return {userid: tuple(keys) for userid, keys in found.items()}

    def region(self, key: tuple) -> bytes:
        if key not in self._regions:
            self._regions[key] = region_image(seed_of("region", *key))
        return self._regions[key]


def test_a_sigkill_at_any_moment_of_registering_or_deleting_leaves_each_person_whole_or_absent(tmp_path):
    """Runs of registrations (new people, replaced faces, added faces) and deletions, each killed at a random
    moment: after each kill the gallery opens, passes integrity_check, and holds exactly what the committed steps
    made, plus or minus the one step in flight; nothing committed is lost and no person is half there."""
    db, rng, people, in_flight = tmp_path / "faces.db", random.Random(44), People(), 0
    for run in range(10):
        worker = Worker(tmp_path, "churn", db, run, 400)
        worker.wait_ready()
        time.sleep(rng.uniform(0.0, 0.8))  # the kill's moment, chosen at random: not a wait for anything
        worker.kill()
        allowed, pending = people.expected(worker.lines)
        stored = people.stored(db)
        assert stored in allowed, f"run {run}: the gallery holds {stored}, expected one of {allowed}"
        in_flight += pending
        people.state = stored
    assert people.state, "no person was ever registered"
    assert in_flight >= 1, "no kill landed inside a registration or a deletion"


def _fill(db: Path, prefix: str, people: int) -> None:
    with Gallery(db) as gallery:
        for index in range(people):
            gallery.register(f"{prefix}-{index}", faces_of(f"{prefix}-{index}", 0, 2), EMBEDDER_A)


def test_a_reembedding_killed_at_any_moment_keeps_its_batches_and_resumes(tmp_path):
    """A re-embedding for a new embedder (batches of 4 faces), killed at random moments, and killed where its
    embedder stalls at a random face: every vector it stored is the new embedder's vector of that very face, the old
    embedder's are all there, nothing it reported stored is lost, and a last run completes it."""
    db, rng = tmp_path / "faces.db", random.Random(45)
    _fill(db, "r", 24)
    with Gallery(db) as gallery:
        expected = {face.face_id: embed_b(face.region).tobytes()
                    for userid in gallery.userids() for face in gallery.faces(userid)}
    counts, stalled = [0], []
    for run in range(6):
        stall = rng.randint(5, len(expected) - 1) if run % 2 == 0 else 0  # the first stops after a batch or more
        worker = Worker(tmp_path, "reembed", db, stall)
        worker.wait_ready()
        if stall:
            worker.wait_for_line("stalled", 1)
        else:
            time.sleep(rng.uniform(0.0, 0.3))  # the kill's moment, chosen at random: not a wait for anything
        worker.kill()
        connection = _sound(db)
        rows = connection.execute("SELECT embedder.sha256, vector.face, vector.data FROM vector JOIN embedder "
                                  "ON embedder.id = vector.embedder").fetchall()
        connection.close()
        by_b = {face: data for sha256, face, data in rows if sha256 == EMBEDDER_B}
        assert sum(sha256 == EMBEDDER_A for sha256, _, _ in rows) == len(expected)
        assert all(expected[face] == data for face, data in by_b.items())
        reported = [int(line[1]) for line in worker.lines if line[0] == "stored"]
        assert len(by_b) >= counts[-1] + (reported[-1] if reported else 0)  # every batch it reported is there
        counts.append(len(by_b))
        if stall and ["stalled"] in worker.lines:
            stalled.append(len(by_b))
    assert 0 < stalled[0] < len(expected), (counts, stalled)  # the first stopped part way, and kept its batches
    lines = Worker(tmp_path, "reembed", db, 0).finish()
    assert lines[-1] == ["complete", "0"]
    with Gallery(db) as gallery:
        assert gallery.coverage(EMBEDDER_B).complete and gallery.coverage(EMBEDDER_B).embedded_faces == len(expected)
        assert gallery.coverage(EMBEDDER_A).embedded_faces == len(expected)


def test_a_restore_killed_at_any_moment_leaves_the_old_gallery_or_the_new_one(tmp_path):
    """Two backups restored in turn, killed at random moments: the gallery is always exactly one of them (or what
    it was before the first restore), whole, and still in WAL mode."""
    db, rng = tmp_path / "faces.db", random.Random(46)
    galleries = {}
    for name, people in (("x", 5), ("y", 8)):
        source = tmp_path / f"{name}.db"
        _fill(source, name, people)
        galleries[name] = {f"{name}-{index}" for index in range(people)}
        with Gallery(source) as gallery:
            backup(gallery, tmp_path / f"{name}.backup")
    _fill(db, "before", 3)
    allowed = [{f"before-{index}" for index in range(3)}, *galleries.values()]
    restored = 0
    for _ in range(5):
        worker = Worker(tmp_path, "restore", db, 200, tmp_path / "x.backup", tmp_path / "y.backup")
        worker.wait_ready()
        time.sleep(rng.uniform(0.0, 0.6))
        worker.kill()
        restored += sum(line[0] == "restored" for line in worker.lines)
        _sound(db).close()
        with Gallery(db) as gallery:
            userids = set(gallery.userids())
            assert userids in allowed, userids
            assert all(len(gallery.faces(userid)) == 2 for userid in userids)
            assert gallery.coverage(EMBEDDER_A).complete
    assert restored >= 1, "no restore finished before a kill"


def test_several_processes_register_at_once_and_nothing_is_lost(tmp_path):
    """Four processes register ten people each, and each adds a face to one shared person after every
    registration: every person and every face is there, once."""
    db = tmp_path / "faces.db"
    Gallery(db).close()  # made first, so that the workers race on writes, not on making the file
    workers = [Worker(tmp_path, "register", db, f"w{index}", 10) for index in range(4)]
    for worker in workers:
        worker.finish()
    with Gallery(db) as gallery:
        assert sorted(gallery.userids()) == sorted([f"w{w}-{i}" for w in range(4) for i in range(10)] + ["shared"])
        assert all(len(gallery.faces(f"w{w}-{i}")) == 2 for w in range(4) for i in range(10))
        shared = gallery.faces("shared")
        assert len(shared) == 40
        assert len({face.region.image for face in shared}) == 40
        for w in range(4):
            assert gallery.search(EMBEDDER_A, key_vector(f"w{w}-3", 0, 1))[0].userid == f"w{w}-3"
            assert gallery.search(EMBEDDER_A, key_vector(f"shared-w{w}", 7, 0))[0].userid == "shared"
    _sound(db).close()


def test_each_process_sees_another_s_registration_deletion_and_restore_at_its_next_search(tmp_path):
    """A process's search matrix is read again when another process commits (data_version), and only then."""
    db = tmp_path / "faces.db"
    vector = key_vector("other-0", 0, 0)
    with Gallery(db) as gallery:
        gallery.register("ann", faces_of("ann", 0, 1), EMBEDDER_A)
        first = gallery.matrix(EMBEDDER_A)
        assert gallery.matrix(EMBEDDER_A) is first  # nothing changed: not read again
        assert gallery.search(EMBEDDER_A, vector)[0].userid == "ann"
        backup(gallery, tmp_path / "ann.backup")

        Worker(tmp_path, "register", db, "other", 1).finish()
        assert gallery.search(EMBEDDER_A, vector)[0].userid == "other-0"
        assert gallery.matrix(EMBEDDER_A) is not first

        Worker(tmp_path, "delete", db, "other-0").finish()
        assert gallery.search(EMBEDDER_A, vector)[0].userid != "other-0"
        assert "other-0" not in gallery.userids()

        Worker(tmp_path, "restore", db, 1, tmp_path / "ann.backup").finish()
        assert gallery.userids() == ["ann"]
        assert len(gallery.matrix(EMBEDDER_A)) == 1


def test_two_galleries_in_one_process_see_each_other_s_commits(tmp_path):
    db = tmp_path / "faces.db"
    with Gallery(db) as one, Gallery(db) as two:
        assert two.search(EMBEDDER_A, key_vector("ann", 0, 0)) == [None]
        one.register("ann", faces_of("ann", 0, 1), EMBEDDER_A)
        assert two.search(EMBEDDER_A, key_vector("ann", 0, 0))[0].userid == "ann"
        assert one.search(EMBEDDER_A, key_vector("ann", 0, 0))[0].userid == "ann"
        two.delete("ann")
        assert one.search(EMBEDDER_A, key_vector("ann", 0, 0)) == [None]


def test_a_gallery_used_across_a_fork_refuses_rather_than_corrupts(tmp_path):
    """gunicorn forks its workers: a Gallery opened before the fork raises GalleryMoved in the child, and the
    parent's goes on."""
    import multiprocessing

    db = tmp_path / "faces.db"
    with Gallery(db) as gallery:
        gallery.register("ann", faces_of("ann", 0, 1), EMBEDDER_A)
        context = multiprocessing.get_context("fork")
        result = context.Queue()
        child = context.Process(target=_use_after_fork, args=(gallery, result))
        child.start()
        child.join(timeout=WORKER_RUN_S)
        assert result.get(timeout=10) == "GalleryMoved"
        assert gallery.userids() == ["ann"]


def _use_after_fork(gallery: Gallery, result) -> None:
    try:
        gallery.userids()
        result.put("no error")
    except Exception as error:  # noqa: BLE001 - the type is the answer
        result.put(type(error).__name__)
