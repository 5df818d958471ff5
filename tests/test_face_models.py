"""tests/face_models.py: the tiny face detector finds the synthetic faces where they are, in ULFD's shapes and
both its forms; the tiny embedder's vectors tell the synthetic people apart, directly and through the
detector, the crop and the alignment; the emulator runs both as TFLite's reference kernels do."""

from __future__ import annotations

import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter, OpResolverType

from app.emulator.interpreter import Interpreter as Emulator
from app.faces.align import aligned, cropped
from app.tasks.priors import (BOXES_DECODED, BOXES_PRIORS, LOGITS, PROBABILITIES, boxes_form, decode_faces,
                              dequantize, scores_form, ultra_light_priors)
from tests.face_models import (DETECTOR_SIZE, EMBEDDER_SIZE, FACE_SIDE, REFERENCE_PEOPLE, detector_input,
                               draw_face, embedder_input, face_photo, person, tiny_face_detector, tiny_face_embedder)

PEOPLE = range(8)  # the people the embedder is shown to tell apart (none of them a reference person)
# photos: faces of 48 pixels, apart, some at the edges
SCENES = [
    [(0, 1, (40, 60, 48)), (1, 2, (200, 100, 48)), (2, 3, (131, 170, 48))],
    [(3, 4, (0, 0, 48)), (4, 5, (272, 192, 48))],
    [(5, 6, (150, 10, 48))],
    [(6, 7, (7, 185, 48)), (7, 8, (250, 30, 48)), (0, 2, (120, 96, 48))],
    [],
]


def run(model: bytes, tensor: np.ndarray, engine=Interpreter, **options) -> dict[str, tuple[np.ndarray, tuple]]:
    interpreter = engine(model_content=model, **options)
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], tensor)
    interpreter.invoke()
    return {d["name"]: (interpreter.get_tensor(d["index"]), tuple(d["quantization"]))
            for d in interpreter.get_output_details()}


def iou(a, b) -> float:
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    return w * h / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - w * h)


def detect(outputs, boxes_role="locations", scores_role="scores", **options):
    faces = decode_faces(dequantize(*outputs[boxes_role]), dequantize(*outputs[scores_role]), ultra_light_priors(),
                         min_score=0.5, **options)
    width, height = DETECTOR_SIZE
    return [(x1 * width, y1 * height, x2 * width, y2 * height) for y1, x1, y2, x2 in faces.boxes.astype(np.float64)]


def test_the_detector_has_ulfds_shapes():
    interpreter = Interpreter(model_content=tiny_face_detector())
    (image,) = interpreter.get_input_details()
    assert list(image["shape"]) == [1, 240, 320, 3] and image["dtype"] == np.int8
    assert image["quantization"] == pytest.approx((1 / 128, -1))
    boxes, scores = interpreter.get_output_details()
    assert list(boxes["shape"]) == [1, 4420, 4] and list(scores["shape"]) == [1, 4420, 2]
    assert scores["quantization"] == pytest.approx((1 / 256, -128))  # TFLite's int8 SOFTMAX
    flipped = Interpreter(model_content=tiny_face_detector(order="scores-first")).get_output_details()
    assert [list(d["shape"]) for d in flipped] == [[1, 4420, 2], [1, 4420, 4]]


@pytest.mark.parametrize("scene", range(len(SCENES)))
def test_the_detector_finds_each_face_where_it_is_and_nothing_else(scene):
    photo, truth = face_photo(SCENES[scene], seed=scene)
    found = detect(run(tiny_face_detector(), detector_input(photo)))
    assert len(found) == len(truth)
    for face in truth:
        assert max(iou(face.box, box) for box in found) >= 0.6, (face.box, found)


def test_the_detector_finds_faces_all_over_the_picture():
    rng = np.random.default_rng(7)
    ious = []
    for trial in range(30):
        left, top = int(rng.integers(0, 320 - FACE_SIDE)), int(rng.integers(0, 240 - FACE_SIDE))
        photo, (face,) = face_photo([(int(rng.integers(0, 200)), int(rng.integers(1, 9)), (left, top, FACE_SIDE))],
                                    seed=100 + trial)
        found = detect(run(tiny_face_detector(), detector_input(photo)))
        assert len(found) == 1, (face.box, found)
        ious.append(iou(face.box, found[0]))
    assert min(ious) >= 0.6 and np.median(ious) >= 0.8


def test_the_decoded_export_and_the_logits_give_the_same_faces():
    photo, truth = face_photo(SCENES[0], seed=0)
    tensor = detector_input(photo)
    raw = run(tiny_face_detector(), tensor)
    decoded = run(tiny_face_detector(boxes="decoded"), tensor)
    logits = run(tiny_face_detector(scores="logits"), tensor)
    priors = ultra_light_priors()
    assert boxes_form(dequantize(*raw["locations"]), priors) == BOXES_PRIORS
    assert boxes_form(dequantize(*decoded["boxes"]), priors) == BOXES_DECODED
    assert scores_form(*raw["scores"]) == PROBABILITIES and scores_form(*logits["logits"]) == LOGITS
    reference = detect(raw)
    from_decoded = detect(decoded, boxes_role="boxes", form=BOXES_DECODED)
    from_logits = detect(logits, scores_role="logits", scores_are=LOGITS)
    assert len(reference) == len(from_decoded) == len(from_logits) == len(truth)
    # the corners in the graph are int8 (1/140 of the input): within 2.5 pixels of the decode's
    np.testing.assert_allclose(sorted(from_decoded), sorted(reference), atol=2.5)
    for face in truth:
        assert max(iou(face.box, box) for box in from_logits) >= 0.6


