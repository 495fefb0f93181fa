from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from app.api.deps import ClockDep, SessionDep, SettingsDep, scoped
from app.core.config import Settings
from app.core.errors import Invalid, PayloadTooLarge
from app.simulations import runs, service, uploads
from app.simulations.models import (
    TRACE_KINDS,
    SimulationResult,
    SimulationSummary,
    WhatIfCreate,
    WhatIfOptions,
    WhatIfRun,
    WhatIfUpload,
)
from solver.policies import POLICY_NAMES

router = APIRouter(prefix="/simulations", tags=["simulations"])


@router.get("", **scoped("viewer"))
def list_simulations(settings: SettingsDep) -> list[SimulationSummary]:
    """Results written by `shaper sim run|compare|table|replay` into SHAPER_SIM_RESULTS_DIR,
    and by the what-if runs started here."""
    return service.list_results(directory=settings.resolved_sim_results_dir)


def _form_schema() -> dict[str, Any]:
    """WhatIfUpload as form fields (a value each, no nulls) beside the ``trace`` file."""
    model = WhatIfUpload.model_json_schema()
    properties: dict[str, Any] = {
        uploads.TRACE_FIELD: {
            "type": "string",
            "format": "binary",
            "description": "the trace: Philly, Pollux, Gavel or Shaper's CSV/JSON, as "
            "`shaper sim replay` reads it (format told from the file unless `kind` says)",
        }
    }
    for name, spec in model["properties"].items():
        spec = dict(spec)
        plain = [s for s in spec.pop("anyOf", []) if s.get("type") != "null"]
        spec.update(plain[0] if plain else {})
        spec.pop("default", None)
        properties[name] = spec
    return {
        "type": "object",
        "properties": properties,
        "required": [uploads.TRACE_FIELD, *model["required"]],
    }


_operator = scoped("operator")
_BODY = {
    "required": True,
    "content": {
        "application/json": {"schema": WhatIfCreate.model_json_schema()},
        "multipart/form-data": {"schema": _form_schema()},
    },
}


@router.post(
    "",
    status_code=status.HTTP_202_ACCEPTED,
    dependencies=_operator["dependencies"],
    openapi_extra={**_operator["openapi_extra"], "requestBody": _BODY},
    responses={
        408: {
            "description": "An upload that sent nothing for SHAPER_SIM_UPLOAD_IDLE_TIMEOUT_S "
            "(`details.idle_timeout_s`): what came of it is dropped; send it again"
        },
        413: {
            "description": "A JSON body over SHAPER_MAX_BODY_BYTES; a trace over "
            "SHAPER_SIM_UPLOAD_MAX_MB; a form with too many parts or a part's headers too "
            "long (`details.too_large`: parts, part_headers)"
        },
        429: {
            "description": "Too many failed authentications from this address; or as many "
            "what-if runs queued or running as are taken, or SHAPER_SIM_UPLOAD_MAX_CONCURRENT "
            "uploads being received (`details.limit`); see Retry-After"
        },
    },
)
async def start_simulation(
    request: Request, settings: SettingsDep, clock: ClockDep, session: SessionDep
) -> WhatIfRun:
    """Simulate in the background; poll GET /simulations/runs/{id}. When done, its result
    is listed here.

    As JSON: a built-in scenario under some policies, as `shaper sim compare` does. As
    multipart/form-data: an uploaded `trace` replayed under some policies, as `shaper sim
    replay` does, with its options of the same names; a trace over SHAPER_SIM_UPLOAD_MAX_MB
    is refused (413), one its loader cannot read is refused with the loader's reason (422,
    field `trace`). While SHAPER_SIM_UPLOAD_MAX_CONCURRENT uploads are being received and
    checked, another is refused (429, `Retry-After`) before any of it is read; one that
    sends nothing for SHAPER_SIM_UPLOAD_IDLE_TIMEOUT_S is refused (408) and frees its
    place."""
    directory = settings.resolved_sim_results_dir
    # The token is checked, and a run is a file, not a row: the request's transaction ends
    # here. Held while an upload streams in (minutes), a POST's would keep SQLite's write
    # lock from every other writer, and each upload after the first would wait for it.
    await run_in_threadpool(session.rollback)
    if request.headers.get("content-type", "").startswith("multipart/form-data"):
        return await _start_replay(request, settings, directory, clock)
    run_in = await _json_body(request)
    return await run_in_threadpool(
        runs.start_run, directory=directory, run_in=run_in, now=clock.now()
    )


