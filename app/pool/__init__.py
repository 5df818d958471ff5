"""The pools, one per (model, backend). `EnginePool` (engine_pool.py) is the one owner of a pool's lock, members and
their health; its parts know nothing of it: the line, a queue with admission counts (line.py, admission.py), the
lanes, each a loop on one member that returns what happened (lane.py), and each request's deadlines (deadlines.py).
The members (member.py: an interpreter of a whole model; pipeline.py: one interpreter per segment) and the watchdog
that takes a hung device out and re-creates it (watchdog.py) complete it. A request runs through a `Place` in line.
"""

from app.pool.admission import OVERLOAD_HOLD_S
from app.pool.engine_pool import EnginePool, Place, departed_problem
from app.pool.job import Inputs
from app.pool.member import InterpreterMember, Member, Members, RunResult, Stage
from app.pool.pipeline import Pipeline
from app.pool.watchdog import Watchdog

__all__ = ["OVERLOAD_HOLD_S", "EnginePool", "Inputs", "InterpreterMember", "Member", "Members", "Pipeline", "Place",
           "RunResult", "Stage", "Watchdog", "departed_problem"]
