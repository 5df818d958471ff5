"""The pools, one per (model, backend): admission to a bounded line and each request's deadlines (line.py),
the members' threads (lanes.py), members joining and leaving (membership.py), composed by `EnginePool`
(engine_pool.py); the members (member.py: an interpreter of a whole model; pipeline.py: one interpreter per
segment), and the watchdog that takes a hung device out and re-creates it (watchdog.py)."""

from app.pool.admission import OVERLOAD_HOLD_S, Admission
from app.pool.engine_pool import EnginePool
from app.pool.line import Place
from app.pool.member import InterpreterMember, Member, RunResult, Stage
from app.pool.membership import departed_problem
from app.pool.pipeline import Pipeline
from app.pool.watchdog import Watchdog

__all__ = ["OVERLOAD_HOLD_S", "Admission", "EnginePool", "InterpreterMember", "Member", "Pipeline", "Place",
           "RunResult", "Stage", "Watchdog", "departed_problem"]
