"""Face recognition end to end on one core: what the gallery adds to a recognition, and what a registration costs.

**Recognition** (issue 44's target: a gallery of 10,000 people adds less than 1 ms over detect + embed, on one core).
Side by side in one run, photo after photo: detect + embed through the service's core (app/service.Service built
from its settings, models loaded by its registry; `Core.hold` and `Core.answer`: the detector on the photo's JPEG
bytes, decoded and preprocessed by the core's image work; the photo decoded at full size, each face cut out as
the face routes do (app/faces face_input: aligned on landmarks or cropped with the embedder's margin) and given to
the embedder as its input tensor), then `Gallery.search` of the resulting embeddings in two galleries of 10,000
people: 1 face a person and 3 faces a person. The photos alternate between a registered person's (one of 8 test
people, each registered from 3 other photos of them through the same path) and a stranger's (never registered:
the search reads the whole matrix for them, app/faces/templates.py). The search runs right after the models, as in
a recognition: the matrix comes back from memory after the models' work, not from a warm cache. Printed per
backend (`cpu`: TFLite's kernels, `emulated`: the numpy emulator): the medians and p90 of detect + embed and of
each search, the ms the search adds and its share of detect + embed, and how many of the registered people's
faces the search named rightly.

**Registration** of 100 photos (one face each) on `cpu`: per photo, detect (through the core), the photo decoded,
the gallery's region cut (`cut_region`), the embedder's input made from the stored region as the face task does
(`region_input`) and embedded (through the core), and `Gallery.register` (one transaction, synchronous=FULL) into
a gallery on a temporary file in --dir (a real disk: its fsyncs count); median and p90 of each step, and the
total.

**Models and photos.** No face model ships here: the tests' models (tests/face_models.py), imported by
`converter import` as a user's would be: a detector in Ultra-Light-Fast-Generic-Face-Detector's shapes (320x240,
4420 priors, raw locations and softmax scores, decoded against its priors) and an embedder in MobileFaceNet's
(112 high x 96 wide, uint8, 128 values). Photos: the real photos that ship in scikit-image and scikit-learn
(converter/photos.py), cut to 4:3 at 640x480, dimmed to 15 % (a night scene: the tiny detector takes any bright
face-sized blob for a face, and at 15 % finds only the face), with a test person's cartoon face drawn in at 96
pixels (48 at the detector's input: the size the tiny detector finds), sent as JPEG at quality 90. The faces are
not real people's; the timing does not depend on whose faces they are. The galleries' other people are drawn
from the embedder's own spread: a Gaussian fitted to its vectors of 64 other drawn people (3 photos each, through
the same path), their centres and each face around its person's centre, so that a stranger is as near to them as
the embedder makes people, and the search's per-person bounds skip no more of them than of real ones.

The process is pinned to one core (os.sched_setaffinity) with BLAS on one thread, the interpreters on one thread
and one image thread.

Example usage:
    python bench/face_recognition.py
    python bench/face_recognition.py --people 500 --rounds 20 --photos 5 --backends cpu
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy: one core, as the target says
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import io  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from PIL import Image, ImageOps  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.core import Core  # noqa: E402
from app.core.inputs import ImageInput, TensorInput  # noqa: E402
from app.faces import Gallery, NewFace, cut_region, face_input, region_input  # noqa: E402
from app.imaging.geometry import to_pixels  # noqa: E402
from app.model_dir.schema import FaceSpec  # noqa: E402
from app.service import Service  # noqa: E402
from app.settings import Settings  # noqa: E402
from app.tasks import TASKS  # noqa: E402
from app.tasks.detect import DetectOptions, LandmarkedObject  # noqa: E402
from bench.common import load_average  # noqa: E402
from bench.face_gallery import tiny_region  # noqa: E402
from bench.stats import median, percentile  # noqa: E402
from converter.importer import ImportOptions, import_model  # noqa: E402
from converter.photos import sample_photos  # noqa: E402
from tests.face_models import EMBEDDING, FACE_SIDE, draw_face, tiny_face_detector, tiny_face_embedder  # noqa: E402

TARGET_MS = 1.0          # what recognition against 10,000 people may add over detect + embed, on one core
DETECTOR, EMBEDDER = "faces", "face_embedder"
PHOTO_SIZE = (640, 480)  # twice the detector's input: a face of 96 pixels is its 48
DIM = 0.15               # the scene's brightness (a night scene): the tiny detector finds bright face-sized blobs
TEST_PEOPLE = range(8)   # tests/face_models.py: any two photos of one of them are more alike than of two of them
STRANGERS = range(100, 108)  # drawn as they are, never registered
SPREAD_PEOPLE = range(3000, 3064)  # whose embeddings the gallery's other people are drawn like
KINDS = ("registered", "stranger")
FACES_PER_PERSON = (1, 3)


@dataclass(frozen=True)
class Photo:
    """A photo as a client sends it, and whose face is in it."""

    jpeg: bytes
    person: int

    @property
    def kind(self) -> str:
        return "registered" if self.person in TEST_PEOPLE else "stranger"


def scene_photo(background: Path, person: int, variant: int, rng: np.random.Generator) -> Photo:
    """A real photo cut to 4:3 at PHOTO_SIZE, dimmed, with the person's face drawn in at a random place."""
    with Image.open(background) as image:
        scene = ImageOps.fit(image.convert("RGB"), PHOTO_SIZE, Image.Resampling.BILINEAR)
    scene = Image.eval(scene, lambda v: int(v * DIM))
    side = 2 * FACE_SIDE
    face = draw_face(person, variant, (side, side), background=(20, 20, 20)).image
    scene.paste(face, (int(rng.integers(0, PHOTO_SIZE[0] - side)), int(rng.integers(0, PHOTO_SIZE[1] - side))))
    out = io.BytesIO()
    scene.save(out, format="JPEG", quality=90)
    return Photo(out.getvalue(), person)


