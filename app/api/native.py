"""The native routes, made from the task list: for every task (app/tasks TASKS), POST /v1/VERB with the task's
default model and POST /v1/models/{name}/VERB with a named one (/v1/classify, /v1/detect, /v1/segment, /v1/pose).

Each takes the image as the body (multipart field `image`, or raw), the task's options as query parameters (the
fields of its options dataclass, with their constraints and descriptions; a bound that is a setting, `AtMost`,
checked against it), `backend`, and `format` where the task has other forms than JSON (segmentation's PNG). It
answers the task's result in the one envelope, as JSON (`Answer.json`) documented by the schema made from the same
types (`answer_schema`), or in the form asked for, made off the event loop, the envelope in headers (X-Model,
X-Backend, X-Timing-Ms with the form's own time). The hold (the model version, the room check) comes before the
body is read, so a full line answers 503 at once; the place in line once the body is here (app/api/held.py).

A new task is its module in app/tasks/: its routes, their OpenAPI description and their place in the table of
inference routes (app/api/routes.py: shed, counted, admitted) come from its declaration, and nothing here names it.
"""

from __future__ import annotations

import dataclasses
import inspect
import time
import typing
from collections.abc import Callable
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Query, Request, Response
from pydantic.fields import FieldInfo
from starlette.concurrency import run_in_threadpool

from app.api.auth import check_inference_key
from app.api.body import OPENAPI_REQUEST_BODY
from app.api.deps import door_of
from app.api.held import answer_image
from app.api.routes import BACKEND_PARAMETER, MODEL_PARAMETER, BackendQuery, DoorRoute, Inference
from app.api.schemas import V1_ERRORS
from app.errors import InvalidParameter
from app.tasks import TASKS, Answer, Task
from app.tasks.results import AtMost, Render, answer_schema, wire_fields

FORMAT_PARAMETER = "format"
JSON = "json"


class NativeRoute(DoorRoute):
    """The native routes: the inference key checked first. Each task's routes are inference routes of protocol
    "v1" of a class of their own (`route_class`)."""

    checks = (check_inference_key,)


def router() -> APIRouter:
    """The native routes of the tasks registered now, in their order."""
    made = APIRouter(prefix="/v1")
    for task in TASKS.values():
        route_class = type(f"{task.verb.capitalize()}Route", (NativeRoute,), {"inference": Inference("v1", task)})
        schema = answer_schema(task.result, f"{task.verb.capitalize()}Response")
        responses = {**V1_ERRORS, 200: _renders(task.renders)} if task.renders else V1_ERRORS
        for named in (False, True):
            made.add_api_route(
                f"/models/{{{MODEL_PARAMETER}}}/{task.verb}" if named else f"/{task.verb}", endpoint(task, named),
                methods=["POST"], route_class_override=route_class, tags=[task.verb], response_model=schema,
                responses=responses, openapi_extra=OPENAPI_REQUEST_BODY,
                summary=f"{task.summary} with {'a named' if named else 'the default'} {task.name} model")
    return made


def endpoint(task: Task, named: bool) -> Callable:
    """The route's handler, its signature the route's parameters (what FastAPI documents and the table in front
    reads): the model's name in the path when `named`, then the task's options, `backend` and `format`."""
    options = option_parameters(task.options)
    bounds = [(name, bound.setting) for name, bound in option_bounds(task.options)]
    renders = task.renders

    async def answer(request: Request, **query: Any) -> Response:
        name = query.pop(MODEL_PARAMETER, None)
        backend = query.pop(BACKEND_PARAMETER)
        form = query.pop(FORMAT_PARAMETER, JSON)
        if bounds:
            settings = door_of(request).settings
            for option, setting in bounds:
                if query[option] > (limit := getattr(settings, setting)):
                    raise InvalidParameter(f"{option} is {query[option]}; at most {limit} "
                                           f"(EDGETPU_SERVE_{setting.upper()})")
        answered = await answer_image(request, task, name, backend, task.options(**query))
        if form == JSON:
            return Response(answered.json(), media_type="application/json")
        return await rendered(answered, form, renders[form])

    parameters = [inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Request)]
    if named:
        parameters.insert(0, inspect.Parameter(MODEL_PARAMETER, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                               annotation=str))
    parameters += [inspect.Parameter(option, inspect.Parameter.KEYWORD_ONLY, annotation=hint, default=default)
                   for option, hint, default in options]
    parameters.append(inspect.Parameter(BACKEND_PARAMETER, inspect.Parameter.KEYWORD_ONLY, annotation=BackendQuery,
                                        default=None))
    if renders:
        forms = Literal[(JSON, *renders)]  # type: ignore[valid-type]
        described = "; ".join([f"{JSON}: the answer as JSON", *(f"{f}: {r.description}" for f, r in renders.items())])
        parameters.append(inspect.Parameter(FORMAT_PARAMETER, inspect.Parameter.KEYWORD_ONLY, default=JSON,
                                            annotation=Annotated[forms, Query(description=described)]))
    answer.__signature__ = inspect.Signature(parameters, return_annotation=Response)
    answer.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": Response}
    answer.__name__ = answer.__qualname__ = f"{task.verb}_{'named' if named else 'default'}"
    doc = " ".join((task.result.__doc__ or "").split("\n\n")[0].split())
    answer.__doc__ = (f"The image as the body: multipart field `image`, or raw. The answer: {doc} With the model, the "
                      "backend that ran it, the timings (`timing_ms`), the warm-up and `cold`.")
    return answer


def option_parameters(options: type) -> list[tuple[str, Any, Any]]:
    """The options a request may set, as query parameters: (name, annotation, default), every field of the
    options dataclass but those off the wire; a bound that is a setting (AtMost) left to the handler."""
    hints = typing.get_type_hints(options, include_extras=True)
    wire = set(wire_fields(options))
    return [(f.name, _without_bounds(hints[f.name]), f.default) for f in dataclasses.fields(options) if f.name in wire]


def option_bounds(options: type) -> list[tuple[str, AtMost]]:
    hints = typing.get_type_hints(options, include_extras=True)
    return [(name, meta) for name in wire_fields(options) if typing.get_origin(hints[name]) is Annotated
            for meta in typing.get_args(hints[name])[1:] if isinstance(meta, AtMost)]


def _without_bounds(hint: Any) -> Any:
    """An option's annotation as a query parameter's: its type and its FieldInfo (constraints, description)."""
    if typing.get_origin(hint) is not Annotated:
        return hint
    base, *metadata = typing.get_args(hint)
    kept = [meta for meta in metadata if isinstance(meta, FieldInfo)]
    return Annotated[(base, *kept)] if kept else base


def _renders(renders: dict[str, Render]) -> dict:
    """The 200 answer's other forms, for the OpenAPI description."""
    return {"content": {render.media_type: {} for render in renders.values()},
            "description": "; ".join(f"with format={form}: {render.description}" for form, render in renders.items())}


async def rendered(answer: Answer, form: str, render: Render) -> Response:
    """The answer in another form than JSON, made off the event loop; the envelope in headers, the timings (and the
    form's own, under its name) in X-Timing-Ms."""
    start = time.perf_counter()
    data = await run_in_threadpool(render.make, answer.result)
    timing = {**answer.timing_ms, form: (time.perf_counter() - start) * 1000}
    return Response(data, media_type=render.media_type, headers={
        "X-Model": answer.model, "X-Backend": answer.backend, "X-Timing-Ms": orjson.dumps(timing).decode()})
