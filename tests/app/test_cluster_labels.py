"""Cluster labels and a team's ``cluster_selector`` (issue 16, data residency): labels
through the API and the migration, and the federation what-if keeping a team's pending
jobs to the clusters of its group whose labels match its selector — and a job's own
residency, which must permit the cluster too."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlmodel import Session

from app.core import migrate
from app.core.clock import FrozenClock
from app.core.db import make_engine
from app.tokens import service as token_service
from app.tokens.models import ApiTokenCreate
from tests.app.builders import job, node, running, snapshot

CLUSTERS = "/api/v1/clusters"
GROUPS = "/api/v1/federation-groups"
SPEC = {"scheduler": "sim", "native": {"gpus": 8, "runtime_s": 3600}}


def _cluster(client: TestClient, auth: dict, name: str, labels: dict[str, str]) -> None:
    response = client.post(
        CLUSTERS, headers=auth["admin"], json={"name": name, "scheduler": "sim", "labels": labels}
    )
    assert response.status_code == 201, response.text


def test_labels_round_trip_and_a_patch_replaces_the_whole_map(
    client: TestClient, auth: dict
) -> None:
    labels = {
        "region": "eu-west",
        "site": "ams1",
        "topology.kubernetes.io/zone": "a",
        "x": "",
        "Rack": "R1",
    }
    _cluster(client, auth, "alpha", labels)
    assert client.get(f"{CLUSTERS}/alpha", headers=auth["viewer"]).json()["labels"] == labels
    assert client.get(CLUSTERS, headers=auth["viewer"]).json()[0]["labels"] == labels

    untouched = client.patch(f"{CLUSTERS}/alpha", headers=auth["operator"], json={"mode": "advise"})
    assert untouched.json()["labels"] == labels
    replaced = client.patch(
        f"{CLUSTERS}/alpha", headers=auth["operator"], json={"labels": {"region": "eu-central"}}
    )
    assert replaced.status_code == 200, replaced.text
    assert replaced.json()["labels"] == {"region": "eu-central"}
    cleared = client.patch(f"{CLUSTERS}/alpha", headers=auth["operator"], json={"labels": {}})
    assert cleared.json()["labels"] == {}
    assert client.get(f"{CLUSTERS}/alpha", headers=auth["viewer"]).json()["labels"] == {}

    audit = client.get(
        "/api/v1/audit", headers=auth["admin"], params={"object_type": "cluster"}
    ).json()
    changes = [r["changes"] for r in audit["items"] if r["action"] == "cluster.update"]
    assert {"labels": [labels, {"region": "eu-central"}]} in changes
    assert {"labels": [{"region": "eu-central"}, {}]} in changes


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        ({"_region": "eu"}, "key '_region'"),
        ({"region-": "eu"}, "key 'region-'"),
        ({"a" * 64: "eu"}, "its name must be 1-63"),
        ({"Bad_Prefix/region": "eu"}, "its prefix must be a DNS subdomain"),
        ({"/region": "eu"}, "its prefix"),
        ({"region": "eu west"}, "value 'eu west' of 'region'"),
        ({"region": "-eu"}, "value '-eu'"),
        ({"region": "e" * 64}, "value 'eee"),
        ({f"k{i}": "v" for i in range(33)}, "at most 32 labels, not 33"),
    ],
)
def test_a_bad_label_is_refused_naming_the_field_and_nothing_is_stored(
    client: TestClient, auth: dict, labels: dict[str, str], message: str
) -> None:
    refused = client.post(CLUSTERS, headers=auth["admin"], json={"name": "alpha", "labels": labels})
    assert refused.status_code == 422
    error = refused.json()["error"]
    assert error["field"] == "labels" and message in error["message"]
    assert client.get(CLUSTERS, headers=auth["viewer"]).json() == []

    _cluster(client, auth, "alpha", {"region": "eu"})
    patched = client.patch(f"{CLUSTERS}/alpha", headers=auth["operator"], json={"labels": labels})
    assert patched.status_code == 422 and patched.json()["error"]["field"] == "labels"
    stored = client.get(f"{CLUSTERS}/alpha", headers=auth["viewer"]).json()
    assert stored["labels"] == {"region": "eu"}


def test_thirty_two_labels_are_enough(client: TestClient, auth: dict) -> None:
    _cluster(client, auth, "alpha", {f"k{i}": "v" for i in range(32)})


def test_a_bad_cluster_selector_is_refused_naming_the_field(client: TestClient, auth: dict) -> None:
    spec = {"teams": [{"team": "vision", "cluster_selector": {"region": "eu west"}}]}
    refused = client.post(
        "/api/v1/policies", headers=auth["operator"], json={"name": "alpha", "spec": spec}
    )
    assert refused.status_code == 422
    assert refused.json()["error"]["field"] == "spec.teams[0].cluster_selector"
    spec = {"teams": [{"team": "vision", "cluster_selector": {"region": "eu"}}]}
    created = client.post(
        "/api/v1/policies", headers=auth["operator"], json={"name": "alpha", "spec": spec}
    )
    assert created.status_code == 201, created.text
    assert created.json()["spec"]["teams"][0]["cluster_selector"] == {"region": "eu"}


# Three clusters in one group: alpha (eu) is full with a job waiting, beta (us) idle,
# gamma (eu) full or idle as the test pushes it.
LABELS = {"alpha": {"region": "eu", "site": "ams1"}, "beta": {"region": "us"}}
LABELS["gamma"] = {"region": "eu", "site": "fra1"}


@pytest.fixture
def three(
    client: TestClient, auth: dict, session: Session, clock: FrozenClock
) -> dict[str, dict[str, str]]:
    for name, labels in LABELS.items():
        _cluster(client, auth, name, labels)
    client.post(GROUPS, headers=auth["admin"], json={"name": "site"})
    for name in LABELS:
        added = client.put(f"{GROUPS}/site/clusters/{name}", headers=auth["admin"])
        assert added.status_code == 200, added.text
    gamma = token_service.create_token(
        session=session,
        now=clock.now(),
        token_in=ApiTokenCreate(name="connector_gamma", scopes=["connector:gamma"]),
    ).token
    return {**auth, "connector_gamma": {"Authorization": f"Bearer {gamma}"}}


FULL = [running("big", "n1", list(range(8)))]


def _push(client: TestClient, auth: dict, cluster: str, seq: int, jobs: list[Any]) -> None:
    body = snapshot(seq, nodes=[node("n1")], jobs=jobs)
    response = client.post(
        f"{CLUSTERS}/{cluster}/telemetry", headers=auth[f"connector_{cluster}"], json=body
    )
    assert response.status_code == 200, response.text


def _policy(client: TestClient, auth: dict, cluster: str, team: dict[str, Any]) -> None:
    spec = {"teams": [{"team": "vision", **team}]}
    exists = client.get(f"/api/v1/policies/{cluster}", headers=auth["viewer"]).status_code == 200
    if exists:
        answer = client.put(
            f"/api/v1/policies/{cluster}", headers=auth["operator"], json={"spec": spec}
        )
    else:
        answer = client.post(
            "/api/v1/policies", headers=auth["operator"], json={"name": cluster, "spec": spec}
        )
    assert answer.status_code in (200, 201), answer.text


def _targets(client: TestClient, auth: dict) -> tuple[int, list[str]]:
    answer = client.post(f"{GROUPS}/site/what-if", headers=auth["viewer"])
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert all(m["job"] == "waiting" and m["from_cluster"] == "alpha" for m in body["moves"])
    return body["movable_jobs"], [m["to_cluster"] for m in body["moves"]]


def test_a_selector_keeps_a_waiting_job_to_the_clusters_of_its_region(
    client: TestClient, three: dict
) -> None:
    auth = three
    _push(client, auth, "alpha", 1, [*FULL, job("waiting", gpus_requested=8, submit=SPEC)])
    _push(client, auth, "beta", 1, [])
    _push(client, auth, "gamma", 1, FULL)

    _policy(client, auth, "alpha", {"cluster_selector": {"region": "eu"}})
    # gamma is the only eu cluster it may go to, and it is full: the idle us one is no way.
    assert _targets(client, auth) == (1, [])
    _push(client, auth, "gamma", 2, [])
    assert _targets(client, auth) == (1, ["gamma"])
    _policy(client, auth, "alpha", {"cluster_selector": {"region": "eu", "site": "ams1"}})
    assert _targets(client, auth) == (0, [])  # only its own cluster matches

    # Both rules must let it go: by name beta only, by labels gamma only.
    _policy(
        client,
        auth,
        "alpha",
        {"allowed_clusters": ["beta", "gamma"], "cluster_selector": {"region": "eu"}},
    )
    assert _targets(client, auth) == (1, ["gamma"])
    _policy(
        client, auth, "alpha", {"allowed_clusters": ["beta"], "cluster_selector": {"region": "eu"}}
    )
    assert _targets(client, auth) == (0, [])

    # Without a selector it may go to either idle cluster, or to the us one when the eu
    # one is full.
    _policy(client, auth, "alpha", {})
    movable, targets = _targets(client, auth)
    assert movable == 1 and len(targets) == 1 and targets[0] in ("beta", "gamma")
    _push(client, auth, "gamma", 3, FULL)
    assert _targets(client, auth) == (1, ["beta"])

    # Labels changed on the cluster count at the next plan.
    patched = client.patch(
        f"{CLUSTERS}/beta", headers=auth["operator"], json={"labels": {"region": "eu"}}
    )
    assert patched.status_code == 200, patched.text
    _policy(client, auth, "alpha", {"cluster_selector": {"region": "eu"}})
    assert _targets(client, auth) == (1, ["beta"])


@pytest.mark.usefixtures("three")
def test_members_whose_selectors_for_a_team_differ_are_refused_naming_both(
    client: TestClient, auth: dict
) -> None:
    _policy(client, auth, "alpha", {"cluster_selector": {"region": "eu"}})
    _policy(client, auth, "gamma", {"cluster_selector": {"region": "eu"}})
    agreed = client.post(f"{GROUPS}/site/what-if", headers=auth["viewer"])
    assert agreed.status_code == 200, agreed.text

    _policy(client, auth, "beta", {})  # no rule where alpha has one: a disagreement
    refused = client.post(f"{GROUPS}/site/what-if", headers=auth["viewer"])
    assert refused.status_code == 422
    error = refused.json()["error"]
    assert error["field"] == "group"
    assert error["message"] == (
        "federation group 'site': team 'vision' has a different cluster_selector in alpha and beta"
    )


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
def test_clusters_written_before_labels_get_an_empty_map_and_keep_their_rows(
    backend: str, make_postgres_database: Any, tmp_path: Any
) -> None:
    url = (
        make_postgres_database("labels")
        if backend == "postgres"
        else f"sqlite:///{tmp_path / 'labels.db'}"
    )
    migrate.upgrade(url, "ab6c7d8e9f56")
    engine = make_engine(url)
    now = "now()" if backend == "postgres" else "CURRENT_TIMESTAMP"
    with engine.begin() as connection:
        connection.execute(
            sa.text(
                "INSERT INTO clusters (name, scheduler, description, mode, policy,"
                f" connector_status, created_at) VALUES ('a', 'slurm', '', 'observe', 'shaper',"
                f" 'never_seen', {now})"
            )
        )
        # A node of it: recreating ``clusters`` on SQLite would cascade into it.
        connection.execute(
            sa.text(
                "INSERT INTO nodes (cluster_id, name, gpu_count, cpu_cores, memory_mib, labels,"
                f" state, updated_at) VALUES (1, 'n1', 8, 64, 1024, '{{}}', 'up', {now})"
            )
        )
    migrate.upgrade(url)
    with engine.connect() as connection:
        labels = connection.execute(sa.text("SELECT labels FROM clusters")).scalar_one()
        nodes = connection.execute(sa.text("SELECT count(*) FROM nodes")).scalar_one()
    engine.dispose()
    assert labels in ({}, "{}") and nodes == 1
    migrate.downgrade(url, "ab6c7d8e9f56")


# A job's own residency (JobReport.residency, tests/app/test_job_residency.py for the wire
# and the views): on top of its team's rule, by labels and by name.
EU = {"cluster_selector": {"region": "eu"}}


def _waiting(residency: dict[str, Any] | None) -> dict[str, Any]:
    fields = {"residency": residency} if residency is not None else {}
    return job("waiting", gpus_requested=8, submit=SPEC, **fields)


def _what_if(client: TestClient, auth: dict) -> tuple[list[str], list[str]]:
    """Where the group plan starts alpha's waiting job, and why it stays home if it does."""
    answer = client.post(f"{GROUPS}/site/what-if", headers=auth["viewer"])
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert all(m["job"] == "waiting" and m["from_cluster"] == "alpha" for m in body["moves"])
    whys = [s["why"] for s in body["stays_home_examples"] if s["job"] == "waiting"]
    return [m["to_cluster"] for m in body["moves"]], whys