async def _json_body(request: Request) -> WhatIfCreate:
    """The body read as FastAPI reads a model parameter's, with the same errors: this
    route reads its own, as an upload must not be read into memory whole."""
    raw = await request.body()
    if not raw:
        missing = {"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}
        raise RequestValidationError([missing])
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    body: Any = raw
    if content_type == "application/json" or (
        content_type.startswith("application/") and content_type.endswith("+json")
    ):
        try:
            body = json.loads(raw)
        except json.JSONDecodeError as exc:
            error = {
                "type": "json_invalid",
                "loc": ("body", exc.pos),
                "msg": "JSON decode error",
                "input": {},
                "ctx": {"error": exc.msg},
            }
            raise RequestValidationError([error], body=exc.doc) from exc
    try:
        return WhatIfCreate.model_validate(body, from_attributes=True)
    except ValidationError as exc:
        raise _invalid_body(exc) from exc


def _invalid_body(exc: ValidationError) -> RequestValidationError:
    """A model's errors as the body's, as FastAPI reports them."""
    return RequestValidationError(
        [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
    )


async def _start_replay(
    request: Request, settings: Settings, directory: Path, clock: ClockDep
) -> WhatIfRun:
    limit = int(settings.sim_upload_max_mb * 2**20)
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit + uploads.FORM_OVERHEAD_BYTES:
        raise PayloadTooLarge(
            f"request body of {declared} bytes: the trace may have {limit} "
            "(SHAPER_SIM_UPLOAD_MAX_MB)",
            field=uploads.TRACE_FIELD,
        )
    await run_in_threadpool(runs.refuse_when_full, directory=directory, now=clock.now())
    with runs.upload_slot(directory=directory, limit=settings.sim_upload_max_concurrent):
        return await _receive_and_queue(
            request, limit, settings.sim_upload_idle_timeout_s, directory, clock
        )


async def _receive_and_queue(
    request: Request, limit: int, idle_timeout_s: float, directory: Path, clock: ClockDep
) -> WhatIfRun:
    form = await uploads.receive(
        request.stream(),
        content_type=request.headers["content-type"],
        folder=runs.uploads_dir(directory),
        max_bytes=limit,
        idle_timeout_s=idle_timeout_s,
    )
    try:
        if form.trace is None:
            raise Invalid("a trace file is required", field=uploads.TRACE_FIELD)
        replay_in = _form_fields(form.fields)
    except BaseException:
        if form.trace is not None:
            form.trace.unlink(missing_ok=True)
        raise
    return await run_in_threadpool(
        runs.start_replay,
        directory=directory,
        trace=form.trace,
        trace_name=uploads.shown_name(form.filename),
        sent_as=uploads.sent_name(form.filename),
        replay_in=replay_in,
        now=clock.now(),
    )


def _form_fields(fields: dict[str, list[str]]) -> WhatIfUpload:
    """The form's fields as WhatIfUpload: ``policies`` repeated or comma-separated (as
    ``--policies``), every other one once; an empty value (a blank input) is unset."""
    known = set(WhatIfUpload.model_fields)
    values: dict[str, Any] = {}
    for name, given in fields.items():
        if name not in known:
            raise Invalid(f"unknown field; one of {', '.join(sorted(known))}", field=name)
        if name == "policies":
            values[name] = [p.strip() for v in given for p in v.split(",") if p.strip()]
            continue
        if len(given) > 1:
            raise Invalid("given more than once", field=name)
        if given[0].strip():
            values[name] = given[0].strip()
    try:
        return WhatIfUpload.model_validate(values)
    except ValidationError as exc:
        raise _invalid_body(exc) from exc


@router.get("/options", **scoped("viewer"))
def simulation_options(settings: SettingsDep) -> WhatIfOptions:
    """What POST /simulations accepts: the built-in scenarios, the policies, the kinds of
    trace an upload may name and its size limit."""
    return WhatIfOptions(
        scenarios=runs.known_scenarios(),
        policies=list(POLICY_NAMES),
        trace_kinds=list(TRACE_KINDS),
        upload_max_mb=settings.sim_upload_max_mb,
    )


@router.get("/runs", **scoped("viewer"))
def list_simulation_runs(settings: SettingsDep, clock: ClockDep) -> list[WhatIfRun]:
    """The 20 latest what-if runs, newest first."""
    return runs.list_runs(directory=settings.resolved_sim_results_dir, now=clock.now())


@router.get("/runs/{run_id}", **scoped("viewer"))
def get_simulation_run(settings: SettingsDep, clock: ClockDep, run_id: str) -> WhatIfRun:
    return runs.get_run(directory=settings.resolved_sim_results_dir, run_id=run_id, now=clock.now())


@router.get("/{name}", **scoped("viewer"))
def get_simulation(settings: SettingsDep, name: str) -> SimulationResult:
    return service.get_result(directory=settings.resolved_sim_results_dir, name=name)
