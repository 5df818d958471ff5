"""The inventory of TPUs, listed again while the service runs: TPUs that join and leave, a spec waiting for
its TPU, a TPU listed but not openable, the process's own choice among them, an invoke asking whether its
TPU is gone; and the probe's thread, driven by a fake clock (no test waits for time to pass).

libedgetpu is the TEST DOUBLE, its list of TPUs a file the tests rewrite (PluggedTpus)."""

from __future__ import annotations

import threading


from app.edgetpu.inventory import Change, Inventory, Prober
from app.edgetpu.library import EdgeTpuLibrary
from tests.doubles.clock import FakeClock
from tests.doubles.libedgetpu import libedgetpu_double, pci_tpu, plugged_tpus  # noqa: F401

EVENTUALLY_S = 10



def paths(targets) -> list[str]:
    return [t.device.path for t in targets]


def test_tpus_join_and_leave_as_they_are_listed(tmp_path, plugged_tpus, libedgetpu_double):
    inventory = Inventory(EdgeTpuLibrary(str(libedgetpu_double)), [], lambda found: found)
    assert inventory.take() == Change() and inventory.in_service == []
    plugged_tpus.plug(pci_tpu(tmp_path, 0))
    change = inventory.take()
    assert paths(change.joined) == [str(tmp_path / "apex_0")] and change.left == ()
    plugged_tpus.plug(pci_tpu(tmp_path, 1))
    assert paths(inventory.take().joined) == [str(tmp_path / "apex_1")]
    assert not inventory.take()  # nothing changed
    plugged_tpus.unplug(pci_tpu(tmp_path, 0))
    change = inventory.take()
    assert paths(change.left) == [str(tmp_path / "apex_0")] and change.joined == ()
    (remaining,) = inventory.in_service
    assert (remaining.device.path, remaining.spec) == (str(tmp_path / "apex_1"), ":0")  # its index moved
    assert inventory.counts.probes == {"unchanged": 2, "changed": 3, "failed": 0}
    assert inventory.counts.changes == {"joined": 2, "left": 1}
    assert inventory.last_probe_at is not None


def test_a_requested_tpu_not_there_yet_is_waited_for(tmp_path, plugged_tpus, libedgetpu_double):
    plugged_tpus.plug(pci_tpu(tmp_path, 0))
    inventory = Inventory(EdgeTpuLibrary(str(libedgetpu_double)), ["pci:0", "pci:1"], lambda found: found)
    inventory.take()
    assert paths(inventory.in_service) == [str(tmp_path / "apex_0")] and inventory.waiting_for == ["pci:1"]
    plugged_tpus.plug(pci_tpu(tmp_path, 1))
    assert paths(inventory.take().joined) == [str(tmp_path / "apex_1")] and inventory.waiting_for == []


def test_a_tpu_listed_but_not_openable_is_refused_with_the_fix_until_it_is(tmp_path, plugged_tpus, libedgetpu_double):
    node = tmp_path / "dev" / "apex_0"
    plugged_tpus.plug(f"pci:{node}")  # listed, but its node's directory is missing here
    inventory = Inventory(EdgeTpuLibrary(str(libedgetpu_double)), [], lambda found: found)
    inventory.take()
    assert inventory.in_service == []
    assert "does not exist here. Fix: " in inventory.refused[str(node)]
    node.parent.mkdir()
    node.touch()
    assert paths(inventory.take().joined) == [str(node)] and inventory.refused == {}


def test_the_process_serves_on_the_tpus_its_one_choice_gives(tmp_path, plugged_tpus, libedgetpu_double):
    """`choose` is the plug-in's one place for a share of the host's TPUs: it applies to every listing."""
    plugged_tpus.plug(pci_tpu(tmp_path, 0), pci_tpu(tmp_path, 1))
    inventory = Inventory(EdgeTpuLibrary(str(libedgetpu_double)), [], lambda found: found[1:])
    inventory.take()
    assert paths(inventory.in_service) == [str(tmp_path / "apex_1")]
    plugged_tpus.plug(pci_tpu(tmp_path, 2))
    assert paths(inventory.take().joined) == [str(tmp_path / "apex_2")]


def test_an_invoke_that_failed_asks_whether_its_tpu_is_gone_and_wakes_the_probe(
        tmp_path, plugged_tpus, libedgetpu_double):
    plugged_tpus.plug(pci_tpu(tmp_path, 0))
    inventory = Inventory(EdgeTpuLibrary(str(libedgetpu_double)), [], lambda found: found)
    woken = threading.Event()
    inventory.wake = woken.set
    inventory.take()
    assert not inventory.gone(str(tmp_path / "apex_0")) and not woken.is_set()
    plugged_tpus.unplug(pci_tpu(tmp_path, 0))
    assert inventory.gone(str(tmp_path / "apex_0")) and woken.is_set()


def test_a_listing_that_fails_keeps_what_is_in_service_and_is_counted(tmp_path, plugged_tpus, libedgetpu_double):
    plugged_tpus.plug(pci_tpu(tmp_path, 0))
    inventory = Inventory(EdgeTpuLibrary(str(libedgetpu_double)), [":0", "pci:0"], lambda found: found)
    assert not inventory.take()  # two specs naming one TPU: the listing cannot be used
    assert "name the same Edge TPU" in inventory.error and inventory.counts.probes["failed"] == 1


def test_the_probe_runs_a_round_each_interval_of_its_clock_and_when_woken():
    clock = FakeClock()
    ran = []
    prober = Prober(2.0, lambda: ran.append(clock()), clock=clock)
    prober.start()
    try:
        clock.advance(2.0)
        prober.poke()
        assert prober.wait_rounds(1, EVENTUALLY_S) and ran == [1002.0]
        clock.advance(2.0)
        prober.poke()
        assert prober.wait_rounds(2, EVENTUALLY_S) and ran == [1002.0, 1004.0]
        prober.wake()  # an invoke found its TPU gone: a round now, the clock unmoved
        assert prober.wait_rounds(3, EVENTUALLY_S) and ran[-1] == 1004.0
    finally:
        assert prober.stop(EVENTUALLY_S)


def test_a_round_that_fails_does_not_end_the_probe():
    clock = FakeClock()
    calls = []

    def probe_round():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("boom")

    prober = Prober(1.0, probe_round, clock=clock)
    prober.start()
    try:
        prober.wake()
        assert prober.wait_rounds(1, EVENTUALLY_S)
        prober.wake()
        assert prober.wait_rounds(2, EVENTUALLY_S) and len(calls) == 2
    finally:
        assert prober.stop(EVENTUALLY_S) and prober.stopped
