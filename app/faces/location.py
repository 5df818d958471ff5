"""Where the gallery lives by default: a data directory outside the repository and the models, so that a new
checkout, a new image or `git clean` never takes the registered faces with it.

On a host, the XDG base directory rule: `$XDG_DATA_HOME/edgetpu-serve/` when XDG_DATA_HOME is set to an absolute
path (the specification says a relative one is to be ignored), else `~/.local/share/edgetpu-serve/`. The Docker
images set the path themselves (/var/lib/edgetpu-serve, on a volume).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

APP_DIR_NAME = "edgetpu-serve"
GALLERY_FILE_NAME = "faces.db"
IMAGE_DATA_DIR = Path("/var/lib/edgetpu-serve")  # what the Docker images use (on a volume)


def default_data_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The service's data directory on this host, by the XDG rule above (`environ`: os.environ unless given)."""
    environ = os.environ if environ is None else environ
    xdg = environ.get("XDG_DATA_HOME", "")
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / APP_DIR_NAME
    home = environ.get("HOME") or str(Path.home())
    return Path(home) / ".local" / "share" / APP_DIR_NAME


def default_gallery_path(environ: Mapping[str, str] | None = None) -> Path:
    """The face gallery's file in the default data directory."""
    return default_data_dir(environ) / GALLERY_FILE_NAME
