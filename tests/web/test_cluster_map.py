"""The cluster map (#nodes) in a real Chromium against a live server: its cells are the
API's allocations, coloured by team or job, with what was measured on each GPU; the
latest open plan's moves drawn on it; filters by GPU model and node state; and a slower
reply for a cluster no longer chosen never drawn."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page, Route, expect
from sqlalchemy import Engine
from sqlmodel import Session

from app.actions import saga, tasks
from app.api.deps import get_clock
from app.clusters.models import ShapingMode
from app.core import migrate
from app.core.clock import FrozenClock
from app.core.config import Settings
from app.core.db import make_engine
from app.gpu_models import service as gpu_model_service
from tests.app.builders import job, node, registered_with, running, snapshot
from tests.app.test_plans_embedded import Site, _fragment, _spec
from tests.support.clock import T0
from tests.support.live_server import app_on, serve, tokens_for
from tests.web.browser import release, screenshot

NOW = T0


def _engine(folder: Path) -> Engine:
    url = f"sqlite:///{folder / 'shaper.db'}"
    migrate.upgrade(url)
    engine = make_engine(url)
    with Session(engine) as session:
        gpu_model_service.ensure_default_catalogue(session=session)
        session.commit()
    return engine


def _sample(metric: str, node_name: str, value: float, gpu: int | None = None) -> dict[str, Any]:
    at = (NOW - timedelta(minutes=1)).isoformat()
    sample = {"at": at, "metric": metric, "node": node_name, "value": value}
    return sample if gpu is None else {**sample, "gpu_index": gpu}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """alpha: H100 and L40S nodes, up, draining and down, jobs of two teams, one of them
    counted only (no device indices), and measurements; beta: two empty nodes."""
    data = tmp_path_factory.mktemp("web-map")
    engine = _engine(data)
    with Session(engine) as session:
        registered_with(
            session,
            "alpha",
            snapshot(
                1,
                nodes=[
                    node("a1"),
                    node("a2"),
                    node("a3", gpu_model="L40S", gpu_count=4, state="draining"),
                    node("a4", gpu_model="L40S", gpu_count=4, state="down"),
                ],
                jobs=[
                    running("train", "a1", [0, 1, 2, 3], team="vision"),
                    running("tune", "a1", [6], team="nlp"),
                    running("serve", "a2", list(range(8)), team="nlp"),
                    job(
                        "counted",
                        state="running",
                        team="vision",
                        start_time=NOW.isoformat(),
                        gpus_requested=2,
                        allocations=[{"node": "a3", "gpu_count": 2}],
                    ),
                ],
                samples=[
                    _sample("gpu_util", "a1", 0.87, gpu=0),
                    _sample("gpu_mem_used_gib", "a1", 61.5, gpu=0),
                    _sample("gpu_util", "a2", 0.5),
                ],
            ),
            now=NOW,
        )
        registered_with(session, "beta", snapshot(1, nodes=[node("b1"), node("b2")]), now=NOW)
        tokens = tokens_for(session, NOW, ("viewer",))
    app = app_on(engine, Settings(environment="test", data_dir=data))
    app.dependency_overrides[get_clock] = lambda: FrozenClock(NOW)
    with serve(app) as base:
        yield {"base": base, "tokens": tokens}
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


def _open_map(page: Page, site: dict[str, Any], clusters: int) -> None:
    page.goto(f"{site['base']}/#token={site['tokens']['viewer']}")
    expect(page.locator(".card")).to_have_count(clusters)
    page.click('a[data-view="nodes"]')


def _holders(site: dict[str, Any], cluster: str) -> dict[tuple[str, int], str]:
    """Who holds which GPU, from the jobs' own allocations (GET /jobs), counted-only
    allocations on their node's first GPUs no indexed job holds."""
    jobs = _get(site, "/jobs", {"cluster": cluster, "state": "running", "limit": 1000})["items"]
    held: dict[tuple[str, int], str] = {}
    for j in jobs:
        for a in j["allocations"]:
            for i in a["gpu_indices"]:
                held[(a["node"], i)] = j["external_id"]
    for j in jobs:
        for a in j["allocations"]:
            if not a["gpu_indices"]:
                free = [i for i in range(8) if (a["node"], i) not in held]
                for i in free[: a["gpu_count"]]:
                    held[(a["node"], i)] = j["external_id"]
    return held


