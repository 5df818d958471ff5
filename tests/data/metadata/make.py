"""Rebuild the metadata fixtures with TFLite's own metadata writers (tflite-support 0.4.4).

The importer reads TFLite metadata with a small reader of its own (app/importing/metadata.py);
these files are what it is checked against: tiny models from tests/, with metadata and packed label
files written by the real writers, exactly as Model Maker and Coral's model zoo write them.

    python tests/data/metadata/make.py [--wheel tflite_support-0.4.4-cp311-...whl]

Without --wheel it runs `pip download tflite-support==0.4.4 --no-deps` (the wheel pins protobuf<4,
so it is unpacked, never installed). Its writers need libusb-1.0 (Debian: libusb-1.0-0). The
files and their sha256 are listed in SHA256SUMS; the same inputs give the same bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
VERSION = "0.4.4"
LABELS = ["red", "green", "blue", "magenta"]
DETECTOR_LABELS = ["square", "circle"]


def wheel(directory: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "download", f"tflite-support=={VERSION}", "--no-deps",
                    "--only-binary=:all:", "-d", str(directory)], check=True)
    return next(directory.glob("tflite_support-*.whl"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", type=Path, default=None, help="the tflite-support wheel, already downloaded")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        with zipfile.ZipFile(args.wheel or wheel(work)) as archive:
            archive.extractall(work / "wheel")
        sys.path[:0] = [str(work / "wheel"), str(ROOT)]
        from tensorflow_lite_support.metadata.python.metadata_writers import (
            image_classifier,
            metadata_info,
            object_detector,
        )

        from tests.classifier_models import tiny_classifier
        from tests.detection_models import tiny_detector

        labels = work / "labels.txt"
        labels.write_text("\n".join(LABELS) + "\n")
        detector_labels = work / "coco_subset.txt"
        detector_labels.write_text("\n".join(DETECTOR_LABELS) + "\n")
        files = {
            # TF1-style uint8 classifier, [-1, 1] inputs: the classic Model Maker / model zoo metadata
            "classifier_tf1_uint8.tflite": image_classifier.MetadataWriter.create_for_inference(
                tiny_classifier(style="tf1"), [127.5], [127.5], [str(labels)]).populate(),
            # int8 I/O, per-channel normalization, with the model's name, author and licence
            "classifier_int8.tflite": image_classifier.MetadataWriter.create_from_metadata_info(
                tiny_classifier(style="tf2", io="int8"),
                general_md=metadata_info.GeneralMd(name="tiny colours", version="v2", description="colours",
                                                   author="the tests", licenses="Apache-2.0"),
                input_md=metadata_info.InputImageTensorMd(norm_mean=[123.675, 116.28, 103.53],
                                                          norm_std=[58.395, 57.12, 57.375],
                                                          color_space_type=1, tensor_type=9),
                output_md=metadata_info.ClassificationTensorMd(label_files=[metadata_info.LabelFileMd(str(labels))],
                                                               tensor_type=3)).populate(),
            # a detector in the TF2 output order, labels on its classes output
            "detector_tf2.tflite": object_detector.MetadataWriter.create_for_inference(
                tiny_detector(order="tf2"), [0], [255], [str(detector_labels)]).populate(),
        }
    sums = []
    for name, data in files.items():
        (HERE / name).write_bytes(data)
        sums.append(f"{hashlib.sha256(data).hexdigest()}  {name}")
    (HERE / "SHA256SUMS").write_text("\n".join(sums) + "\n")
    print("\n".join(sums))


if __name__ == "__main__":
    main()
