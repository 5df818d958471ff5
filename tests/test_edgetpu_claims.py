"""Which TPUs each of several processes sharing a host claims (app/edgetpu/claims.py): the rule, on plain
lists of TPUs; then the Edge TPU plug-in with it, in registries on the libedgetpu TEST DOUBLE. The
"processes" here are Claims objects (registries) of this process: a claim is a flock on its own open file,
which another open of the same file in the same process cannot take either, as in another process. Over a
real socket with worker processes: tests/test_processes.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.edgetpu.claims import Claims, fair_share, try_lock
from app.edgetpu.delegate import Target
from app.edgetpu.errors import EdgeTpuUnavailable
from app.edgetpu.library import Device
from app.settings import DeviceShare
from tests.conftest import DEFAULT_MODEL
from tests.doubles.edgetpu_models import plain_as_compiled
from tests.doubles.libedgetpu import libedgetpu_double, pci_tpu, plugged_tpus  # noqa: F401
from tests.test_edgetpu_hotplug import Served, segmented_as_compiled


def tpus(*names: str) -> list[Target]:
    """The TPUs listed now, in libedgetpu's order (their ':N' follows it)."""
    return [Target(f":{i}", Device("pci", f"/dev/{name}"), i) for i, name in enumerate(names)]


def names(targets: list[Target]) -> list[str]:
    return [t.device.path.removeprefix("/dev/") for t in targets]


def group(tmp_path, count: int, unit: int = 1) -> list[Claims]:
    return [Claims(tmp_path, DeviceShare(i, count), unit) for i in range(count)]


def started(tmp_path) -> tuple[Claims, Claims, list[Target]]:
    """Two processes on four TPUs, each holding its two: a has apex_0 and apex_1, b apex_2 and apex_3."""
    a, b = group(tmp_path, 2)
    listed = tpus("apex_0", "apex_1", "apex_2", "apex_3")
    a.choose(listed), b.choose(listed)
    return a, b, listed


@pytest.mark.parametrize("present, processes, unit, fair", [
    (4, 2, 1, 2), (5, 2, 1, 3), (3, 2, 1, 2), (1, 2, 1, 1), (0, 2, 1, 0), (2, 3, 1, 1),
    (6, 2, 3, 3), (7, 2, 3, 3), (4, 2, 3, 3), (2, 2, 3, 0), (8, 3, 2, 4),
])
def test_the_fair_share_is_an_even_part_in_whole_sets(present, processes, unit, fair):
    assert fair_share(present, processes, unit) == fair


def test_processes_started_together_split_the_tpus_as_contiguous_shares(tmp_path):
    a, b = group(tmp_path, 2)
    listed = tpus("apex_0", "apex_1", "apex_2", "apex_3")
    assert names(b.choose(listed)) == ["apex_2", "apex_3"]  # whichever starts first takes its own share
    assert names(a.choose(listed)) == ["apex_0", "apex_1"]
    assert names(a.choose(listed)) == ["apex_0", "apex_1"] and names(b.choose(listed)) == ["apex_2", "apex_3"]


def test_a_process_claims_no_more_than_its_fair_share_whoever_is_up(tmp_path):
    a, b = group(tmp_path, 2)
    listed = tpus("apex_0", "apex_1", "apex_2", "apex_3")
    assert names(a.choose(listed)) == ["apex_0", "apex_1"]  # b not started yet: a leaves it half
    assert names(a.choose(listed)) == ["apex_0", "apex_1"]
    assert names(b.choose(listed)) == ["apex_2", "apex_3"]


def test_a_tpu_unplugged_and_plugged_back_returns_to_its_process_and_the_counts_even_out(tmp_path):
    a, b, listed = started(tmp_path)
    without = tpus("apex_1", "apex_2", "apex_3")  # apex_0 unplugged: the others' indices move
    assert names(a.choose(without)) == ["apex_1"] and names(b.choose(without)) == ["apex_2", "apex_3"]
    assert a.held == {"/dev/apex_1"}  # nothing open on it here: let go at once
    assert names(b.choose(listed)) == ["apex_2", "apex_3"]  # b sees it back first: at its fair share already
    assert names(a.choose(listed)) == ["apex_0", "apex_1"]
    fifth = tpus("apex_0", "apex_1", "apex_2", "apex_3", "apex_4")
    assert names(b.choose(fifth)) == ["apex_2", "apex_3", "apex_4"]  # 5 TPUs: 3 each at most, first come
    assert names(a.choose(fifth)) == ["apex_0", "apex_1"]


