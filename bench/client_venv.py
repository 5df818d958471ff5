"""Virtual environments for client tools whose dependencies must not enter the service's venv.

Made once under .cache/venvs/NAME (gitignored) and reused while their requirements stay the
same. With `share=True` the new venv also sees the current venv's packages (a .pth file), so
pip installs only what is missing there: the KServe client then costs ~45 s and ~250 MB
once instead of ~2 min and ~450 MB. Without it the venv stands alone (perf_analyzer's
tritonclient pins numpy 1.26, which must not shadow the service's numpy 2).
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENVS = ROOT / ".cache" / "venvs"


def ensure_venv(name: str, requirements: list[str], share: bool = False) -> Path:
    """The venv's python, creating the venv first if it is missing or was made for other requirements."""
    venv = VENVS / name
    python = venv / "bin" / "python"
    stamp = venv / "requirements.done"
    wanted = "\n".join([*requirements, f"share={share}"])
    if stamp.exists() and stamp.read_text() == wanted and python.exists():
        return python
    subprocess.run([sys.executable, "-m", "venv", "--clear", *(["--without-pip"] if share else []), str(venv)],
                   check=True)
    if share:
        site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              check=True, capture_output=True, text=True).stdout.strip()
        Path(site, "shared-venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *requirements],
                   check=True)
    stamp.write_text(wanted)
    return python
