"""The test-built segmenter and pose model (tests/segmentation_models.py, tests/pose_models.py), quantized by the
project's converter and imported as a Coral owner imports Coral's files, mean what they are built to mean through
the service's own preprocessing and the tasks' decoding; and the emulator gives TFLite's reference kernels' bytes
on them (BUILTIN_REF, in a subprocess), MoveNet's float tail included.

The service itself, over a socket, on these models: tests/test_segpose_served.py.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from app.imaging.decoding import decode_with_source
from app.imaging.geometry import Geometry, to_pixels
from app.imaging.quantization import InputQuantizer
from app.model_dir.reading import read_model_dir
from app.tasks import pose, segment
from app.tflite_file import read_tflite
from converter.importer import ImportOptions, import_model
from tests import pose_models, segmentation_models
from tests.reference_worker import ReferenceWorker

pytestmark = pytest.mark.slow

MAX_PIXELS = 50_000_000


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Both models built, written as files and imported: (segmenter ModelDir, pose ModelDir)."""
    work = tmp_path_factory.mktemp("segpose")
    segmenter = work / "shapes_segmenter.tflite"
    segmenter.write_bytes(segmentation_models.build_segmenter())
    labels = work / "labels.txt"
    labels.write_text("\n".join(segmentation_models.LABELS) + "\n")
    seg = import_model([segmenter], ImportOptions(name="shapes", out=work / "models", labels=labels,
                                                  mean=[segmentation_models.MEAN], std=[segmentation_models.STD]))
    movenet = work / "disc_pose.tflite"
    movenet.write_bytes(pose_models.build_pose_model())
    pos = import_model([movenet], ImportOptions(name="disc_pose", out=work / "models"))
    return read_model_dir(seg.path), read_model_dir(pos.path)


def png(pixels: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def service_input(model_dir, data: bytes) -> tuple[np.ndarray, Geometry]:
    """The input tensor as the service makes it (decode, resize, quantize with the input's own parameters), and
    the geometry."""
    spec = model_dir.manifest.input
    image, source = decode_with_source(data, spec, MAX_PIXELS)
    detail = read_tflite(model_dir.file("int8")).graph
    tensor = detail.tensors[detail.inputs[0]]
    q = tensor.quantization
    quantizer = InputQuantizer(spec, tensor.dtype, 0.0 if q is None else float(q.scale[0]),
                               0 if q is None else int(q.zero_point[0]))
    return quantizer(to_pixels(image, spec)), Geometry.of(source, image.size, spec)


def tflite(model_dir, tensor: np.ndarray) -> np.ndarray:
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(model_dir.file("int8")), num_threads=1)
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], tensor)
    interpreter.invoke()
    return interpreter.get_tensor(interpreter.get_output_details()[0]["index"])


def test_they_import_as_coral_files_do(models):
    seg, pos = models
    graph = read_tflite(seg.file("int8")).graph
    output = graph.tensors[graph.outputs[0]]
    assert (output.type, output.shape) == ("INT64", (1, 32, 32))  # as DeepLab's ArgMax [1, 513, 513]
    assert (seg.manifest.task, seg.manifest.outputs) == ("segmentation", {"class_map": output.name})
    assert seg.labels == segmentation_models.LABELS
    assert "ARG_MAX over the 3 channels" in seg.manifest.imported.task
    ops = {op.opcode for op in graph.operators}
    assert {"CONV_2D", "RESIZE_BILINEAR", "ARG_MAX"} <= ops
    assert "the CPU runs ARG_MAX after it, as intended" in seg.manifest.edgetpu_analysis
    assert pos.manifest.task == "pose" and pos.labels == pose.KEYPOINT_NAMES
    graph = read_tflite(pos.file("int8")).graph
    assert graph.tensors[graph.inputs[0]].quantization is None  # raw uint8, cast inside, as MoveNet's
    ops = {op.opcode for op in graph.operators}
    assert {"CAST", "ARG_MAX", "FLOOR_DIV", "GATHER_ND", "PACK", "UNPACK", "SQRT", "DIV", "DEQUANTIZE"} <= ops
    floats = {op.opcode for op in graph.operators if op.opcode in ("SQRT", "DIV")
              and graph.tensors[op.outputs[0]].type == "FLOAT32"}
    assert floats == {"SQRT", "DIV"}  # float islands, as in Coral's MoveNet files
    assert pos.manifest.input.mean == [0.0] and pos.manifest.input.std == [1.0]