def _background(page: Page, selector: str) -> str:
    """The colour the first element matching ``selector`` is drawn in."""
    return str(page.locator(selector).nth(0).evaluate("(e) => getComputedStyle(e).backgroundColor"))


def test_the_maps_cells_are_the_apis_allocations(
    page: Page, fleet: dict[str, Any], tmp_path: Path
) -> None:
    _open_map(page, fleet, 2)
    expect(page.locator("#gpu-map")).to_have_attribute("data-cluster", "alpha")
    nodes = _get(fleet, "/nodes", {"cluster": "alpha", "limit": 1000})["items"]
    expect(page.locator(".gpu-row")).to_have_count(len(nodes))
    held = _holders(fleet, "alpha")
    jobs = _get(fleet, "/jobs", {"cluster": "alpha"})["items"]
    teams = {j["external_id"]: j["team"] for j in jobs}
    for n in nodes:
        cells = page.locator(f'.gpu-row[data-node="{n["name"]}"] .gpu')
        expect(cells).to_have_count(n["gpu_count"])
        drawn = {
            i: cells.nth(i).get_attribute("data-job")
            for i in range(n["gpu_count"])
            if cells.nth(i).get_attribute("data-job")
        }
        assert drawn == {i: j for (name, i), j in held.items() if name == n["name"]}, n["name"]
        assert len(drawn) == n["gpus_allocated"]
        for i, holder in drawn.items():
            expect(cells.nth(i)).to_have_attribute("data-team", teams[holder])
    # Measured: one GPU's own figures, a node's average on each of its GPUs.
    measured = page.locator('.gpu-row[data-node="a1"] .gpu').nth(0)
    expect(measured).to_have_attribute(
        "title",
        "a1 GPU 0 · job train · team vision · utilization 87 % · memory 61.5 GiB of 80 GiB",
    )
    expect(page.locator('.gpu-row[data-node="a2"] .gpu[data-util="0.5"]')).to_have_count(8)
    expect(page.locator('.gpu-row[data-node="a1"] .gpu').nth(7)).to_have_attribute(
        "title", "a1 GPU 7 · free · utilization not measured"
    )
    # By team one colour per team; by job one per job; the legend follows.
    legend = page.locator("#map-legend li[data-key]")
    expect(legend).to_have_count(2)
    same = _background(page, '.gpu[data-job="train"]')
    assert same == _background(page, '.gpu[data-job="counted"]')
    assert same != _background(page, '.gpu-row[data-node="a1"] .gpu:not(.busy)')  # free
    page.select_option("#map-colour", "job")
    expect(page.locator("#gpu-map")).to_have_attribute("data-colour-by", "job")
    expect(legend).to_have_count(4)
    assert same != _background(page, '.gpu[data-job="counted"]')
    # Each cell's colour is its legend entry's swatch.
    for key in ("train", "counted", "serve"):
        assert _background(page, f'.gpu[data-job="{key}"]') == _background(
            page, f'#map-legend li[data-key="{key}"] .swatch'
        ), key
    # The measured utilization's band: 87 % of 14 px.
    band = page.locator('.gpu-row[data-node="a1"] .gpu').nth(0)
    assert "-12px" in band.evaluate("(cell) => getComputedStyle(cell).boxShadow")
    expect(page.locator('#map-legend li[data-key="serve"]')).to_contain_text("8 GPUs")
    expect(page.locator("#map-moves")).to_contain_text("No open plan")


def test_filters_by_gpu_model_and_node_state(page: Page, fleet: dict[str, Any]) -> None:
    _open_map(page, fleet, 2)
    shown = page.locator(".gpu-row:not([hidden])")
    expect(shown).to_have_count(4)
    reads: list[str] = []
    page.on("request", lambda request: reads.append(request.url))
    for model, state in (("L40S", ""), ("H100", ""), ("", "draining"), ("L40S", "down")):
        page.select_option("#map-model", model)
        page.select_option("#map-state", state)
        params = {"cluster": "alpha", "limit": 1000}
        if model:
            params["gpu_model"] = model
        if state:
            params["state"] = state
        expected = [n["name"] for n in _get(fleet, "/nodes", params)["items"]]
        expect(shown).to_have_count(len(expected))
        assert [shown.nth(i).get_attribute("data-node") for i in range(len(expected))] == expected
        expect(page.locator("#map-summary")).to_contain_text(f"{len(expected)} of 4 nodes shown")
    # Filtering redraws the reply it has: no read per change.
    assert [url for url in reads if "/api/v1/" in url] == []