@pytest.mark.parametrize("variant", [dict(), dict(boxes="decoded"), dict(scores="logits")])
def test_the_emulator_runs_the_detector_as_tflites_reference_kernels(variant):
    photo, _ = face_photo(SCENES[3], seed=3)
    model, tensor = tiny_face_detector(**variant), detector_input(photo)
    emulated = run(model, tensor, Emulator)
    reference = run(model, tensor, experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
    assert emulated.keys() == reference.keys()
    for name in emulated:
        np.testing.assert_array_equal(emulated[name][0], reference[name][0])


def embed(model: bytes, image, io: str = "uint8", engine=Interpreter) -> np.ndarray:
    outputs = run(model, embedder_input(image, io), engine)
    (values, quantization), = [v for v in outputs.values() if v[0].shape == (1, 128)]
    vector = dequantize(values, quantization)[0]
    return vector / np.linalg.norm(vector)


def separation(vectors: dict[int, list[np.ndarray]]) -> tuple[float, float]:
    """The lowest same-person and the highest different-person cosine similarity."""
    same, different = [], []
    people = sorted(vectors)
    for a in people:
        for b in people:
            if b < a:
                continue
            s = np.asarray(vectors[a]) @ np.asarray(vectors[b]).T
            if a == b:
                same.extend(s[np.triu_indices(len(s), 1)])
            else:
                different.extend(s.ravel())
    return min(same), max(different)


def test_the_embedder_has_mobilefacenets_shapes():
    for io in ("uint8", "int8"):
        interpreter = Interpreter(model_content=tiny_face_embedder(io))
        (image,) = interpreter.get_input_details()
        assert list(image["shape"]) == [1, 112, 96, 3] and image["dtype"] == np.dtype(io).type
        (embedding,) = interpreter.get_output_details()
        assert list(embedding["shape"]) == [1, 128] and embedding["dtype"] == np.dtype(io).type
    for mask, order in (("first", [[1, 2], [1, 128]]), ("last", [[1, 128], [1, 2]])):
        details = Interpreter(model_content=tiny_face_embedder("uint8", mask)).get_output_details()
        assert [list(d["shape"]) for d in details] == order
    assert tiny_face_embedder() is tiny_face_embedder()  # built once a session


def test_the_embedder_tells_the_people_apart():
    model = tiny_face_embedder()
    vectors = {k: [embed(model, draw_face(k, variant).image) for variant in range(1, 7)] for k in PEOPLE}
    same, different = separation(vectors)
    assert same > different + 0.1, (same, different)
    int8 = tiny_face_embedder("int8")
    np.testing.assert_allclose(embed(int8, draw_face(0, 1).image, "int8"), vectors[0][0], atol=1e-6)


def test_the_embedder_tells_the_people_apart_through_the_detector_and_the_crop():
    detector, embedder = tiny_face_detector(), tiny_face_embedder()
    by_crop: dict[int, list[np.ndarray]] = {}
    by_alignment: dict[int, list[np.ndarray]] = {}
    for k in PEOPLE:
        for variant in range(1, 6):
            rng = np.random.default_rng([k, variant])
            left, top = int(rng.integers(10, 260)), int(rng.integers(10, 180))
            photo, (face,) = face_photo([(k, variant, (left, top, FACE_SIDE))], seed=10 * k + variant)
            (box,) = detect(run(detector, detector_input(photo)))
            by_crop.setdefault(k, []).append(embed(embedder, cropped(photo, box, EMBEDDER_SIZE, 0.2)))
            by_alignment.setdefault(k, []).append(embed(embedder, aligned(photo, face.landmarks, EMBEDDER_SIZE)))
    for vectors in (by_crop, by_alignment):
        same, different = separation(vectors)
        assert same > different + 0.05, (same, different)


def test_the_mask_output_is_a_softmax_beside_the_embedding():
    for io in ("uint8", "int8"):
        outputs = run(tiny_face_embedder(io, "first"), embedder_input(draw_face(2, 1).image, io))
        (mask, mask_q), (embedding, _) = outputs.values()
        assert mask.shape == (1, 2) and embedding.shape == (1, 128)
        assert dequantize(mask, mask_q).sum() == pytest.approx(1.0, abs=2 / 256)
    plain = embed(tiny_face_embedder(), draw_face(2, 1).image)
    np.testing.assert_allclose(embed(tiny_face_embedder("uint8", "last"), draw_face(2, 1).image), plain, atol=1e-6)


def test_the_emulator_runs_the_embedder_as_tflites_reference_kernels():
    image = draw_face(5, 3).image
    for io in ("uint8", "int8"):
        model = tiny_face_embedder(io, "last")
        emulated = run(model, embedder_input(image, io), Emulator)
        reference = run(model, embedder_input(image, io), experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
        for name in emulated:
            np.testing.assert_array_equal(emulated[name][0], reference[name][0])


def test_people_are_the_same_in_every_call_and_apart_from_the_reference_people():
    assert draw_face(3, 2).image.tobytes() == draw_face(3, 2).image.tobytes()
    assert draw_face(3, 2).image.tobytes() != draw_face(3, 3).image.tobytes()
    assert person(3) == person(3) != person(4)
    assert not set(PEOPLE) & set(REFERENCE_PEOPLE)
    drawn = draw_face(1, 0, (96, 112))
    left_eye, right_eye, nose, mouth_left, mouth_right = drawn.landmarks
    assert left_eye[0] < nose[0] < right_eye[0] and mouth_left[0] < mouth_right[0]
    assert left_eye[1] < nose[1] < mouth_left[1]