def photos_of(people, variants, rng: np.random.Generator) -> list[Photo]:
    """One photo per (person, variant), on the real photos in turn."""
    backgrounds = sample_photos()
    return [scene_photo(backgrounds[i % len(backgrounds)], person, variant, rng)
            for i, (person, variant) in enumerate((p, v) for p in people for v in variants)]


def decoded(jpeg: bytes) -> Image.Image:
    """The photo at its full size, upright, as the face routes cut faces from it."""
    with Image.open(io.BytesIO(jpeg)) as image:
        return ImageOps.exif_transpose(image).convert("RGB")


class FacePath:
    """Detect and embed through the service's core, on one backend."""

    def __init__(self, core: Core, backend: str):
        self.core = core
        self.backend = backend
        manifest = core.serving(EMBEDDER).model_dir.manifest
        self.embedder_id = manifest.files["int8"].sha256  # what the gallery tags its vectors with
        self.size = (manifest.input.width, manifest.input.height)
        self.margin = (manifest.face or FaceSpec()).crop_margin

    async def detect(self, jpeg: bytes) -> list:
        async with self.core.hold(TASKS["detection"], DETECTOR, self.backend) as ticket:
            return (await self.core.answer(ticket, ImageInput(jpeg), DetectOptions())).result.detections

    async def embed(self, face: Image.Image) -> np.ndarray:
        async with self.core.hold(TASKS["embedding"], EMBEDDER, self.backend) as ticket:
            tensor = self.core.images.quantizer(ticket)(to_pixels(face, ticket.model_dir.manifest.input))
            return (await self.core.answer(ticket, TensorInput(tensor))).result.embedding

    async def vectors(self, jpeg: bytes) -> np.ndarray:
        """Every face of the photo embedded: [F, D]."""
        found = await self.detect(jpeg)
        photo = decoded(jpeg)
        return np.stack([await self.embed(face_input(photo, *box_and_landmarks(face), self.size, self.margin))
                         for face in found]) if found else np.zeros((0, EMBEDDING), np.float32)


def box_and_landmarks(face) -> tuple[tuple[float, ...], list[tuple[float, float]]]:
    landmarks = [(p.x, p.y) for p in face.landmarks] if isinstance(face, LandmarkedObject) else []
    return (face.box.x_min, face.box.y_min, face.box.x_max, face.box.y_max), landmarks


def largest(found: list):
    return max(found, key=lambda o: (o.box.x_max - o.box.x_min) * (o.box.y_max - o.box.y_min))


# ---- the galleries --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Spread:
    """How the embedder's vectors spread, fitted to its own output: their mean, and Cholesky factors of the
    covariance between people's centres and of a face around its person's centre."""

    mean: np.ndarray
    between: np.ndarray
    within: np.ndarray

    @classmethod
    def fit(cls, by_person: dict[int, list[np.ndarray]]) -> Spread:
        people = [np.stack(vectors) for vectors in by_person.values() if len(vectors) > 1]
        centres = np.stack([faces.mean(0) for faces in people])
        around = np.concatenate([faces - faces.mean(0) for faces in people])
        ridge = 1e-6 * np.eye(centres.shape[1])  # both are of low rank: 64 people, 3 faces each
        between = np.cov(centres, rowvar=False) + ridge
        within = around.T @ around / (len(around) - len(people)) + ridge
        return cls(centres.mean(0), np.linalg.cholesky(between), np.linalg.cholesky(within))

    def people(self, rng: np.random.Generator, count: int, faces: int) -> np.ndarray:
        """[count, faces, D] unit vectors: people drawn from the fitted spread, each face around its person."""
        dimension = len(self.mean)
        centres = self.mean + rng.standard_normal((count, dimension)) @ self.between.T
        vectors = centres[:, None, :] + rng.standard_normal((count, faces, dimension)) @ self.within.T
        return (vectors / np.linalg.norm(vectors, axis=2, keepdims=True)).astype(np.float32)