def test_a_job_kept_in_its_region_stays_home_while_a_cluster_elsewhere_is_idle(
    client: TestClient, three: dict
) -> None:
    auth = three
    _push(client, auth, "beta", 1, [])
    _push(client, auth, "gamma", 1, FULL)
    # Without a rule of its own, the job goes to the idle us cluster.
    _push(client, auth, "alpha", 1, [*FULL, _waiting(None)])
    assert _what_if(client, auth) == (["beta"], [])

    # Kept in the eu: gamma is its only way out, and gamma is full; beta is idle.
    _push(client, auth, "alpha", 2, [*FULL, _waiting(EU)])
    assert _what_if(client, auth) == ([], [])  # it may go to gamma: not a stay-home
    _push(client, auth, "gamma", 2, [])
    assert _what_if(client, auth) == (["gamma"], [])

    # A selector no other member matches: it stays home, and the plan says why.
    _push(client, auth, "alpha", 3, [*FULL, _waiting({"cluster_selector": {"site": "ams1"}})])
    assert _what_if(client, auth) == (
        [],
        ["its own residency (cluster_selector site=ams1) lets it go to none of beta, gamma"],
    )
    # By name: only beta, which its labels exclude.
    both = {**EU, "allowed_clusters": ["alpha", "beta"]}
    _push(client, auth, "alpha", 4, [*FULL, _waiting(both)])
    assert _what_if(client, auth) == (
        [],
        [
            "its own residency (cluster_selector region=eu; allowed_clusters [alpha, beta]) "
            "lets it go to none of beta, gamma"
        ],
    )


def test_the_job_and_its_team_must_both_permit_the_cluster(client: TestClient, three: dict) -> None:
    auth = three
    _push(client, auth, "beta", 1, [])
    _push(client, auth, "gamma", 1, [])
    _policy(client, auth, "alpha", {"allowed_clusters": ["beta"]})
    # The team may go to beta only, the job to the eu only: nowhere.
    _push(client, auth, "alpha", 1, [*FULL, _waiting(EU)])
    assert _what_if(client, auth) == (
        [],
        ["its own residency (cluster_selector region=eu) lets it go to none of beta"],
    )
    _push(client, auth, "alpha", 2, [*FULL, _waiting({"allowed_clusters": ["beta", "gamma"]})])
    assert _what_if(client, auth) == (["beta"], [])
