"""The 1000 ImageNet-1k class names, in the standard output order, from timm's data files.

timm (Apache-2.0) ships `imagenet_synsets.txt` (the 1000 WordNet ids in class order) and
`imagenet_synset_to_lemma.txt` (id -> "tabby, tabby cat"). We read them straight from
the wheel: importing timm would pull torchvision, and we need two text files.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

TIMM_VERSION = "1.0.31"
SYNSETS = "timm/data/_info/imagenet_synsets.txt"
LEMMAS = "timm/data/_info/imagenet_synset_to_lemma.txt"


class LabelsError(Exception):
    pass


def download_timm_wheel(dest: Path) -> Path:
    """pip download timm==TIMM_VERSION (the wheel alone, no dependencies) into dest."""
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
         f"timm=={TIMM_VERSION}", "--dest", str(dest)],
        check=True,
    )
    wheels = sorted(Path(dest).glob(f"timm-{TIMM_VERSION}-*.whl"))
    if not wheels:
        raise LabelsError(f"pip download left no timm {TIMM_VERSION} wheel in {dest}")
    return wheels[0]


def labels_from_wheel(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        synsets = z.read(SYNSETS).decode().split()
        lemmas = dict(line.split("\t", 1) for line in z.read(LEMMAS).decode().splitlines() if "\t" in line)
    if len(synsets) != 1000:
        raise LabelsError(f"{wheel}: expected 1000 synsets, found {len(synsets)}")
    return [lemmas[s].strip() for s in synsets]


def imagenet_labels(wheel: Path | None = None) -> list[str]:
    if wheel is not None:
        return labels_from_wheel(wheel)
    with tempfile.TemporaryDirectory() as tmp:
        return labels_from_wheel(download_timm_wheel(Path(tmp)))
