"""People for the face gallery's tests, made the same in every process: a face's region and vector follow from
its key (userid, version, index), so a test reading the gallery after a SIGKILL can say whose each stored face
is and whether it is whole.

`Worker` starts one of the processes the tests start and kill, and collects its lines; run as a script, this
module is that process (`python -m tests.face_gallery_people MODE ...`):
  churn DB SEED ROUNDS        registers, replaces, adds to and deletes people at random, one line per step
                              ("begin OP USERID VERSION COUNT" before, "done ..." once committed)
  register DB PREFIX PEOPLE   registers PREFIX-0 .. PREFIX-(PEOPLE-1) with 2 faces each, adding a face to "shared"
                              after each ("registered USERID")
  reembed DB STALL            re-embeds the gallery for EMBEDDER_B in batches of 4, printing the count after each;
                              with STALL > 0 its embedder stops for good at that face ("stalled": kill it there)
  restore DB ROUNDS BACKUP...  restores the backups in turn, ROUNDS in all ("restored NAME" after each)
  delete DB USERID            deletes one person
Each prints "ready" once its gallery is open.
"""

from __future__ import annotations

import hashlib
import io
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
from PIL import Image

from app.faces import FaceRegion, Gallery, NewFace, reembed, restore
from tests.waiting import until

WORKER_START_S = 120  # a Python with numpy and Pillow starting on a loaded 2-core machine
WORKER_RUN_S = 300
ROOT = Path(__file__).resolve().parents[1]

EMBEDDER_A = hashlib.sha256(b"embedder A").hexdigest()
EMBEDDER_B = hashlib.sha256(b"embedder B").hexdigest()
DIMENSION = 64
REGION_SIDE = 96


def seed_of(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256("/".join(map(str, parts)).encode()).digest()[:8], "little")


def unit_vector(seed: int, dimension: int = DIMENSION) -> np.ndarray:
    vector = np.random.default_rng(seed).standard_normal(dimension).astype(np.float32)
    return vector / np.linalg.norm(vector)


def region_image(seed: int, side: int = REGION_SIDE) -> bytes:
    """A JPEG of noise: high-entropy bytes, so that any 32 of them in a row identify it."""
    pixels = np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=95, subsampling=0)
    return out.getvalue()


def face_region(seed: int, side: int = REGION_SIDE) -> FaceRegion:
    third = side / 3
    return FaceRegion(region_image(seed, side), side, side, (third, third, 2 * third, 2 * third),
                      ((0.4 * side, 0.4 * side), (0.6 * side, 0.4 * side)))


def key_face(userid: str, version: int, index: int) -> NewFace:
    return NewFace(face_region(seed_of("region", userid, version, index)), key_vector(userid, version, index))


def key_vector(userid: str, version: int, index: int, embedder: str = EMBEDDER_A) -> np.ndarray:
    return unit_vector(seed_of("vector", embedder, userid, version, index))


def faces_of(userid: str, version: int, count: int) -> list[NewFace]:
    return [key_face(userid, version, index) for index in range(count)]


def embed_b(region: FaceRegion) -> np.ndarray:
    """EMBEDDER_B as a function of the stored region's bytes: what re-embedding must store for each face. It
    decodes the region, as a real embedder does (and takes about as long as a small one)."""
    region.pixels()
    return unit_vector(seed_of("B", hashlib.sha256(region.image).hexdigest()))


class Worker:
    """tests/face_gallery_people.py in a process of its own; its stdout lines collected as they come."""

    def __init__(self, tmp_path: Path, *args: object):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        self.stderr_path = tmp_path / f"worker-{time.monotonic_ns()}.err"
        with self.stderr_path.open("wb") as stderr:
            self.process = subprocess.Popen([sys.executable, "-m", "tests.face_gallery_people", *map(str, args)],
                                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True)
        self.lines: list[list[str]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            if line.endswith("\n"):  # a line cut by the kill is not one
                self.lines.append(line.split())

    def wait_ready(self) -> None:
        def ready() -> bool:
            if self.process.poll() is not None and not self.lines:
                raise AssertionError(f"worker ended before it was ready: {self.stderr_path.read_text()}")
            return bool(self.lines)
        until(ready, WORKER_START_S, "the worker's gallery open")

    def wait_for_line(self, word: str, count: int) -> None:
        """Until the worker has printed `count` lines that begin with `word` (or ended)."""
        until(lambda: sum(line[0] == word for line in self.lines) >= count or self.process.poll() is not None,
              WORKER_RUN_S, f"{count} {word!r} lines from the worker")

    def kill(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=WORKER_RUN_S)
        self._reader.join(timeout=WORKER_RUN_S)

    def finish(self) -> list[list[str]]:
        self.process.wait(timeout=WORKER_RUN_S)
        self._reader.join(timeout=WORKER_RUN_S)
        assert self.process.returncode == 0, self.stderr_path.read_text()
        return self.lines


def _say(*words: object) -> None:
    print(*words, flush=True)


def churn(db: Path, seed: int, rounds: int) -> None:
    rng = random.Random(seed)
    with Gallery(db) as gallery:
        _say("ready")
        for step in range(rounds):
            people = gallery.userids()
            op = rng.choice(("register", "register", "replace", "add", "delete")) if people else "register"
            userid = f"p{seed}-{step}" if op == "register" else rng.choice(people)
            count = 0 if op == "delete" else rng.randint(1, 4)
            if op == "add" and len(gallery.faces(userid)) + count > 40:
                op = "replace"
            _say("begin", op, userid, step, count)
            if op == "delete":
                gallery.delete(userid)
            else:
                gallery.register(userid, faces_of(userid, step, count), EMBEDDER_A, replace=op != "add")
            _say("done", op, userid, step, count)


def register_people(db: Path, prefix: str, people: int) -> None:
    with Gallery(db) as gallery:
        _say("ready")
        for index in range(people):
            userid = f"{prefix}-{index}"
            gallery.register(userid, faces_of(userid, 0, 2), EMBEDDER_A)
            gallery.register("shared", faces_of(f"shared-{prefix}", index, 1), EMBEDDER_A, replace=False)
            _say("registered", userid)
        _say("done", len(gallery.userids()))


def reembed_gallery(db: Path, stall: int) -> None:
    embedded = 0

    def embed(region: FaceRegion) -> np.ndarray:
        nonlocal embedded
        embedded += 1
        if embedded == stall:
            _say("stalled")
            time.sleep(600)  # until the test kills it
        return embed_b(region)

    with Gallery(db) as gallery:
        _say("ready")
        done = reembed(gallery, EMBEDDER_B, embed, batch=4, progress=lambda stored: _say("stored", stored))
        _say("complete", len(done.missing))


def restore_backups(db: Path, rounds: int, backups: list[Path]) -> None:
    with Gallery(db) as gallery:
        _say("ready")
        for step in range(rounds):
            source = backups[step % len(backups)]
            restore(gallery, source)
            _say("restored", source.name)


def main(argv: list[str]) -> int:
    mode, db, *rest = argv
    if mode == "churn":
        churn(Path(db), int(rest[0]), int(rest[1]))
    elif mode == "register":
        register_people(Path(db), rest[0], int(rest[1]))
    elif mode == "reembed":
        reembed_gallery(Path(db), int(rest[0]))
    elif mode == "restore":
        restore_backups(Path(db), int(rest[0]), [Path(p) for p in rest[1:]])
    elif mode == "delete":
        with Gallery(Path(db)) as gallery:
            gallery.delete(rest[0])
    else:
        raise SystemExit(f"unknown mode {mode}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