def test_a_free_tpu_is_left_to_its_last_holder_while_that_one_holds_fewer_than_its_share(tmp_path):
    a, b, listed = started(tmp_path)
    a.choose(tpus("apex_1", "apex_3")), b.choose(tpus("apex_1", "apex_3"))  # one of each unplugged
    assert a.held == {"/dev/apex_1"} and b.held == {"/dev/apex_3"}
    back = tpus("apex_0", "apex_1", "apex_3")  # a's comes back: b, below its share, sees it first
    assert names(b.choose(back)) == ["apex_3"]  # left to a
    assert names(a.choose(back)) == ["apex_0", "apex_1"]
    # a dead process's TPUs wait for its replacement, in the same slot
    a.close()
    replacement = Claims(tmp_path, DeviceShare(0, 2))
    assert names(b.choose(listed)) == ["apex_2", "apex_3"]
    assert names(replacement.choose(listed)) == ["apex_0", "apex_1"]


def test_a_tpu_unplugged_is_let_go_only_once_its_interpreters_are_closed(tmp_path):
    a, b, listed = started(tmp_path)
    closed = a.open("/dev/apex_0")  # an interpreter on it, still open (its request's invoke under way, say)
    a.choose(tpus("apex_1", "apex_2", "apex_3"))
    with pytest.raises(EdgeTpuUnavailable, match="not this process's"):
        a.open("/dev/apex_0")  # gone: nothing new is opened on it
    b.choose(tpus("apex_0", "apex_1", "apex_2", "apex_3"))  # apex_0 back, and b sees it first: still a's
    assert try_lock(a.file("/dev/apex_0")) is None and a.held == {"/dev/apex_0", "/dev/apex_1"}
    assert names(a.choose(listed)) == ["apex_0", "apex_1"]  # back: a's again, its interpreter never closed
    a.choose(tpus("apex_1", "apex_2", "apex_3"))
    closed()
    closed()  # counted once
    assert a.held == {"/dev/apex_1"}
    fd = try_lock(a.file("/dev/apex_0"))
    assert fd is not None  # free: the kernel's lock is released
    os.close(fd)


def test_a_process_opens_only_what_it_holds(tmp_path):
    a, b = group(tmp_path, 2)
    listed = tpus("apex_0", "apex_1")
    a.choose(listed), b.choose(listed)
    a.open("/dev/apex_0")()
    with pytest.raises(EdgeTpuUnavailable):
        a.open("/dev/apex_1")


def test_more_processes_than_tpus_leave_the_last_without_until_one_is_plugged_in(tmp_path):
    a, b, c = group(tmp_path, 3)
    listed = tpus("apex_0", "apex_1")
    assert [names(p.choose(listed)) for p in (a, b, c)] == [["apex_0"], ["apex_1"], []]
    assert c.present == 2
    more = tpus("apex_0", "apex_1", "apex_2")
    assert names(a.choose(more)) == ["apex_0"]  # at its share (1 of 3) already
    assert names(c.choose(more)) == ["apex_2"]


def test_a_pipelines_tpus_are_claimed_as_a_set_and_a_broken_set_completed_first(tmp_path):
    a, b = group(tmp_path, 2, unit=2)
    listed = tpus("apex_0", "apex_1", "apex_2", "apex_3")
    assert names(a.choose(listed)) == ["apex_0", "apex_1"] and names(b.choose(listed)) == ["apex_2", "apex_3"]
    three = tpus("apex_0", "apex_2", "apex_3")  # apex_1 unplugged: a's set broken
    assert names(a.choose(three)) == ["apex_0"] and names(b.choose(three)) == ["apex_2", "apex_3"]
    assert names(b.choose(listed)) == ["apex_2", "apex_3"]
    assert names(a.choose(listed)) == ["apex_0", "apex_1"]  # completed
    # 3 TPUs, sets of 2: one set; the other process waits for two free at once
    (tmp_path / "other").mkdir()
    c, d = group(tmp_path / "other", 2, unit=2)
    three = tpus("x_0", "x_1", "x_2")
    assert names(d.choose(three)) == ["x_0", "x_2"] and names(c.choose(three)) == []
    assert names(c.choose(tpus("x_0", "x_1", "x_2", "x_3"))) == ["x_1", "x_3"]  # a whole set free: taken


