"""How many threads numpy's BLAS may use: a per-process setting, so the emulator sets it once.

The emulator's matrix products are many and small (a 224x224 model makes ~50 of 1-15 MFLOP).
OpenBLAS's threads cost more than they give there: EfficientNet-Lite0 took 540 ms per inference
with 2 BLAS threads on a 2-core machine and 48 ms with 1. OpenBLAS has one thread count per
process (not per calling thread), so it cannot be scoped to an invoke without racing other
interpreters; Interpreter(num_threads=n) sets it for the process, through threadpoolctl.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


class ProcessBlas:
    """The BLAS thread count this process was last set to. Module state, because OpenBLAS's count is the process's."""

    threads: int | None = None


THIS_PROCESS = ProcessBlas()


def limit_blas_threads(threads: int) -> None:
    """Set every loaded BLAS library to `threads` threads (a repeated call with the same count is free)."""
    if threads == THIS_PROCESS.threads:
        return
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        log.warning("threadpoolctl is not installed: numpy's BLAS keeps its own thread count, "
                    "which can make the emulator several times slower")
        return
    threadpool_limits(limits=threads, user_api="blas")
    THIS_PROCESS.threads = threads
