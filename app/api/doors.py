"""The HTTP front doors, in one place and in the order a request is matched against their routes.

Each door is a router of its protocol's routes, whose route class (app/api/routes.py DoorRoute) declares their
checks, their failures' answer and, for the routes that run models, their protocol and task. The app includes them
first, and the table of their routes in front of FastAPI's router is made from them (app/api/routes.py
InferenceRoutes), so the order here is the order of routing:
  - the native routes first, one pair per task, made from the task list (app/api/native.py): a new task adds none;
  - OIP v2's infer routes, then CodeProject.AI's list before DeepStack's routes (its /v1/vision/custom/list would
    otherwise be taken for a model named "list" by /v1/vision/custom/{name}), then DOODS';
  - then the routers added from outside before an app is created (`add`: a test's throwaway door).
"""

from __future__ import annotations

from fastapi import APIRouter

from app.api import codeproject, deepstack, doods, native
from app.api.v2 import router as v2

_ADDED: list[APIRouter] = []


def inference_routers() -> list[APIRouter]:
    """Every door's router, in routing order (see module); the native routes made now, from the tasks registered."""
    return [native.router(), v2.inference, codeproject.router, deepstack.router, doods.router, *_ADDED]


def add(router: APIRouter) -> None:
    """A door's router from outside app/api, for the apps created from now on (after the others)."""
    _ADDED.append(router)


def remove(router: APIRouter) -> None:
    if router in _ADDED:
        _ADDED.remove(router)
