"""The job page in a real Chromium, against a live server: a job's fields and its history
as one timeline, newest first, reached from the queue and from the Plans & actions page.

``alpha`` is full and ``wait-8`` (eight GPUs) waits. Three hours ago a plan started it on
``alpha2`` and the start failed at the scheduler (the saga's step says why); an hour ago
a move to ``beta`` was proposed and an operator rejected it; the shaping cycle has since
planned twice. One more action, on another job, must not show.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from playwright.sync_api import Page, Route, expect
from sqlmodel import Session, select

from app.actions.models import Action, ActionKind, ActionState, ActionStep, StepState
from app.api.deps import get_clock
from app.clusters.models import Cluster
from app.core import migrate
from app.core.clock import FrozenClock
from app.core.config import Settings
from app.core.db import make_engine
from app.gpu_models import service as gpu_model_service
from app.jobs.models import Job
from app.plans.models import Plan, PlanState
from app.shaping.cycle import run_cycle
from tests.app.builders import job, node, registered_with, running, snapshot
from tests.support.live_server import app_on, serve, tokens_for
from tests.web.browser import release, screenshot
from wire.steps import StepPhase

NOW = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)
SERVER_NOW = NOW + timedelta(minutes=1)
STEP_ERROR = (
    "sbatch: error: Batch job submission failed: Requested node configuration is not available"
)
START_ERROR = "the scheduler refused the start (step start)"
PLANS_READ = 20  # web/frontend/src/job.ts


def _ids(session: Session) -> dict[str, int]:
    return {j.external_id: j.id for j in session.exec(select(Job)).all() if j.id is not None}


def _cluster_id(session: Session, name: str) -> int:
    found = session.exec(select(Cluster.id).where(Cluster.name == name)).one()
    assert found is not None
    return found


def _history(session: Session) -> dict[str, int]:
    """The failed start with its plan and saga, the rejected move, and another job's action;
    their ids by name."""
    alpha, beta = _cluster_id(session, "alpha"), _cluster_id(session, "beta")
    jobs = _ids(session)
    started = NOW - timedelta(hours=3)
    plan = Plan(
        cluster_id=alpha,
        created_at=started,
        policy="shaper",
        engine="cp-sat",
        mode="advise",
        status="OPTIMAL",
        wall_time_s=0.2,
        state=PlanState.finished,
        decisions=[
            {"job": "wait-8", "action": "start", "reason": "placed", "message": "", "to": "alpha2"}
        ],
    )
    session.add(plan)
    session.commit()
    failed_start = Action(
        plan_id=plan.id,
        cluster_id=alpha,
        job_id=jobs["wait-8"],
        kind=ActionKind.start,
        state=ActionState.failed,
        idempotency_key="start-wait-8",
        reason="placed on alpha2",
        target_node="alpha2",
        target_placement={"alpha2": 8},
        error=START_ERROR,
        created_at=started,
        updated_at=started + timedelta(minutes=2),
        decided_by="alice",
        decided_at=started + timedelta(minutes=1),
        finished_at=started + timedelta(minutes=2),
    )
    rejected_move = Action(
        cluster_id=alpha,
        target_cluster_id=beta,
        job_id=jobs["wait-8"],
        kind=ActionKind.move,
        state=ActionState.rejected,
        idempotency_key="move-wait-8",
        reason="beta has 8 free GPUs",
        created_at=NOW - timedelta(hours=1),
        updated_at=NOW - timedelta(minutes=50),
        decided_by="bob",
        decided_at=NOW - timedelta(minutes=50),
    )
    other = Action(
        cluster_id=alpha,
        job_id=jobs["big"],
        kind=ActionKind.preempt,
        state=ActionState.proposed,
        idempotency_key="preempt-big",
        reason="not this job's",
        source_node="alpha1",
        created_at=NOW - timedelta(minutes=30),
        updated_at=NOW - timedelta(minutes=30),
    )
    session.add_all([failed_start, rejected_move, other])
    session.commit()
    assert failed_start.id is not None
    session.add(
        ActionStep(
            action_id=failed_start.id,
            seq=1,
            phase=StepPhase.forward,
            name="start",
            queue="connector.alpha",
            state=StepState.failed,
            idempotency_key="start-wait-8:forward:start",
            error=STEP_ERROR,
            sent_at=started + timedelta(minutes=1),
            finished_at=started + timedelta(minutes=2),
        )
    )
    session.commit()
    return {
        "failed_start": failed_start.id,
        "rejected_move": rejected_move.id or 0,
        "other": other.id or 0,
        "plan": plan.id or 0,
    }


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    data = tmp_path_factory.mktemp("web-job")
    url = f"sqlite:///{data / 'shaper.db'}"
    migrate.upgrade(url)
    engine = make_engine(url)
    with Session(engine) as session:
        gpu_model_service.ensure_default_catalogue(session=session)
        alpha_jobs = [
            running("big", "alpha1", list(range(8)), team="nlp"),
            running("filler", "alpha2", list(range(6))),
            job(
                "wait-8",
                gpus_requested=8,
                reason="Resources",
                submit_time=(NOW - timedelta(hours=5)).isoformat(),
                time_limit_s=5400.0,
                residency={"cluster_selector": {"region": "eu"}, "allowed_clusters": ["beta"]},
                speeds={"H100": 2.5, "A100-80G": 1},
            ),
        ]
        registered_with(
            session,
            "alpha",
            snapshot(1, nodes=[node("alpha1"), node("alpha2")], jobs=alpha_jobs),
            now=NOW,
        )
        registered_with(session, "beta", snapshot(1, nodes=[node("beta1")]), now=NOW)
        actions = _history(session)
        for minutes in (20, 10):
            run_cycle(session=session, cluster_name="alpha", now=NOW - timedelta(minutes=minutes))
        tokens = tokens_for(session, NOW, ("viewer",))
        ids = _ids(session)
    app = app_on(engine, Settings(environment="test", data_dir=data))
    app.dependency_overrides[get_clock] = lambda: FrozenClock(SERVER_NOW)
    with serve(app) as base:
        yield {"base": base, "tokens": tokens, "jobs": ids, "actions": actions}
    engine.dispose()


def _get(site: dict[str, Any], path: str, params: dict[str, Any] | None = None) -> Any:
    response = httpx.get(
        f"{site['base']}/api/v1{path}",
        params=params,
        headers={"Authorization": f"Bearer {site['tokens']['viewer']}"},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return response.json()


def _open(page: Page, site: dict[str, Any], fragment: str) -> None:
    page.clock.set_fixed_time(SERVER_NOW)
    page.goto(f"{site['base']}/#token={site['tokens']['viewer']}")
    expect(page.locator(".card")).to_have_count(2)
    page.goto(f"{site['base']}/#{fragment}")


def _shown(page: Page, job_id: int) -> None:
    expect(page.locator("#job")).to_be_visible()
    expect(page.locator("#job")).to_have_attribute("data-job", str(job_id))


def _stamp(iso: str) -> str:
    return datetime.fromisoformat(iso).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _expected_timeline(site: dict[str, Any], job_id: int) -> list[tuple[str, str]]:
    """The API's history of the job, as the page must order it: newest first, an action
    after the plan decision made at the same instant, consecutive plans that decided the
    same as one entry."""
    entries: list[tuple[datetime, int, str, str]] = []
    decided = _get(site, "/plans/decisions/history", {"job_id": job_id, "plans": PLANS_READ})
    runs: list[list[dict[str, Any]]] = []
    for item in decided:
        key = (item["decision"], item["plan_state"], item["mode"])
        if (
            runs
            and (runs[-1][0]["decision"], runs[-1][0]["plan_state"], runs[-1][0]["mode"]) == key
        ):
            runs[-1].append(item)
        else:
            runs.append([item])
    for run in runs:
        at = datetime.fromisoformat(run[0]["created_at"])
        entries.append((at, 1, "plan", " ".join(str(h["plan_id"]) for h in run)))
    for action in _get(site, "/actions", {"job_id": job_id})["items"]:
        entries.append(
            (datetime.fromisoformat(action["created_at"]), 2, "action", str(action["id"]))
        )
    job_row = _get(site, f"/jobs/{job_id}")
    for field, event in (
        ("submit_time", "submitted"),
        ("start_time", "started"),
        ("end_time", "ended"),
    ):
        if job_row[field]:
            entries.append((datetime.fromisoformat(job_row[field]), 0, "job", event))
    entries.sort(key=lambda e: (e[0], e[1]), reverse=True)
    return [(kind, key) for _, _, kind, key in entries]


def _timeline(page: Page) -> list[tuple[str, str]]:
    items = page.locator("#job-timeline > li")
    shown = []
    for i in range(items.count()):
        item = items.nth(i)
        kind = item.get_attribute("data-kind") or ""
        attribute = {"plan": "data-plans", "action": "data-action", "job": "data-event"}[kind]
        shown.append((kind, item.get_attribute(attribute) or ""))
    return shown


def test_a_jobs_page_from_the_queue_shows_its_fields_and_its_history_newest_first(
    page: Page, site: dict[str, Any], tmp_path: Path
) -> None:
    job_id = site["jobs"]["wait-8"]
    _open(page, site, "jobs&cluster=alpha")
    expect(page.locator('#jobs[data-cluster="alpha"]')).to_be_visible()
    page.locator('#job-table tr[data-job="wait-8"] a[data-job-link]').click()
    _shown(page, job_id)
    assert urlsplit(page.url).fragment == f"job&id={job_id}"
    expect(page.locator('#nav a[data-view="jobs"]')).to_have_class("active")

    api_job = _get(site, f"/jobs/{job_id}")
    expect(page.locator("#job-title")).to_have_text("Job wait-8 in alpha")
    fields = page.locator("#job-fields")
    for field, value in (
        ("state", api_job["state"]),
        ("team", api_job["team"]),
        ("gpus", str(api_job["gpus_requested"])),
        ("priority", str(api_job["priority"])),
        ("placement", "none"),
        ("submitted", _stamp(api_job["submit_time"])),
        ("started", "—"),
        ("reason", "Resources"),
        ("waited", "5 h 01 min"),
        ("time-limit", "1 h 30 min"),
        ("residency", "clusters labelled region=eu; only beta"),
        ("speeds", "A100-80G 1, H100 2.5"),
    ):
        expect(fields.locator(f'[data-field="{field}"]')).to_have_text(value)

    expected = _expected_timeline(site, job_id)
    # Both cycles' plans decided about the job; the other job's action is not its.
    assert [kind for kind, _ in expected].count("action") == 2
    assert ("action", str(site["actions"]["other"])) not in expected
    assert expected[-3:] == [
        ("action", str(site["actions"]["failed_start"])),
        ("plan", str(site["actions"]["plan"])),
        ("job", "submitted"),
    ]
    expect(page.locator("#job-timeline > li")).to_have_count(len(expected))
    assert _timeline(page) == expected

    failed = page.locator(f'#job-timeline li[data-action="{site["actions"]["failed_start"]}"]')
    expect(failed).to_have_attribute("data-state", "failed")
    expect(failed.locator('[data-figure="placement"]')).to_have_text("— → alpha2 × 8")
    expect(failed.locator('[data-figure="error"]')).to_have_text(START_ERROR)
    step = failed.locator('.step-error[data-step="start"]')
    expect(step.locator('[data-figure="step-error"]')).to_have_text(STEP_ERROR)
    expect(step).to_contain_text("forward start on connector.alpha")
    expect(failed.locator('[data-figure="times"]')).to_have_text(
        "proposed 2026-11-02 09:00:00 UTC · decided by alice 2026-11-02 09:01:00 UTC"
        " · ended 2026-11-02 09:02:00 UTC"
    )
    move = page.locator(f'#job-timeline li[data-action="{site["actions"]["rejected_move"]}"]')
    expect(move.locator('[data-figure="cluster"]')).to_have_text("alpha → beta")
    expect(move.locator('[data-figure="state"]')).to_have_text("rejected")
    expect(move.locator('[data-figure="times"]')).to_contain_text("rejected by bob")
    expect(move.locator('[data-figure="reason"]')).to_have_text("beta has 8 free GPUs")
    start = page.locator(f'#job-timeline li[data-plans="{site["actions"]["plan"]}"]')
    expect(start).to_have_attribute("data-decision", "start")
    expect(start).to_contain_text("start on alpha2")
    screenshot(page, "job", tmp_path)


def test_an_actions_job_links_to_the_jobs_page(page: Page, site: dict[str, Any]) -> None:
    _open(page, site, "actions")
    row = page.locator(f'#action-table tr[data-action="{site["actions"]["other"]}"]')
    link = row.locator("a[data-job-link]")
    expect(link).to_have_text("big")
    link.click()
    _shown(page, site["jobs"]["big"])
    expect(page.locator("#job-title")).to_have_text("Job big in alpha")
    expect(page.locator('#job-fields [data-field="placement"]')).to_have_text(
        "alpha1 [0, 1, 2, 3, 4, 5, 6, 7]"
    )
    # No rule of its own.
    expect(page.locator('#job-fields [data-field="residency"]')).to_have_text(
        "any cluster its team may use"
    )
    expect(page.locator('#job-fields [data-field="speeds"]')).to_have_text("its models' speeds")
    expect(
        page.locator(f'#job-timeline li[data-action="{site["actions"]["other"]}"]')
    ).to_have_attribute("data-state", "proposed")


def test_a_stale_reply_never_overwrites_a_newer_job(page: Page, site: dict[str, Any]) -> None:
    big, waiting = site["jobs"]["big"], site["jobs"]["wait-8"]
    _open(page, site, f"job&id={waiting}")
    _shown(page, waiting)
    held: list[Route] = []
    page.route(f"**/api/v1/jobs/{big}", lambda route: held.append(route))
    with page.expect_request(f"**/api/v1/jobs/{big}"):
        page.goto(f"{site['base']}/#job&id={big}")
    page.goto(f"{site['base']}/#job&id={waiting}")
    _shown(page, waiting)
    release(held)
    page.wait_for_timeout(500)
    _shown(page, waiting)
    expect(page.locator("#job-title")).to_have_text("Job wait-8 in alpha")


def test_an_unknown_job_says_so(page: Page, site: dict[str, Any]) -> None:
    _open(page, site, "job&id=999999")
    expect(page.locator("#job-load-error")).to_have_text(
        "Could not load job 999999: job 999999 does not exist"
    )
    page.goto(f"{site['base']}/#job&id=x")
    expect(page.locator("#job .error")).to_contain_text("No job named in the address")
