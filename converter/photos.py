"""Real photos that ship inside PyPI and Debian packages: calibration and test data with no download.

scikit-image's data/ and scikit-learn's datasets/images/ hold a few real photographs
(a cat, a coffee cup, a rocket, motorcycles, a Chinese temple, a flower, ...). They are
located through the installed distributions' files, without importing the packages.
Photos of people, for detectors, come from those, matplotlib's sample data and Debian's
opencv-doc (PEOPLE_PHOTOS).
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

# (distribution, path inside it, ImageNet subject or None). A photo has an ImageNet
# subject when what it shows is one of the 1000 classes; on the others (textures,
# microscopy, the sky) a classifier's top-1 is a near-uniform guess, so agreement
# there measures noise more than quantization. Both are reported.
PHOTOS = (
    ("scikit-image", "skimage/data/astronaut.png", None),
    ("scikit-image", "skimage/data/brick.png", None),
    ("scikit-image", "skimage/data/camera.png", "reflex camera, tripod"),
    ("scikit-image", "skimage/data/chelsea.png", "tabby cat"),
    ("scikit-image", "skimage/data/clock_motion.png", "wall clock"),
    ("scikit-image", "skimage/data/coffee.png", "espresso, cup"),
    ("scikit-image", "skimage/data/coins.png", None),
    ("scikit-image", "skimage/data/grass.png", None),
    ("scikit-image", "skimage/data/gravel.png", None),
    ("scikit-image", "skimage/data/hubble_deep_field.jpg", None),
    ("scikit-image", "skimage/data/ihc.png", None),
    ("scikit-image", "skimage/data/moon.png", None),
    ("scikit-image", "skimage/data/motorcycle_left.png", "moped, crash helmet"),
    ("scikit-image", "skimage/data/motorcycle_right.png", "moped, crash helmet"),
    ("scikit-image", "skimage/data/retina.jpg", None),
    ("scikit-image", "skimage/data/rocket.jpg", "missile, space shuttle"),
    ("scikit-learn", "sklearn/datasets/images/china.jpg", "palace"),
    ("scikit-learn", "sklearn/datasets/images/flower.jpg", "daisy"),
)


# Real photos of people: (where, path, what it shows, licence). `where` is a PyPI distribution (path inside it) or
# "debian:<package>" (an absolute path the package installs).
PEOPLE_PHOTOS = (
    ("scikit-image", "skimage/data/astronaut.png", "the astronaut Eileen Collins, head and shoulders",
     "public domain (NASA)"),
    ("scikit-image", "skimage/data/camera.png", "a man behind a camera on a tripod, grey", "CC0 (Lav Varshney)"),
    ("matplotlib", "matplotlib/mpl-data/sample_data/grace_hopper.jpg", "Grace Hopper in uniform, head and shoulders",
     "public domain (U.S. Navy photograph)"),
    ("debian:opencv-doc", "/usr/share/doc/opencv-doc/examples/data/messi5.jpg",
     "a footballer kicking a ball, a blurred crowd behind", "OpenCV's sample data: Apache-2.0 AND BSD-3-Clause "
     "(Debian's copyright file for opencv-doc)"),
    ("debian:opencv-doc", "/usr/share/doc/opencv-doc/examples/data/basketball1.png",
     "two men passing a basketball in an office, grey", "OpenCV's sample data: Apache-2.0 AND BSD-3-Clause "
     "(Debian's copyright file for opencv-doc)"),
)


class PhotosNotInstalled(Exception):
    pass


def photo(distribution: str, relative: str) -> Path:
    if distribution.startswith("debian:"):
        package = distribution.removeprefix("debian:")
        path = Path(relative)
        if not path.is_file():
            raise PhotosNotInstalled(f"{path} is missing: it comes from the Debian package {package} "
                                     f"(apt-get install {package}; bash tests/install-debian-packages.sh installs it)")
        return path
    try:
        path = Path(metadata.distribution(distribution).locate_file(relative))
    except metadata.PackageNotFoundError:
        raise PhotosNotInstalled(
            f"the sample photos come from the {distribution} package: pip install {distribution}"
        ) from None
    if not path.is_file():
        raise PhotosNotInstalled(f"{relative} is missing from the installed {distribution}")
    return path


def sample_photos() -> list[Path]:
    """Every photo: calibration data."""
    return [photo(dist, rel) for dist, rel, _ in PHOTOS]


def imagenet_subject_photos() -> list[Path]:
    """The photos whose subject is an ImageNet class."""
    return [photo(dist, rel) for dist, rel, subject in PHOTOS if subject]


def people_photos() -> list[Path]:
    """The photos of people: a detector's quality data."""
    return [photo(where, path) for where, path, _, _ in PEOPLE_PHOTOS]