def test_a_stale_reply_never_overwrites_a_newer_selection(
    page: Page, fleet: dict[str, Any]
) -> None:
    _open_map(page, fleet, 2)
    expect(page.locator("#gpu-map")).to_have_attribute("data-cluster", "alpha")
    page.select_option("#node-cluster", "beta")
    expect(page.locator("#gpu-map")).to_have_attribute("data-cluster", "beta")
    # alpha is asked for again and answers only after beta was chosen and drawn.
    held: list[Route] = []
    slow = "/api/v1/nodes/map?cluster=alpha"
    page.route(lambda url: slow in url, lambda route: held.append(route))
    with page.expect_request(lambda request: slow in request.url):
        page.select_option("#node-cluster", "alpha")
    page.select_option("#node-cluster", "beta")
    expect(page.locator(".gpu-row")).to_have_count(2)
    release(held)
    page.wait_for_timeout(500)
    expect(page.locator("#gpu-map")).to_have_attribute("data-cluster", "beta")
    expect(page.locator(".gpu-row")).to_have_count(2)
    expect(page.locator('.gpu-row[data-node="a1"]')).to_have_count(0)
    expect(page.locator("#node-cluster")).to_have_value("beta")


@pytest.fixture
def planned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """``test_plans_embedded``'s cluster: two 8-GPU nodes each holding a 4-GPU job, an
    8-GPU job waiting; in advise mode the plan moves one half-job next to the other and
    starts the big job on the node it frees."""
    engine = _engine(tmp_path)
    monkeypatch.setattr(tasks, "get_engine", lambda: engine)
    monkeypatch.setattr(saga, "CONFIRM_POLL_S", 0.05)
    site = Site(engine, tmp_path, _spec(), ShapingMode.advise)
    _fragment(site)
    result = site.cycle()
    with Session(engine) as session:
        tokens = tokens_for(session, T0, ("viewer",))
    app = app_on(engine, Settings(environment="test"))
    app.dependency_overrides[get_clock] = lambda: FrozenClock(site.clock.now)
    with serve(app) as base:
        yield {"base": base, "tokens": tokens, "plan": result.plan_id}
    engine.dispose()


def test_the_map_draws_a_planned_move(page: Page, planned: dict[str, Any], tmp_path: Path) -> None:
    plan_id = planned["plan"]
    actions = _get(planned, "/actions", {"plan_id": plan_id})["items"]
    (migration,) = [a for a in actions if a["kind"] == "migrate"]
    (start,) = [a for a in actions if a["kind"] == "start"]
    _open_map(page, planned, 1)
    expect(page.locator("#gpu-map")).to_have_attribute("data-cluster", "lab")
    drawn = _get(planned, "/nodes/map", {"cluster": "lab"})
    assert drawn["plan"]["id"] == plan_id
    moves = {m["action_id"]: m for m in drawn["moves"]}
    assert {migration["id"], start["id"]} <= set(moves)
    # The migration leaves the GPUs its job holds on its source node, and takes GPUs on
    # its target node; the start takes the GPUs the plan gives the waiting job.
    move = moves[migration["id"]]
    assert [c["node"] for c in move["source"]] == [migration["source_node"]]
    assert [c["node"] for c in move["target"]] == [migration["target_node"]]
    leaving = page.locator(f'.gpu-row[data-node="{migration["source_node"]}"] .gpu.move-from')
    expect(leaving).to_have_count(4)
    for i in range(4):
        expect(leaving.nth(i)).to_have_attribute("data-job", migration["job_external_id"])
        expect(leaving.nth(i)).to_have_attribute("data-move-from", str(migration["id"]))
    for side, attribute in (("source", "data-move-from"), ("target", "data-move-to")):
        for m in drawn["moves"]:
            for cells in m[side]:
                row = page.locator(f'.gpu-row[data-node="{cells["node"]}"] .gpu')
                for i in cells["gpu_indices"]:
                    marks = (row.nth(i).get_attribute(attribute) or "").split()
                    assert str(m["action_id"]) in marks, (m["action_id"], cells["node"], i)
    taking = page.locator(f'.gpu-row[data-node="{migration["target_node"]}"] .gpu.move-to')
    expect(taking).to_have_count(4)
    # The list beside the map names it, from → to, and links its plan and job.
    item = page.locator(f'#map-move-list li[data-action="{migration["id"]}"]')
    expect(item).to_contain_text(migration["job_external_id"])
    expect(item.locator(".from-to")).to_contain_text(
        f"{migration['source_node']}[" if move["source"][0]["exact"] else migration["source_node"]
    )
    expect(item.locator(".from-to")).to_contain_text(f"→ {migration['target_node']}")
    expect(item.locator(f'a[href="#plan&id={plan_id}"]')).to_have_count(1)
    expect(item.locator(f'a[href="#job&id={migration["job_id"]}"]')).to_have_count(1)
    expect(page.locator(f'#map-move-list li[data-action="{start["id"]}"]')).to_contain_text("big")
    screenshot(page, "cluster-map", tmp_path)
    item.locator(f'a[href="#plan&id={plan_id}"]').first.click()
    expect(page.locator("#plan")).to_have_attribute("data-plan", str(plan_id))


