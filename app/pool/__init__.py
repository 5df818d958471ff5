"""The pools, one per (model, backend): admission to a bounded line, dispatch to the members' threads
(an interpreter, or a pipeline of segments), and the watchdog that takes a hung device out and
re-creates it."""

from app.pool.admission import OVERLOAD_HOLD_S, Admission
from app.pool.dispatch import EnginePool, Place, departed_problem
from app.pool.member import InterpreterMember, Member, RunResult, Stage
from app.pool.pipeline import Pipeline
from app.pool.watchdog import Watchdog

__all__ = ["OVERLOAD_HOLD_S", "Admission", "EnginePool", "InterpreterMember", "Member", "Pipeline", "Place",
           "RunResult", "Stage", "Watchdog", "departed_problem"]