def gallery_of(path: Path, people: int, faces: int, test_vectors: dict[int, list[np.ndarray]], spread: Spread,
               embedder: str, rng: np.random.Generator) -> Gallery:
    """`people` people of `faces` faces each: the test people with their embedded photos, the others drawn from
    the embedder's spread (so that a stranger's face is as near to them as the embedder makes it, and the search's
    per-person bounds skip no more of them than they would of real people)."""
    gallery = Gallery(path)
    region = tiny_region()
    for person, vectors in test_vectors.items():
        gallery.register(f"person-{person}", [NewFace(region, v) for v in vectors[:faces]], embedder)
    for index, vectors in enumerate(spread.people(rng, people - len(test_vectors), faces)):
        gallery.register(f"other-{index}", [NewFace(region, v) for v in vectors], embedder)
    return gallery


@dataclass
class Times:
    detect_embed: list[float] = field(default_factory=list)
    search: dict[tuple[int, str], list[float]] = field(default_factory=dict)  # (faces a person, kind) -> ms
    named: dict[int, int] = field(default_factory=dict)  # registered people's faces named as them, per gallery
    faces: dict[str, int] = field(default_factory=dict)  # faces searched, per kind of photo


async def time_recognition(path: FacePath, photos: list[Photo], galleries: dict[int, Gallery], rounds: int) -> Times:
    """Each round: a photo's detect + embed, then the search of its faces in each gallery, timed apart; the photos
    alternate between registered people and strangers, and the galleries' order every two rounds (the second
    search finds the search's code warm), so that each kind of photo meets each gallery first as often."""
    times = Times(search={(n, kind): [] for n in galleries for kind in KINDS}, named=dict.fromkeys(galleries, 0),
                  faces=dict.fromkeys(KINDS, 0))
    for index in range(-3, rounds):  # three untimed rounds first: the models' and the galleries' first use
        photo = photos[index % len(photos)]
        start = time.perf_counter()
        vectors = await path.vectors(photo.jpeg)
        elapsed = time.perf_counter() - start
        if not len(vectors):
            raise SystemExit(f"the detector found no face in the photo of person {photo.person}")
        found = {}
        order = list(galleries.items())
        for n, gallery in order if index % 4 < 2 else reversed(order):  # each gallery first after the models
            start = time.perf_counter()
            found[n] = gallery.search(path.embedder_id, vectors)
            if index >= 0:
                times.search[n, photo.kind].append((time.perf_counter() - start) * 1000)
        if index >= 0:
            times.detect_embed.append(elapsed * 1000)
            times.faces[photo.kind] += len(vectors)
            for n, matches in found.items():
                times.named[n] += sum(m is not None and m.userid == f"person-{photo.person}" for m in matches)
    return times


async def embedded_people(path: FacePath, people, rng: np.random.Generator) -> dict[int, list[np.ndarray]]:
    """3 photos of each person (variants 1-3), each photo's face embedded through the path."""
    vectors: dict[int, list[np.ndarray]] = {}
    for photo in photos_of(people, (1, 2, 3), rng):
        found = await path.vectors(photo.jpeg)
        if len(found):
            vectors.setdefault(photo.person, []).append(found[0])
    return vectors


def recognition_rows(backend: str, times: Times, people: int) -> list[str]:
    base = median(times.detect_embed)
    rows = [f"{backend:<9} {'detect + embed':<32} {base:8.3f} {percentile(times.detect_embed, 90):8.3f}"]
    for (n, kind), searched in times.search.items():
        added = median(searched)
        named = f"{times.named[n]}/{times.faces[kind]}" if kind == "registered" else "-"
        rows.append(f"{backend:<9} {f'+ search, {n} face(s), {kind}':<32} {added:8.3f} "
                    f"{percentile(searched, 90):8.3f} {added / base:8.2%} {named:>9}  "
                    f"{'under' if added < TARGET_MS else 'NOT under'} {TARGET_MS} ms ({people} people)")
    return rows


# ---- registration -----------------------------------------------------------------------------------------------

