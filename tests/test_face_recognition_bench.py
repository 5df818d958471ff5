"""bench/face_recognition.py runs end to end at a tiny size and prints its table: it must not rot. No timing is
asserted; what is asserted is what the run did: the tests' models served by the service's core on both backends,
every registered person's photo's one face found, embedded and named as its person by both galleries, the
strangers' searched too, and the registrations made."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.conftest import ROOT


def test_the_bench_recognizes_and_registers_and_prints_its_rows(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "face_recognition.py"), "--people", "40",
                           "--rounds", "6", "--photos", "3", "--backends", "cpu,emulated", "--dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if not line.startswith("INFO")]
    assert re.match(r"face recognition on core \d+, 40 people, 6 photos a backend", lines[0])
    rows = lines[2:12]
    assert [row.split()[0] for row in rows] == ["cpu"] * 5 + ["emulated"] * 5
    for backend in (rows[:5], rows[5:]):
        assert "detect + embed" in backend[0] and float(backend[0].split()[-2]) > 0
        searches = [(faces, kind) for faces in (1, 3) for kind in ("registered", "stranger")]
        for (faces, kind), row in zip(searches, backend[1:]):
            assert f"+ search, {faces} face(s), {kind}" in row and "(40 people)" in row
            # each registered person's photo: its one face, named as its person (3 rounds of 6)
            assert re.search(r" 3/3 " if kind == "registered" else r" - ", row), row
    assert lines[12].startswith("registration, 3 photos (one face each) on cpu")
    steps = [line.split()[0] for line in lines[13:19]]
    assert steps == ["detect", "decode", "cut_region", "embed", "register", "per"]
    assert lines[19].strip().startswith("3 photos in")
    assert list(tmp_path.iterdir()) == []  # its gallery removed
