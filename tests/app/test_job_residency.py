"""A job's own residency (issue 16): the clusters of its federation group it may run in, as
its connector reports it (``JobReport.residency``), stored on the job, shown by the job
views and validated (422 naming the field, nothing stored). The federation what-if honours
it beside its team's rule: tests/app/test_cluster_labels.py."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.app.builders import job, snapshot

CLUSTERS = "/api/v1/clusters"
EU = {"cluster_selector": {"region": "eu"}}


def _cluster(client: TestClient, auth: dict, name: str, labels: dict[str, str]) -> None:
    response = client.post(
        CLUSTERS, headers=auth["admin"], json={"name": name, "scheduler": "sim", "labels": labels}
    )
    assert response.status_code == 201, response.text


def _jobs(client: TestClient, auth: dict) -> dict[str, dict[str, Any]]:
    page = client.get("/api/v1/jobs", headers=auth["viewer"], params={"cluster": "alpha"})
    assert page.status_code == 200, page.text
    return {j["external_id"]: j for j in page.json()["items"]}


def test_the_job_views_show_its_residency_and_a_push_changes_it(
    client: TestClient, auth: dict
) -> None:
    _cluster(client, auth, "alpha", {})
    url, headers = f"{CLUSTERS}/alpha/telemetry", auth["connector_alpha"]
    named = {"cluster_selector": {"region": "eu", "site": "ams1"}, "allowed_clusters": ["beta"]}
    body = snapshot(1, jobs=[job("eu", residency=named), job("free")])
    assert client.post(url, headers=headers, json=body).status_code == 200
    jobs = _jobs(client, auth)
    assert jobs["eu"]["residency"] == named and jobs["free"]["residency"] is None
    one = client.get(f"/api/v1/jobs/{jobs['eu']['id']}", headers=auth["viewer"]).json()
    assert one["residency"] == named

    # A later push replaces it (a delta carries the whole job), or takes it away.
    body = snapshot(2, jobs=[job("eu", residency=EU), job("free", residency={})])
    assert client.post(url, headers=headers, json=body).status_code == 200
    jobs = _jobs(client, auth)
    assert jobs["eu"]["residency"] == {**EU, "allowed_clusters": None}
    assert jobs["free"]["residency"] == {"cluster_selector": {}, "allowed_clusters": None}
    body = snapshot(3, jobs=[job("eu"), job("free")])
    assert client.post(url, headers=headers, json=body).status_code == 200
    assert {j["residency"] for j in _jobs(client, auth).values()} == {None}


@pytest.mark.parametrize(
    ("residency", "field", "message"),
    [
        ({"cluster_selector": {"region": "eu west"}}, "cluster_selector", "value 'eu west'"),
        ({"cluster_selector": {"_region": "eu"}}, "cluster_selector", "key '_region'"),
        (
            {"cluster_selector": {f"k{i}": "v" for i in range(33)}},
            "cluster_selector",
            "at most 32 labels",
        ),
        ({"allowed_clusters": ["Alpha"]}, "allowed_clusters[0]", "pattern"),
        ({"allowed_clusters": "alpha"}, "allowed_clusters", "list"),
        ({"region": "eu"}, "region", "Extra inputs"),
    ],
)
def test_a_bad_residency_is_refused_naming_the_field_and_nothing_is_stored(
    client: TestClient, auth: dict, residency: dict[str, Any], field: str, message: str
) -> None:
    _cluster(client, auth, "alpha", {})
    url, headers = f"{CLUSTERS}/alpha/telemetry", auth["connector_alpha"]
    body = snapshot(1, jobs=[job("ok"), job("bad", residency=residency)])
    refused = client.post(url, headers=headers, json=body)
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["field"] == f"jobs[1].residency.{field}"
    assert message in error["message"]
    assert _jobs(client, auth) == {}
