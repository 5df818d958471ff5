"""bench/perf_analyzer.py end to end, briefly: Triton's perf_analyzer really runs against /v2 and
the table has every column. Figures are not asserted (they belong to the benchmark). Needs Debian's
libb64-0d; the script makes its perf_analyzer venv on first use (~1 min, once per checkout)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ROOT


def test_perf_analyzer_against_v2_beside_the_native_api():
    """The script starts and stops its own service (the README's command), as it does without --url."""
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "perf_analyzer.py"), "--workers", "1",
                           "--concurrency", "1:1", "--interval", "1000", "--json",
                           "--stability", "100"],  # any window will do: this checks the plumbing
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert "perf_analyzer req/s" in lines[1] and "v1 jpeg req/s" in lines[1]
    row = json.loads(lines[-1])[0]
    assert row["perf_analyzer"]["rps"] > 0 and row["perf_analyzer"]["p50"] > 0
    for column in ("v2 tensor", "v2 jpeg", "v1 jpeg"):
        assert row[column]["requests"] > 0 and row[column]["errors"] == 0, row
