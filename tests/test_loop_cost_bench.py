"""bench/loop_cost.py runs: the in-process event-loop cost of refusals, printed as a table."""

import subprocess
import sys

from tests.conftest import ROOT


def test_loop_cost_prints_a_figure_per_scenario():
    out = subprocess.run([sys.executable, "bench/loop_cost.py", "--rounds", "1", "-n", "30",
                          "--only", "v1 classify 503,v2 infer 503"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {line[:18].strip(): float(line.split()[-1]) for line in out.stdout.splitlines()
            if line.startswith(("v1 ", "v2 "))}
    assert set(rows) == {"v1 classify 503", "v2 infer 503"}, out.stdout
    assert all(0 < ms < 50 for ms in rows.values()), out.stdout