@pytest.mark.parametrize("resize", ["stretch", "letterbox"])
def test_the_segmenter_finds_the_coloured_regions_of_the_original(models, resize):
    seg, _ = models
    seg = seg.__class__(path=seg.path, manifest=seg.manifest.model_copy(
        update={"input": seg.manifest.input.model_copy(update={"resize": resize})}), labels=seg.labels)
    width, height = 400, 260
    boxes = {1: (40, 30, 200, 150), 2: (250, 120, 380, 240)}
    tensor, geometry = service_input(seg, png(segmentation_models.shapes_image(width, height, boxes)))
    cmap = segment.class_map(tflite(seg, tensor))
    where = segment.sampling(geometry, *cmap.shape)
    mask = segment.mask(cmap, where, len(seg.labels))
    truth = np.zeros((height, width), np.uint8)
    for class_id, (left, top, right, bottom) in boxes.items():
        truth[top:bottom, left:right] = class_id
    # a 32x32 model on a 400x260 photo: its edges are 2 input pixels (25 of the photo's) wide, its regions exact
    margin = 2 * width // segmentation_models.SIZE
    for class_id, (left, top, right, bottom) in boxes.items():
        assert np.all(mask[top + margin:bottom - margin, left + margin:right - margin] == class_id)
    assert np.all(mask[:, :40 - margin][:height // 2] == 0)
    assert (mask == truth).mean() > 0.9
    shares = {s.label: s.fraction for s in segment.shares(cmap, where, seg.labels)}
    assert shares == pytest.approx({"background": (truth == 0).mean(), "red": (truth == 1).mean(),
                                    "green": (truth == 2).mean()}, abs=0.05)


def test_the_pose_models_keypoints_follow_the_disc(models):
    _, pos = models
    width, height, radius = 300, 240, 45
    cell = width / pose_models.CELLS  # a heatmap cell, in the photo's pixels
    means = []
    for cx, cy in ((150, 120), (90, 170), (220, 70)):
        tensor, geometry = service_input(pos, png(pose_models.disc_image(width, height, cx, cy, radius)))
        out = tflite(pos, tensor)
        assert out.dtype == np.float32 and out.shape == (1, 1, 17, 3)
        (found,) = pose.poses(pose.keypoint_values(out, 0.0, 0), geometry, pos.labels)
        xs, ys = np.array([k.x for k in found.keypoints]), np.array([k.y for k in found.keypoints])
        assert np.all(np.hypot(xs - cx, ys - cy) < radius + 1.5 * cell)  # on the disc, give or take a cell
        assert 0.5 < found.score <= 1
        means.append((xs.mean() - cx, ys.mean() - cy))
    # the figure moves with the disc: where its keypoints sit around the disc's centre stays put
    assert np.ptp(np.array(means), axis=0).max() < 1.5 * cell


def test_the_emulator_gives_the_reference_kernels_bytes(models):
    from app.emulator import Interpreter as Emulator

    seg, pos = models
    rng = np.random.default_rng(1)
    cases = [(seg, png(segmentation_models.drawing(rng, 96)[0])) for _ in range(3)]
    cases += [(pos, png(pose_models.disc_image(160, 120, *rng.uniform(30, 100, 2), rng.uniform(15, 40))))
              for _ in range(3)]
    reference = ReferenceWorker("BUILTIN_REF")
    try:
        for model_dir, data in cases:
            model = model_dir.file("int8").read_bytes()
            tensor, _ = service_input(model_dir, data)
            emulator = Emulator(model_content=model)
            emulator.allocate_tensors()
            emulator.set_tensor(emulator.get_input_details()[0]["index"], tensor)
            emulator.invoke()
            ours = emulator.get_tensor(emulator.get_output_details()[0]["index"])
            (theirs,) = reference.run(model, [tensor])
            assert ours.dtype == theirs.dtype and ours.tobytes() == theirs.tobytes(), model_dir.name
    finally:
        reference.close()
