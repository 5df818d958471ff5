"""The pools of interpreters, one per (model, backend): admission to a bounded line, dispatch
to the interpreters' threads, and the watchdog that takes a hung device out and re-creates it."""

from app.pool.admission import OVERLOAD_HOLD_S, Admission
from app.pool.dispatch import EnginePool, Place
from app.pool.member import Member, RunResult
from app.pool.watchdog import Watchdog

__all__ = ["OVERLOAD_HOLD_S", "Admission", "EnginePool", "Member", "Place", "RunResult", "Watchdog"]