def _focused(page: Page) -> tuple[str, int] | None:
    """The node and GPU index of the focused map cell; None when focus is elsewhere."""
    got = page.evaluate(
        """() => {
          const cell = document.activeElement;
          if (!cell || !cell.matches("#gpu-map .gpu")) return null;
          return [cell.closest(".gpu-row").dataset.node, Number(cell.dataset.index)];
        }"""
    )
    return None if got is None else (got[0], got[1])


def _tab_stop(page: Page) -> list[tuple[str, int]]:
    """The cells that Tab can land on in the map (one, in a roving tabindex)."""
    stops = page.eval_on_selector_all(
        '#gpu-map [tabindex="0"]',
        "(cells) => cells.map((c) => [c.closest('.gpu-row').dataset.node, c.dataset.index])",
    )
    return [(node, int(index)) for node, index in stops]


def test_the_map_is_a_grid_the_keyboard_moves_through(page: Page, fleet: dict[str, Any]) -> None:
    _open_map(page, fleet, 2)
    expect(page.locator("#gpu-map")).to_have_attribute("data-drawn", "all")
    grid = page.get_by_role("grid")
    expect(grid).to_have_accessible_name("GPUs of alpha: a row per node, a cell per GPU")
    expect(grid.get_by_role("row")).to_have_count(4)
    expect(
        grid.get_by_role("rowheader", name="a3 · L40S · 2 of 4 GPUs held · draining")
    ).to_have_count(1)
    # Every cell is named by its node, GPU, job or "free", and team.
    expect(grid.get_by_role("gridcell")).to_have_count(8 + 8 + 4 + 4)
    expect(page.locator('.gpu-row[data-node="a1"] .gpu').nth(0)).to_have_accessible_name(
        "a1 GPU 0 · job train · team vision · utilization 87 % · memory 61.5 GiB of 80 GiB"
    )
    expect(grid.get_by_role("gridcell", name="a1 GPU 7 · free", exact=False)).to_have_count(1)
    expect(
        grid.get_by_role("gridcell", name="a3 GPU 1 · job counted · team vision", exact=False)
    ).to_have_count(1)

    # One tab stop: Tab from the last filter lands on the first cell, the next Tab leaves.
    assert _tab_stop(page) == [("a1", 0)]
    page.focus("#map-state")
    page.keyboard.press("Tab")
    assert _focused(page) == ("a1", 0)
    outline = page.evaluate("() => getComputedStyle(document.activeElement).outlineStyle")
    assert outline == "solid"  # the focus is visible
    page.keyboard.press("Tab")
    assert _focused(page) is None
    page.keyboard.press("Shift+Tab")
    assert _focused(page) == ("a1", 0)

    # Left and right along a row (no wrap at its ends), up and down between rows keeping
    # the column where a row is shorter, Home and End, with Ctrl the map's ends.
    for key, expected in (
        ("ArrowLeft", ("a1", 0)),
        ("ArrowRight", ("a1", 1)),
        ("End", ("a1", 7)),
        ("ArrowRight", ("a1", 7)),
        ("ArrowDown", ("a2", 7)),
        ("ArrowDown", ("a3", 3)),
        ("ArrowDown", ("a4", 3)),
        ("ArrowDown", ("a4", 3)),
        ("ArrowUp", ("a3", 3)),
        ("ArrowUp", ("a2", 7)),
        ("Home", ("a2", 0)),
        ("Control+End", ("a4", 3)),
        ("Control+Home", ("a1", 0)),
        ("PageDown", ("a4", 0)),
        ("PageUp", ("a1", 0)),
        ("ArrowDown", ("a2", 0)),
        ("ArrowRight", ("a2", 1)),
    ):
        page.keyboard.press(key)
        assert _focused(page) == expected, key
        assert _tab_stop(page) == [expected], key
    # A new reply redrawing the map under the keyboard user keeps their place and focus.
    page.evaluate(
        """() => {
          document.activeElement.dataset.old = "yes";
          document.querySelector("#node-cluster").dispatchEvent(new Event("change"));
        }"""
    )
    expect(page.locator("#gpu-map .gpu[data-old]")).to_have_count(0)
    assert _focused(page) == ("a2", 1)
    # A redraw (colouring by job) keeps the tab stop where it was.
    page.select_option("#map-colour", "job")
    expect(page.locator("#gpu-map")).to_have_attribute("data-colour-by", "job")
    assert _tab_stop(page) == [("a2", 1)]
    # Rows a filter hides are skipped; a hidden tab stop moves to the first cell shown.
    page.select_option("#map-state", "draining")
    assert _tab_stop(page) == [("a3", 0)]
    page.focus("#map-state")
    page.keyboard.press("Tab")
    assert _focused(page) == ("a3", 0)
    for key in ("ArrowDown", "ArrowUp", "PageDown", "Control+Home"):
        page.keyboard.press(key)
        assert _focused(page) == ("a3", 0), key
    page.select_option("#map-state", "")


