"""bench/face_gallery.py runs, briefly, and prints its table: it must not rot. No timing is asserted."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT


def test_the_bench_runs_and_prints_its_rows(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "face_gallery.py"), "--people", "60", "--rounds", "20",
                           "--photos", "4", "--dir", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("face gallery search, 60 people")
    rows = [line.split() for line in lines[2:6]]
    assert [(row[0], row[2], row[4], row[5]) for row in rows] == [
        ("60", "1", "128", "60"), ("60", "1", "512", "60"), ("60", "3", "128", "180"), ("60", "3", "512", "180")]
    assert all(float(value) > 0 for row in rows for value in row[6:])
    assert lines[6].startswith("target: a search of 60 people")
    assert lines[7].startswith("registration, 4 photos") and "p50" in lines[8] and "4 photos in" in lines[10]
    assert list(tmp_path.iterdir()) == []  # its gallery removed
