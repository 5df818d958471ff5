"""One request through a pool's public surface, as a ticket makes one (app/registry/tickets.py): a place in line
(`EnginePool.admit`, Busy at once when the line is full), every input tensor through it (`Place.run`), the place
given back however the run ends."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from app.pool import EnginePool, RunResult


async def run_in(pool: EnginePool, inputs: Sequence[np.ndarray]) -> RunResult:
    with pool.admit() as place:
        return await place.run(inputs)
