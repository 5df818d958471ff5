"""bench/face_gallery.py runs, briefly, and prints its table: it must not rot. No timing is asserted; every
search's answer is checked against the exhaustive one in the bench itself, and must be."""

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
    rows = [line.split() for line in lines[2:14]]
    expected = [(kind, dim, query) for kind in ("1 face", "3 faces, alike", "3 faces, unrelated")
                for dim in ("128", "512") for query in ("registered", "stranger")]
    found = [(" ".join(row[:-9]), row[-9], row[-7]) for row in rows]
    assert found == expected
    assert [row[-8] for row in rows] == ["60"] * 4 + ["180"] * 8
    assert all(float(value) > 0 for row in rows for value in row[-6:-2])
    assert all(row[-1] == "yes" for row in rows)  # every answer the exhaustive search's
    assert lines[14].startswith("read again after a commit: 1 face 128:")
    assert len([line for line in lines[15:21] if line.startswith("target: 60 people")]) == 6
    assert lines[21].startswith("registration, 4 photos") and "p50" in lines[22] and "4 photos in" in lines[24]
    assert list(tmp_path.iterdir()) == []  # its gallery removed