def test_enter_or_space_on_a_cell_opens_what_a_click_opens(
    page: Page, fleet: dict[str, Any]
) -> None:
    ids = {j["external_id"]: j["id"] for j in _get(fleet, "/jobs", {"cluster": "alpha"})["items"]}
    _open_map(page, fleet, 2)
    expect(page.locator("#gpu-map")).to_have_attribute("data-drawn", "all")
    page.focus("#map-state")
    page.keyboard.press("Tab")
    # A free GPU has nothing to open: the map stays.
    page.keyboard.press("End")
    page.keyboard.press("Enter")
    page.keyboard.press(" ")
    expect(page.locator("#nodes")).to_be_visible()
    assert _focused(page) == ("a1", 7)
    for key, (moves, job_name) in (("Enter", ([], "train")), (" ", (["ArrowDown"], "serve"))):
        page.keyboard.press("Home")
        for move in moves:
            page.keyboard.press(move)
        page.keyboard.press(key)
        expect(page.locator("#job")).to_have_attribute("data-job", str(ids[job_name]))
        expect(page.locator("#job-title")).to_contain_text(f"Job {job_name}")
        assert page.evaluate("() => location.hash") == f"#job&id={ids[job_name]}"
        with page.expect_response(lambda response: "/nodes/map?" in response.url):
            page.go_back()
        expect(page.locator("#nodes")).to_be_visible()
        expect(page.locator("#gpu-map")).to_have_attribute("data-drawn", "all")
        page.focus("#map-state")
        page.keyboard.press("Tab")
    # The mouse opens the same page.
    page.locator('.gpu-row[data-node="a1"] .gpu').nth(6).click()
    expect(page.locator("#job")).to_have_attribute("data-job", str(ids["tune"]))


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """wide: 150 nodes of 8 GPUs (H100 and L40S in turn), more than the map's first rows
    (map.ts FIRST_ROWS, 60): the rest are put in by chunks after the first paint."""
    data = tmp_path_factory.mktemp("web-map-wide")
    engine = _engine(data)
    names = [f"w{i:03d}" for i in range(150)]
    with Session(engine) as session:
        registered_with(
            session,
            "wide",
            snapshot(
                1,
                nodes=[node(n, gpu_model="H100" if i % 2 else "L40S") for i, n in enumerate(names)],
                jobs=[running(f"j{i}", n, [i % 8], team=f"t{i % 3}") for i, n in enumerate(names)],
            ),
            now=NOW,
        )
        tokens = tokens_for(session, NOW, ("viewer",))
    app = app_on(engine, Settings(environment="test", data_dir=data))
    app.dependency_overrides[get_clock] = lambda: FrozenClock(NOW)
    with serve(app) as base:
        yield {"base": base, "tokens": tokens, "nodes": names}
    engine.dispose()


