"""What the repository holds: source and data with their recipes, never a build input nobody can review (a
wheel, an archive), which pip or the image build must take from the package index by name instead."""

from __future__ import annotations

import subprocess

from tests.conftest import ROOT

ARCHIVES = (".whl", ".zip", ".tar.gz", ".tgz", ".egg")


def test_no_wheel_or_archive_is_committed():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    assert files, "not a git checkout: the tests run in one (CI runs .ci/run in a clean checkout)"
    assert [name for name in files if name.endswith(ARCHIVES)] == []