def test_the_claim_file_names_its_holder_and_is_released_by_the_kernel(tmp_path):
    (a,) = group(tmp_path, 1)
    a.choose(tpus("apex_0"))
    text = a.file("/dev/apex_0").read_text().split()
    assert text[0] == "0" and text[2] == "/dev/apex_0"
    assert try_lock(a.file("/dev/apex_0")) is None
    a.close()
    fd = try_lock(a.file("/dev/apex_0"))
    assert fd is not None
    os.close(fd)


# ---- the plug-in as one of several processes: registries on the libedgetpu TEST DOUBLE -------------------
# Each Served is a registry with the Edge TPU plug-in as one worker of a group would have it (DEVICE_SHARE,
# DEVICE_CLAIMS_DIR), its probe on a fake clock: a test runs each one's probe round in the order it chooses.

def worker(tmp_path, library, slot: int, count: int, models, name: str = DEFAULT_MODEL, policy: str = "fallback"):
    return Served(tmp_path, library, policy=policy, models=models, name=name,
                  core={"device_share": DeviceShare(slot, count), "device_claims_dir": tmp_path})


def served_on(served) -> list[str]:
    return [Path(t.device.path).name for t in served.plugin.inventory.in_service]


def test_a_worker_without_a_tpu_serves_on_the_cpu_and_takes_one_plugged_in(tmp_path, plugged_tpus, libedgetpu_double):
    models = plain_as_compiled(tmp_path / "models")
    plugged_tpus.plug(pci_tpu(tmp_path, 0))
    first = worker(tmp_path, libedgetpu_double, 0, 2, models)
    second = worker(tmp_path, libedgetpu_double, 1, 2, models)
    try:
        assert served_on(first) == ["apex_0"] and served_on(second) == []
        assert first.status().state == "ready"
        status = second.status()
        assert status.state == "degraded" and [a[0] for a in second.requests(2)] == ["cpu", "cpu"]
        assert ("none of the 1 Edge TPU(s) listed is this process's: 2 processes share 1 usable TPU(s); the others "
                "hold them, and a TPU is opened by one process only. Fix: at most 1 process(es)") in status.error
        assert "claims them once they are freed or plugged in" in status.error
        plugged_tpus.plug(pci_tpu(tmp_path, 1))
        first.one_interval()  # at its share already (one of two)
        second.one_interval()
        assert served_on(first) == ["apex_0"] and served_on(second) == ["apex_1"]
        assert second.status().state == "ready" and [a[0] for a in second.requests(2)] == ["edgetpu", "edgetpu"]
    finally:
        second.close()
        first.close()


def test_with_fail_a_worker_without_a_tpu_stops_the_start_saying_how_many_fit(tmp_path, plugged_tpus,
                                                                               libedgetpu_double):
    models = plain_as_compiled(tmp_path / "models")
    plugged_tpus.plug(pci_tpu(tmp_path, 0), pci_tpu(tmp_path, 1))
    served = [worker(tmp_path, libedgetpu_double, i, 3, models, policy="fail") for i in range(2)]
    try:
        with pytest.raises(EdgeTpuUnavailable, match=r"3 processes share 2 usable TPU\(s\); .* Fix: at most 2 "
                                                     r"process\(es\) \(EDGETPU_SERVE_PROCESSES"):
            worker(tmp_path, libedgetpu_double, 2, 3, models, policy="fail")
    finally:
        for s in served:
            s.close()


def test_a_pipelines_tpus_are_one_workers_and_a_worker_takes_a_whole_set_once_there_is_one(
        tmp_path, plugged_tpus, libedgetpu_double):
    name = segmented_as_compiled(tmp_path, 2)
    plugged_tpus.plug(*(pci_tpu(tmp_path, i) for i in range(3)))
    first = worker(tmp_path, libedgetpu_double, 0, 2, tmp_path / "models", name)
    second = worker(tmp_path, libedgetpu_double, 1, 2, tmp_path / "models", name)
    try:
        assert served_on(first) == ["apex_0", "apex_1"] and served_on(second) == []
        (pipeline,) = first.pool().members
        assert [Path(s.device).name for s in pipeline.stages] == ["apex_0", "apex_1"]
        assert ("2 processes share 3 usable TPU(s), in sets of 2 for a model in 2 segments (a pipeline's TPUs are in "
                "one process); the others hold them") in second.status().error
        assert "Fix: at most 1 process(es)" in second.status().error
        plugged_tpus.plug(pci_tpu(tmp_path, 3))
        second.one_interval()
        assert served_on(second) == ["apex_2", "apex_3"] and second.status().state == "ready"
        assert [a[0] for a in second.requests(2)] == ["edgetpu", "edgetpu"]
    finally:
        second.close()
        first.close()