def test_a_map_drawn_in_chunks_is_one_grid_with_every_cell(
    page: Page, wide: dict[str, Any]
) -> None:
    names = wide["nodes"]
    _open_map(page, wide, 1)
    view = page.locator("#gpu-map")
    expect(view).to_have_attribute("data-drawn", "all")
    # A filter chosen, then a new reply drawn by chunks: the rows put in after the first
    # ones are drawn hidden too (not shown until a filter pass).
    page.select_option("#map-model", "H100")
    page.evaluate(
        """() => {
          const view = document.querySelector("#gpu-map");
          delete view.dataset.drawn;
          document.querySelector("#node-cluster").dispatchEvent(new Event("change"));
        }"""
    )
    expect(view).to_have_attribute("data-drawn", "all")
    grid = page.get_by_role("grid")
    # Every node a row, in order, numbered for assistive technology; every GPU a cell.
    rows = page.locator("#gpu-map .gpu-row")
    expect(rows).to_have_count(len(names))
    assert rows.evaluate_all("(rows) => rows.map((r) => r.dataset.node)") == names
    assert rows.evaluate_all("(rows) => rows.map((r) => Number(r.ariaRowIndex))") == list(
        range(1, len(names) + 1)
    )
    expect(view).to_have_attribute("aria-rowcount", str(len(names)))
    h100 = [n for i, n in enumerate(names) if i % 2]
    shown = page.locator("#gpu-map .gpu-row:not([hidden])")
    expect(shown).to_have_count(len(h100))
    assert shown.evaluate_all("(rows) => rows.map((r) => r.dataset.node)") == h100
    expect(grid.get_by_role("row")).to_have_count(len(h100))
    expect(grid.get_by_role("gridcell")).to_have_count(8 * len(h100))
    expect(page.locator("#map-summary")).to_contain_text(f"{len(h100)} of {len(names)} nodes")
    expect(page.locator('.gpu-row[data-node="w149"] .gpu').nth(5)).to_have_accessible_name(
        "w149 GPU 5 · job j149 · team t2 · utilization not measured"
    )
    # A filter changed once the first rows are in, before the chunks: theirs follow it. The
    # first rows (60) are put in alone; the rest come after they are painted.
    first_rows = page.evaluate(
        """() => new Promise((done) => {
          const view = document.querySelector("#gpu-map");
          const chooser = document.querySelector("#map-model");
          new MutationObserver((_, observer) => {
            if (view.dataset.drawn !== "partly") return;
            observer.disconnect();
            chooser.value = "L40S";
            chooser.dispatchEvent(new Event("change"));
            done(view.querySelectorAll(".gpu-row").length);
          }).observe(view, { attributes: true, attributeFilter: ["data-drawn"] });
          delete view.dataset.drawn;
          document.querySelector("#node-cluster").dispatchEvent(new Event("change"));
        })"""
    )
    assert first_rows == 60
    expect(view).to_have_attribute("data-drawn", "all")
    l40s = [n for i, n in enumerate(names) if not i % 2]
    expect(shown).to_have_count(len(l40s))
    assert shown.evaluate_all("(rows) => rows.map((r) => r.dataset.node)") == l40s
    page.select_option("#map-model", "H100")
    expect(shown).to_have_count(len(h100))
    # The keyboard crosses from the first rows into the chunks' rows and to the last one.
    page.locator('.gpu-row[data-node="w059"] .gpu').nth(2).focus()
    for key, expected in (
        ("ArrowDown", ("w061", 2)),
        ("PageDown", ("w081", 2)),
        ("Control+End", ("w149", 7)),
        ("ArrowUp", ("w147", 7)),
    ):
        page.keyboard.press(key)
        assert _focused(page) == expected, key
        assert _tab_stop(page) == [expected], key