async def time_registration(path: FacePath, photos: list[Photo], directory: Path) -> dict[str, list[float]]:
    """Each photo's largest face registered as its person, step by step, on a new gallery in `directory`."""
    steps: dict[str, list[float]] = {name: [] for name in ("detect", "decode", "cut_region", "embed", "register",
                                                          "per photo")}
    with tempfile.TemporaryDirectory(dir=directory) as folder, Gallery(Path(folder) / "faces.db") as gallery:
        for photo in photos:
            marks = [time.perf_counter()]
            found = await path.detect(photo.jpeg)
            if not found:
                raise SystemExit(f"the detector found no face in the photo of person {photo.person}")
            marks.append(time.perf_counter())
            image = decoded(photo.jpeg)
            marks.append(time.perf_counter())
            region = cut_region(image, *box_and_landmarks(largest(found)))
            marks.append(time.perf_counter())
            vector = await path.embed(region_input(region, path.size, path.margin))
            marks.append(time.perf_counter())
            gallery.register(f"registered-{photo.person}", [NewFace(region, vector)], path.embedder_id)
            marks.append(time.perf_counter())
            for name, begin, end in zip(steps, marks, marks[1:]):
                steps[name].append((end - begin) * 1000)
            steps["per photo"].append((marks[-1] - marks[0]) * 1000)
        if len(gallery.userids()) != len({photo.person for photo in photos}):
            raise SystemExit(f"registered {len(gallery.userids())} people, not one per photo's person")
    return steps


# ---- the run ----------------------------------------------------------------------------------------------------

def import_models(root: Path) -> Path:
    """The tests' detector and embedder, imported as a user's files would be; returns the models directory."""
    out = root / "models"
    for name, data, options in ((DETECTOR, tiny_face_detector("priors", "softmax"), {}),
                                (EMBEDDER, tiny_face_embedder("uint8"), {"task": "embedding"})):
        source = root / f"{name}.tflite"
        source.write_bytes(data)
        import_model([source], ImportOptions(name=name, out=out, **options))
    return out


async def run(args: argparse.Namespace, models: Path, build_dir: Path) -> None:
    settings = Settings(model_dir=models, models=[DETECTOR, EMBEDDER], backends=args.backends, workers=1,
                        cpu_threads=1, image_threads=1, warmup_at_start=False)
    service = Service(settings)
    async with service.running():
        if not await service.core.settled(300):
            raise SystemExit("the models did not load in 300 s")
        rng = np.random.default_rng(44)
        registered, strangers = photos_of(TEST_PEOPLE, (4, 5), rng), photos_of(STRANGERS, (4, 5), rng)
        photos = [photo for pair in zip(registered, strangers) for photo in pair]
        print(f"{'backend':<9} {'step':<32} {'p50 ms':>8} {'p90 ms':>8} {'share':>8} {'named':>9}  target")
        for backend in args.backends:
            path = FacePath(service.core, backend)
            test_vectors = await embedded_people(path, TEST_PEOPLE, rng)
            spread = Spread.fit(await embedded_people(path, SPREAD_PEOPLE, rng))
            galleries = {n: gallery_of(build_dir / f"{backend}-{n}.db", args.people, n, test_vectors, spread,
                                       path.embedder_id, rng) for n in FACES_PER_PERSON}
            try:
                times = await time_recognition(path, photos, galleries, args.rounds)
            finally:
                for gallery in galleries.values():
                    gallery.close()
            for row in recognition_rows(backend, times, args.people):
                print(row)
        path = FacePath(service.core, args.backends[0])
        steps = await time_registration(path, photos_of(range(2000, 2000 + args.photos), (0,), rng), args.dir)
        print(f"registration, {args.photos} photos (one face each) on {path.backend}, gallery on {args.dir}:")
        for name, values in steps.items():
            print(f"  {name:<11} p50 {median(values):7.3f} ms  p90 {percentile(values, 90):7.3f} ms")
        print(f"  {args.photos} photos in {sum(steps['per photo']) / 1000:.2f} s")


def pin_to_one_core(cpu: int | None) -> int:
    """This process (and every thread it starts from now on) on one core: `cpu`, or the first it may use."""
    chosen = cpu if cpu is not None else min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {chosen})
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--people", type=int, default=10_000, help="people in each searched gallery")
    parser.add_argument("--rounds", type=int, default=300, help="photos recognized per backend (timed)")
    parser.add_argument("--photos", type=int, default=100, help="photos registered (timed)")
    parser.add_argument("--backends", type=lambda s: s.split(","), default=["cpu", "emulated"],
                        help="comma-separated, of cpu and emulated (default both); registration uses the first")
    parser.add_argument("--cpu", type=int, default=None, help="the core to pin to (default: the first allowed)")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()),
                        help="a directory on the disk the registrations are timed on (default: the temp dir)")
    args = parser.parse_args(argv)
    cpu = pin_to_one_core(args.cpu)
    print(f"face recognition on core {cpu}, {args.people} people, {args.rounds} photos a backend "
          f"(load {load_average()})")
    shm = Path("/dev/shm")
    build_dir = shm if shm.is_dir() and os.access(shm, os.W_OK) else None
    with tempfile.TemporaryDirectory() as root, tempfile.TemporaryDirectory(dir=build_dir) as galleries:
        asyncio.run(run(args, import_models(Path(root)), Path(galleries)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
