"""The plan page's dependency graph in a real Chromium (web/frontend/src/plan_graph.ts):
one node per action and one arrow per dependency, as the API gives them; a failed
action's node in the failed colour; a node's tooltip its saga's steps and their timing;
clicking a node (or Enter on it) shows that action's card; a plan too large to read as a
graph says so and keeps its list.

The site and server are ``test_plan_page``'s: a plan that moves a half-job and starts a
big job on the node it frees (the start waits on the move).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from playwright.sync_api import Page, expect
from sqlalchemy import Engine
from sqlmodel import Session, select

from app.actions.models import Action, ActionKind, ActionState
from app.plans import service as plan_service
from tests.app.test_plans_embedded import T0, Site, _report
from tests.web.browser import screenshot
from tests.web.test_plan_page import _get, _open, _shown, _site, engine, server, site

__all__ = ["engine", "server", "site"]  # test_plan_page's fixtures, used here by name

GRAPH_MAX = 200  # web/frontend/src/plan_graph.ts


def _edges(page: Page) -> set[tuple[int, int]]:
    drawn = page.locator("#plan-graph .graph-edge")
    return {
        (
            int(drawn.nth(i).get_attribute("data-from") or 0),
            int(drawn.nth(i).get_attribute("data-to") or 0),
        )
        for i in range(drawn.count())
    }


def _expect_graph(page: Page, actions: list[dict[str, Any]]) -> None:
    nodes = page.locator("#plan-graph .graph-node")
    expect(nodes).to_have_count(len(actions))
    for action in actions:
        expect(nodes.locator(f'xpath=self::*[@data-action="{action["id"]}"]')).to_have_attribute(
            "data-state", action["state"]
        )
    dependencies = {(d, a["id"]) for a in actions for d in a["depends_on"]}
    expect(page.locator("#plan-graph .graph-edge")).to_have_count(len(dependencies))
    assert _edges(page) == dependencies


def test_the_graph_draws_each_action_and_dependency_and_a_node_shows_its_card(
    page: Page, engine: Engine, tmp_path: Path, server: dict[str, Any]
) -> None:
    """``test_plan_page``'s move that fails (a rival takes its target once its checkpoint
    frees it), so the start that waits on it is cancelled."""
    rival = _report("rival", 4, submitted=T0 - timedelta(hours=1))
    with _site(engine, tmp_path, honours_reservations=False) as made:
        result = made.cycle()
        made.after_step["checkpoint"] = lambda: made.cluster.submit(rival, timedelta(hours=1))
        with Session(engine) as session:
            plan_service.decide_plan(
                session=session, plan_id=result.plan_id, approve=True, by="alice", now=T0
            )
        made.run_sagas()
    _open(page, server, f"plan&id={result.plan_id}", scope="viewer")
    view = _shown(page, result.plan_id)
    expect(view).to_have_attribute("data-live", "false")
    actions = _get(server, "/actions", {"plan_id": result.plan_id})["items"]
    _expect_graph(page, actions)
    (move,) = [a for a in actions if a["kind"] == "migrate"]
    (start,) = [a for a in actions if a["kind"] == "start"]
    assert move["state"] == "compensated" and start["state"] == "cancelled"
    assert (move["id"], start["id"]) in _edges(page)
    moved = page.locator(f'#plan-graph .graph-node[data-action="{move["id"]}"]')
    started = page.locator(f'#plan-graph .graph-node[data-action="{start["id"]}"]')
    expect(moved).to_have_class("graph-node state-compensated failed")
    expect(started).to_have_class("graph-node state-cancelled")
    # The failed colour is the cards' (style.css: var(--down)), not merely a class name.
    assert moved.locator("rect").evaluate("r => getComputedStyle(r).fill") == "rgb(187, 51, 68)"
    # The move's node is left of the start's: its stage comes first.
    assert (moved.bounding_box() or {})["x"] < (started.bounding_box() or {})["x"]
    # The tooltip: each of the move's saga steps, with its timing, and the error.
    steps = [
        s for s in _get(server, f"/plans/{result.plan_id}/steps") if s["action_id"] == move["id"]
    ]
    tooltip = moved.locator("title").text_content() or ""
    assert steps and move["error"] in tooltip
    for step in steps:
        name = step["name"] if step["phase"] == "forward" else f"{step['phase']} {step['name']}"
        assert f"{step['seq']}. {name}: {step['state']}, sent " in tooltip
    assert "took" in tooltip

    # The graph is a group of labelled buttons; the list stays its text alternative.
    cards = page.locator("#plan-actions .plan-action")
    stages = max(int(cards.nth(i).get_attribute("data-stage") or 0) for i in range(cards.count()))
    dependencies = sum(len(a["depends_on"]) for a in actions)
    expect(page.locator("#plan-graph svg")).to_have_attribute(
        "aria-label",
        f"Dependency graph: {len(actions)} actions in {stages} stages, {dependencies} "
        "dependencies; each node shows its action's card",
    )
    expect(started).to_have_attribute("role", "button")
    expect(page.locator("#plan-actions .plan-action")).to_have_count(len(actions))

    page.set_viewport_size({"width": 1280, "height": 400})
    started.click()
    card = page.locator(f'#plan-actions .plan-action[data-action="{start["id"]}"]')
    expect(card).to_have_class("plan-action state-cancelled picked")
    expect(card).to_be_in_viewport()
    expect(started).to_have_class("graph-node state-cancelled picked")
    # From the keyboard: the move's node, then Enter, picks the move instead.
    moved.focus()
    page.keyboard.press("Enter")
    expect(page.locator(f'.plan-action[data-action="{move["id"]}"]')).to_have_class(
        "plan-action state-compensated failed picked"
    )
    expect(page.locator("#plan .picked")).to_have_count(2)  # the move's node and card
    page.set_viewport_size({"width": 1280, "height": 900})
    page.locator("#plan-title").scroll_into_view_if_needed()
    screenshot(page, "plan-graph", tmp_path)


def test_a_refresh_redraws_the_graph_only_when_the_plan_changed(
    page: Page, site: Site, server: dict[str, Any]
) -> None:
    result = site.cycle()
    _open(page, server, f"plan&id={result.plan_id}")
    view = _shown(page, result.plan_id)
    expect(view).to_have_attribute("data-live", "true")
    actions = _get(server, "/actions", {"plan_id": result.plan_id})["items"]
    _expect_graph(page, actions)
    page.locator("#plan-graph .graph-node").first.click()
    # A node the page drew is marked; a redraw would replace it with one unmarked.
    page.locator("#plan-graph svg").evaluate("svg => { svg.dataset.drawn = 'before' }")
    with page.expect_response(f"**/api/v1/plans/{result.plan_id}/steps"):
        pass
    page.wait_for_timeout(300)
    expect(page.locator("#plan-graph svg")).to_have_attribute("data-drawn", "before")
    page.locator('button[data-plan-verdict="approve"]').click()
    expect(view).to_have_attribute("data-state", "approved")
    expect(page.locator("#plan-graph svg")).not_to_have_attribute("data-drawn", "before")
    _expect_graph(page, _get(server, "/actions", {"plan_id": result.plan_id})["items"])
    # The pick survives the redraw.
    expect(page.locator("#plan-graph .graph-node.picked")).to_have_count(1)


def _widen(engine: Engine, plan_id: int, name: str, width: int, stages: int) -> None:
    """Adds ``width`` actions to each of ``stages`` stages of the plan, each waiting on the
    action above it in the stage before (what a large plan's chains look like)."""
    with Session(engine) as session:
        (first, *_) = session.exec(select(Action).where(Action.plan_id == plan_id)).all()
        above: list[int] = []
        for stage in range(stages):
            added = [
                Action(
                    plan_id=plan_id,
                    cluster_id=first.cluster_id,
                    kind=ActionKind.requeue,
                    state=ActionState.proposed,
                    idempotency_key=f"{name}:{plan_id}:{stage}:{k}",
                    depends_on=[above[k]] if above else [],
                    created_at=T0,
                    updated_at=T0,
                )
                for k in range(width)
            ]
            session.add_all(added)
            session.flush()
            above = [a.id for a in added if a.id is not None]
        session.commit()


def test_a_plan_of_many_actions_draws_its_graph_up_to_the_limit_and_omits_it_beyond(
    page: Page, site: Site, engine: Engine, server: dict[str, Any]
) -> None:
    result = site.cycle()
    planned = _get(server, "/actions", {"plan_id": result.plan_id})["total"]
    _widen(engine, result.plan_id, "chains", width=(GRAPH_MAX - planned) // 4, stages=4)
    actions = _get(server, "/actions", {"plan_id": result.plan_id, "limit": 1000})["items"]
    assert len(actions) <= GRAPH_MAX
    _open(page, server, f"plan&id={result.plan_id}")
    _shown(page, result.plan_id)
    _expect_graph(page, actions)
    # Wrapped into columns of ten, the graph stays a screen tall.
    assert (page.locator("#plan-graph svg").bounding_box() or {})["height"] < 600

    _widen(engine, result.plan_id, "more", width=GRAPH_MAX, stages=1)
    total = _get(server, "/actions", {"plan_id": result.plan_id})["total"]
    page.reload()
    _shown(page, result.plan_id)
    expect(page.locator("#plan-graph")).to_have_text(
        f"Graph omitted: {total} actions (it is drawn up to {GRAPH_MAX}); see the stages below."
    )
    expect(page.locator("#plan-graph .graph-node")).to_have_count(0)
    expect(page.locator("#plan-actions .plan-action")).to_have_count(total)
