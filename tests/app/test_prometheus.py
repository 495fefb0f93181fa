"""A real Prometheus (Debian's package, as a plain process) scrapes a running Shaper with
a viewer token; PromQL then reads back what the test built. Every query of the Grafana
dashboard in deploy/grafana/ is run against it too: valid PromQL over metrics that exist."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine
from sqlmodel import Session, select

from app.actions.models import Action, ActionKind, ActionState
from app.clusters import service as cluster_service
from app.clusters.models import ClusterCreate
from app.core import migrate
from app.core.db import make_engine
from app.core.lookup import row_id
from app.forecasts import service as forecast_service
from app.forecasts.models import RuntimePrediction, ServiceForecast
from app.gpu_models import service as gpu_model_service
from app.jobs.models import Job
from app.shaping.cycle import run_cycle
from app.telemetry import service as telemetry_service
from forecast.demand import Method
from tests.app.builders import job, node, running, snapshot
from tests.support.live_server import app_on, free_port, serve, tokens_for
from wire.telemetry import SchedulerKind, TelemetrySnapshot

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "shaper-dashboard.json"
WAIT_S = 60.0


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    url = f"sqlite:///{tmp_path / 'shaper.db'}"
    migrate.upgrade(url)
    engine = make_engine(url)
    with Session(engine) as session:
        gpu_model_service.ensure_default_catalogue(session=session)
        session.commit()
    yield engine
    engine.dispose()


def _prometheus_binary() -> str:
    found = shutil.which("prometheus")
    if found is None:
        pytest.fail("no prometheus binary: `make test` installs it (scripts/prometheus.sh)")
    return found


class Prometheus:
    def __init__(self, root: Path, target: str, token: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        (root / "token").write_text(token)
        (root / "token").chmod(0o600)
        (root / "prometheus.yml").write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            "  - job_name: shaper\n"
            "    metrics_path: /metrics\n"
            f"    authorization: {{credentials_file: {root / 'token'}}}\n"
            f"    static_configs: [{{targets: ['{target}']}}]\n"
        )
        self.log = root / "prometheus.log"
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                [
                    _prometheus_binary(),
                    f"--config.file={root / 'prometheus.yml'}",
                    f"--storage.tsdb.path={root / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()

    def query(self, promql: str) -> dict[str, Any]:
        response = httpx.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=10)
        body = response.json()
        assert body["status"] == "success", (promql, body)
        return body["data"]

    def wait_for(self, promql: str) -> list[dict[str, Any]]:
        deadline = time.monotonic() + WAIT_S
        while True:
            assert self.process.poll() is None, self.log.read_text()[-3000:]
            try:
                result = self.query(promql)["result"]
            except (httpx.HTTPError, ValueError):  # not listening, or not ready yet
                result = []
            if result:
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"no data for {promql}:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.5)


def _plan_and_a_finished_migration(engine: Engine) -> None:
    """A plan (solve time, gap) and one migration that took 90 s, so that every family
    the dashboard reads has samples."""
    now = datetime.now(UTC)
    with Session(engine) as session:
        run_cycle(session=session, cluster_name="alpha", now=now, policy="shaper")
        j1 = session.exec(select(Job).where(Job.external_id == "j1")).one()
        session.add(
            Action(
                cluster_id=j1.cluster_id,
                job_id=j1.id,
                kind=ActionKind.migrate,
                state=ActionState.succeeded,
                idempotency_key="prometheus-test:migrate",
                created_at=now - timedelta(seconds=100),
                updated_at=now,
                decided_at=now - timedelta(seconds=90),
                finished_at=now,
            )
        )
        session.commit()


def _scored_forecasts(engine: Engine) -> None:
    """Cluster beta: a service's forecasts of the last three hours, scored, and a block
    job whose run time was predicted, finished an hour ago:

    ======  ====  =====  =====  ======  =======  =======  =======
    hours   mean  upper  naive  actual  |error|  |naive|  covered
    ======  ====  =====  =====  ======  =======  =======  =======
    −3      4     5      3      5       1        2        yes
    −2      6     7      6      5       1        1        yes
    −1      5     6      7      7       2        0        no
    ======  ====  =====  =====  ======  =======  =======  =======

    MAE 4/3, naive MAE 1: skill −1/3; coverage 2/3. The job ran 2 h, predicted 3 h, naive
    2.5 h: errors 1 h and 0.5 h, 50 %."""
    now = datetime.now(UTC)
    hour = forecast_service.hour_of(now)
    end = now - timedelta(hours=1)
    start = end - timedelta(hours=2)
    service = job(
        "svc",
        shape="elastic",
        state="running",
        gpus_requested=1,
        min_replicas=1,
        max_replicas=4,
        replicas=1,
        submit_time=start.isoformat(),
        start_time=start.isoformat(),
        allocations=[{"node": "b1", "gpu_indices": [0]}],
    )
    done = job(
        "done",
        state="finished",
        submit_time=start.isoformat(),
        start_time=start.isoformat(),
        end_time=end.isoformat(),
    )
    with Session(engine) as session:
        cluster_service.register_cluster(
            session=session,
            now=now,
            cluster_in=ClusterCreate(name="beta", scheduler=SchedulerKind.sim),
        )
        telemetry_service.ingest(
            session=session,
            cluster_name="beta",
            push=TelemetrySnapshot.model_validate(
                snapshot(1, nodes=[node("b1")], jobs=[service, done])
            ),
            now=now,
        )
        rows = {j.external_id: j for j in session.exec(select(Job).where(Job.team == "vision"))}
        scored = {3: (4, 5, 3, 5), 2: (6, 7, 6, 5), 1: (5, 6, 7, 7)}
        for ago, (mean, upper, naive, actual) in scored.items():
            target = hour - timedelta(hours=ago)
            session.add(
                ServiceForecast(
                    cluster_id=rows["svc"].cluster_id,
                    job_id=row_id(rows["svc"]),
                    target_hour=target,
                    made_at=target - timedelta(minutes=55),
                    method=Method.ets,
                    quantile=0.9,
                    mean=mean,
                    upper=upper,
                    naive=naive,
                    actual=actual,
                    scored_at=target + timedelta(minutes=65),
                )
            )
        session.add(
            RuntimePrediction(
                cluster_id=rows["done"].cluster_id,
                job_id=row_id(rows["done"]),
                predicted_at=start,
                predicted_s=3 * 3600,
                naive_s=2.5 * 3600,
            )
        )
        session.commit()


def test_prometheus_scrapes_shaper_and_the_dashboard_queries_work(
    engine: Engine, tmp_path: Path
) -> None:
    with Session(engine) as session:
        tokens = tokens_for(session, datetime.now(UTC), ["admin", "viewer", "connector:alpha"])
        session.commit()
    with serve(app_on(engine)) as base:
        admin = {"Authorization": f"Bearer {tokens['admin']}"}
        created = httpx.post(
            f"{base}/api/v1/clusters", headers=admin, json={"name": "alpha", "scheduler": "slurm"}
        )
        assert created.status_code in (200, 201), created.text
        now = datetime.now(UTC).replace(microsecond=0).isoformat()
        pushed = httpx.post(
            f"{base}/api/v1/clusters/alpha/telemetry",
            headers={"Authorization": f"Bearer {tokens['connector:alpha']}"},
            json=snapshot(
                1,
                nodes=[node("n1"), node("n2")],
                jobs=[
                    running("j1", "n1", [0, 1, 2]),
                    job("big", gpus_requested=8),
                ],
                samples=[{"at": now, "metric": "gpu_util", "node": "n1", "value": 0.4}],
            ),
            # The first push on a fresh SQLite database under a full two-worker suite took
            # more than httpx's 5 s once (a CI run, 2026-12-06); it is not what is tested.
            timeout=30,
        )
        assert pushed.status_code == 200, pushed.text
        _plan_and_a_finished_migration(engine)

        prometheus = Prometheus(tmp_path, base.removeprefix("http://"), tokens["viewer"])
        try:
            (up,) = prometheus.wait_for('up{job="shaper"} == 1')
            assert up["value"][1] == "1"
            (allocated,) = prometheus.wait_for('shaper_gpus{cluster="alpha",state="allocated"}')
            assert allocated["metric"]["gpu_model"] == "H100"
            assert float(allocated["value"][1]) == 3
            (free,) = prometheus.query('sum(shaper_gpus{state="free"})')["result"]
            assert float(free["value"][1]) == 13
            (queued,) = prometheus.query("shaper_queue_jobs")["result"]
            assert float(queued["value"][1]) == 1
            prometheus.wait_for("shaper_http_request_duration_seconds_count")
            (busy,) = prometheus.query("shaper_gpu_busy_ratio")["result"]
            assert float(busy["value"][1]) == 0.4
            (mean,) = prometheus.query(
                "shaper_migration_duration_seconds_sum / shaper_migration_duration_seconds_count"
            )["result"]
            assert float(mean["value"][1]) == 90

            # The dashboard: every query parses and names only metric families Shaper
            # declares (a family may have no sample yet, e.g. the gap of a greedy plan).
            dashboard = json.loads(DASHBOARD.read_text())
            # The forecast panels, over scored forecasts: each has data, and the skill and
            # the run-time errors are the figures worked out by hand.
            _scored_forecasts(engine)
            panels = {panel["title"]: panel for panel in dashboard["panels"]}
            forecast = [
                target["expr"].replace("$cluster", "beta")
                for panel in dashboard["panels"]
                for target in panel["targets"]
                if re.search(r"shaper_(forecast|duration)_", target["expr"])
            ]
            assert len(forecast) >= 9
            for expr in forecast:
                prometheus.wait_for(expr)

            def beta(title: str, target: int = 0) -> list[dict[str, Any]]:
                expr = panels[title]["targets"][target]["expr"]
                result: list[dict[str, Any]] = prometheus.query(expr.replace("$cluster", "beta"))[
                    "result"
                ]
                return result

            (skill,) = beta("Demand forecast skill by service (1 − MAE / naive MAE)")
            assert skill["metric"]["service"] == "svc"
            assert float(skill["value"][1]) == pytest.approx(-1 / 3, abs=1e-6)
            (covered,) = beta("Demand coverage vs SLA target quantile, by service")
            assert float(covered["value"][1]) == pytest.approx(2 / 3, abs=1e-6)
            errors = "Run-time prediction MAE vs team median, by cluster"
            (model,), (naive,) = beta(errors, 0), beta(errors, 1)
            assert (float(model["value"][1]), float(naive["value"][1])) == pytest.approx((1, 0.5))
            (pct,) = beta("Run-time prediction median absolute % error, by cluster")
            assert float(pct["value"][1]) == pytest.approx(0.5)
            scraped = httpx.get(
                f"{base}/metrics", headers={"Authorization": f"Bearer {tokens['viewer']}"}
            ).text
            exported = set(re.findall(r"^# HELP (\S+)", scraped, flags=re.MULTILINE))
            expressions = [
                target["expr"] for panel in dashboard["panels"] for target in panel["targets"]
            ]
            assert len(expressions) >= 10
            for expr in expressions:
                promql = expr.replace("$cluster", ".*")
                prometheus.query(promql)  # status "success", or the assertion names it
                for name in re.findall(r"\b(shaper_[a-z_]+)", promql):
                    family = re.sub(r"_(bucket|sum|count)$", "", name)
                    assert family in exported, f"{name} in {expr!r} is not exported"
            variable = dashboard["templating"]["list"][0]["definition"]
            assert re.match(r"label_values\((shaper_[a-z_]+), cluster\)", variable)
        finally:
            prometheus.stop()
