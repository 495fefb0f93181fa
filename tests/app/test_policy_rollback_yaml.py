"""Rolling an SLA policy back to an earlier version, and its spec as a YAML document for
GitOps (export, import), on both backends; every change audited."""

from __future__ import annotations

from typing import Any

import yaml
from fastapi.testclient import TestClient
from sqlmodel import Session

from app.core.clock import FrozenClock
from app.policies.models import SlaPolicy, SlaPolicySpec
from app.shaping.snapshot import take_snapshot

FIRST = {"teams": [{"team": "vision", "guaranteed_gpus": 16, "max_queue_wait_s": 3600}]}
SECOND = {
    "teams": [{"team": "vision", "guaranteed_gpus": 32}, {"team": "nlp", "priority_weight": 2}],
    "services": [{"service": "chat-api", "min_replicas": 2}],
}
YAML = {"Content-Type": "application/yaml"}


def _stored(spec: dict[str, Any]) -> dict[str, Any]:
    return SlaPolicySpec.model_validate(spec).model_dump(mode="json")


def _two_versions(client: TestClient, auth: dict, name: str = "alpha") -> None:
    created = client.post(
        "/api/v1/policies", headers=auth["operator"], json={"name": name, "spec": FIRST}
    )
    assert created.status_code == 201, created.text
    edited = client.put(f"/api/v1/policies/{name}", headers=auth["operator"], json={"spec": SECOND})
    assert edited.json()["version"] == 2


def _audit(client: TestClient, auth: dict) -> list[dict[str, Any]]:
    response = client.get(
        "/api/v1/audit", params={"object_type": "sla_policy"}, headers=auth["admin"]
    )
    items: list[dict[str, Any]] = response.json()["items"]
    return items


def test_a_rollback_appends_a_version_with_the_earlier_terms_that_the_next_cycle_reads(
    client: TestClient, auth: dict, session: Session, clock: FrozenClock
) -> None:
    client.post(
        "/api/v1/clusters", headers=auth["admin"], json={"name": "alpha", "scheduler": "sim"}
    )
    _two_versions(client, auth)
    assert take_snapshot(session=session, cluster_name="alpha", now=clock.now()).sla == _stored(
        SECOND
    )

    rolled = client.post(
        "/api/v1/policies/alpha/rollback", headers=auth["operator"], json={"version": 1}
    )
    assert rolled.status_code == 200, rolled.text
    assert rolled.json()["version"] == 3
    assert rolled.json()["comment"] == "rolled back to version 1"
    versions = client.get("/api/v1/policies/alpha/versions", headers=auth["viewer"]).json()
    assert [v["version"] for v in versions] == [1, 2, 3]
    assert versions[2]["spec"] == versions[0]["spec"]
    assert versions[1]["spec"] == _stored(SECOND)  # history is never rewritten
    session.expire_all()
    assert take_snapshot(session=session, cluster_name="alpha", now=clock.now()).sla == _stored(
        FIRST
    )

    record = next(e for e in _audit(client, auth) if e["action"] == "sla_policy.rollback")
    assert record["actor_name"] == "operator" and record["object_id"] == "alpha"
    assert record["changes"]["version"] == [2, 3]
    assert record["changes"]["rolled_back_to"] == 1
    assert record["changes"]["teams"] == [["nlp", "vision"], ["vision"]]


def test_a_rollback_is_refused_to_viewers_unknown_versions_and_the_current_terms(
    client: TestClient, auth: dict
) -> None:
    _two_versions(client, auth)
    url = "/api/v1/policies/alpha/rollback"
    assert client.post(url, json={"version": 1}).status_code == 401
    assert client.post(url, headers=auth["viewer"], json={"version": 1}).status_code == 403

    unknown = client.post(url, headers=auth["operator"], json={"version": 7})
    assert unknown.status_code == 404
    assert unknown.json()["error"]["message"] == "SLA policy 'alpha' version 7 does not exist"
    nowhere = client.post(
        "/api/v1/policies/nope/rollback", headers=auth["operator"], json={"version": 1}
    )
    assert nowhere.status_code == 404

    current = client.post(url, headers=auth["operator"], json={"version": 2})
    assert current.status_code == 409
    assert "nothing to roll back" in current.json()["error"]["message"]
    bad = client.post(url, headers=auth["operator"], json={"version": 0})
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "version"
    assert [
        v["version"]
        for v in client.get("/api/v1/policies/alpha/versions", headers=auth["viewer"]).json()
    ] == [1, 2]

    # Back to 1, then to 2 again: a rollback is a version like any, and so undoable.
    assert client.post(url, headers=auth["operator"], json={"version": 1}).json()["version"] == 3
    again = client.post(url, headers=auth["operator"], json={"version": 1})
    assert again.status_code == 409  # version 3 has version 1's terms
    undone = client.post(url, headers=auth["operator"], json={"version": 2, "comment": "undo"})
    assert undone.json()["version"] == 4 and undone.json()["comment"] == "undo"

    client.delete("/api/v1/policies/alpha", headers=auth["operator"])
    deleted = client.post(url, headers=auth["operator"], json={"version": 1})
    assert deleted.status_code == 404 and "was deleted" in deleted.json()["error"]["message"]


def test_export_then_import_is_the_same_spec_and_writes_no_version(
    client: TestClient, auth: dict
) -> None:
    _two_versions(client, auth)
    exported = client.get("/api/v1/policies/alpha/export", headers=auth["viewer"])
    assert exported.status_code == 200, exported.text
    assert exported.headers["content-type"] == "application/yaml"
    assert 'filename="alpha-v2.yaml"' in exported.headers["content-disposition"]
    assert exported.text.startswith("# SLA policy alpha, version 2\n")
    assert yaml.safe_load(exported.text) == _stored(SECOND)
    older = client.get("/api/v1/policies/alpha/export?version=1", headers=auth["viewer"])
    assert yaml.safe_load(older.text) == _stored(FIRST)

    unchanged = client.post(
        "/api/v1/policies/alpha/import", headers={**auth["operator"], **YAML}, content=older.text
    )
    assert unchanged.status_code == 200 and unchanged.json()["version"] == 3
    assert unchanged.json()["spec"] == _stored(FIRST)
    assert unchanged.json()["comment"] == "imported from YAML"
    # The same file again (as every GitOps sync applies it): nothing new.
    for _ in range(2):
        same = client.post(
            "/api/v1/policies/alpha/import",
            headers={**auth["operator"], **YAML},
            content=older.text,
        )
        assert same.status_code == 200 and same.json()["version"] == 3
    versions = client.get("/api/v1/policies/alpha/versions", headers=auth["viewer"]).json()
    assert [v["version"] for v in versions] == [1, 2, 3]

    # Hand-written YAML, with comments and defaults left out, reads as the JSON API would.
    handwritten = (
        "# research gets more\nteams:\n  - team: research\n    guaranteed_gpus: 8\n"
        "    deadline: 2026-12-01T00:00:00Z\n"
    )
    written = client.post(
        "/api/v1/policies/alpha/import?comment=from%20git",
        headers={**auth["operator"], **YAML},
        content=handwritten,
    )
    assert written.status_code == 200, written.text
    assert written.json()["version"] == 4 and written.json()["comment"] == "from git"
    assert written.json()["spec"] == _stored(
        {"teams": [{"team": "research", "guaranteed_gpus": 8, "deadline": "2026-12-01T00:00:00Z"}]}
    )
    actions = [e["action"] for e in _audit(client, auth)]
    assert actions.count("sla_policy.update") == 1  # the PUT
    assert actions.count("sla_policy.import") == 2  # not the same file applied again


def test_bad_yaml_is_refused_naming_the_field_or_the_line(client: TestClient, auth: dict) -> None:
    _two_versions(client, auth)
    url = "/api/v1/policies/alpha/import"
    headers = {**auth["operator"], **YAML}

    def refused(document: str) -> dict[str, Any]:
        response = client.post(url, headers=headers, content=document)
        assert response.status_code == 422, response.text
        error: dict[str, Any] = response.json()["error"]
        return error

    syntax = refused("teams:\n  - team: a\n    guaranteed_gpus: [8\n")
    assert syntax["field"] == "body" and syntax["details"]["line"] == 4
    assert syntax["message"].startswith("body: not YAML at line 4, column 1:")

    negative = refused("services: []\nteams:\n  - team: a\n  - team: b\n    guaranteed_gpus: -1\n")
    assert negative["field"] == "spec.teams[1].guaranteed_gpus"
    assert negative["details"]["line"] == 5
    assert negative["message"].count("spec.teams[1].guaranteed_gpus") == 1
    assert "(line 5)" in negative["message"]

    unknown = refused("teams:\n  - team: a\n    gpus: 3\n")
    assert unknown["field"] == "spec.teams[0].gpus" and unknown["details"]["line"] == 3
    twice = refused("teams:\n  - team: a\n  - team: a\n")
    assert twice["field"] == "spec" and "appears twice" in twice["message"]
    # Dates are read by the model, as JSON's are: an impossible one names its field.
    date = refused("teams:\n  - team: a\n    deadline: 2026-13-45T00:00:00Z\n")
    assert date["field"] == "spec.teams[0].deadline" and date["details"]["line"] == 3
    assert refused("teams: " + "[" * 5000)["message"] == (
        "body: nested too deeply for an SLA policy spec"
    )
    assert refused("")["field"] == "spec"
    assert refused("- team: a\n")["field"] == "spec"
    assert refused("teams: []\n---\nteams: []\n")["field"] == "body"
    latin1 = client.post(url, headers=headers, content="teams: [{team: caf\xe9}]".encode("latin-1"))
    assert latin1.status_code == 422 and latin1.json()["error"]["field"] == "body"

    # The same refusals the JSON API makes, and nothing written by any of them.
    assert (
        client.post(url, headers={**auth["viewer"], **YAML}, content="teams: []").status_code == 403
    )
    assert client.post(url, content="teams: []").status_code == 401
    missing = client.post("/api/v1/policies/nope/import", headers=headers, content="teams: []")
    assert missing.status_code == 404
    assert client.get("/api/v1/policies/nope/export", headers=auth["viewer"]).status_code == 404
    huge = client.post(url, headers=headers, content="# " + "x" * 300 * 1024)
    assert huge.status_code == 413
    versions = client.get("/api/v1/policies/alpha/versions", headers=auth["viewer"]).json()
    assert [v["version"] for v in versions] == [1, 2]


def test_a_preview_says_what_an_import_would_change_and_writes_nothing(
    client: TestClient, auth: dict
) -> None:
    _two_versions(client, auth)
    url = "/api/v1/policies/alpha/import/preview"
    document = "teams:\n  - team: vision\n    guaranteed_gpus: 32\n"
    # A viewer may check a file (a CI job before merging); only an operator may import.
    preview = client.post(url, headers={**auth["viewer"], **YAML}, content=document)
    assert preview.status_code == 200, preview.text
    body = preview.json()
    assert body["current_version"] == 2 and body["changed"] is True
    assert body["current_spec"] == _stored(SECOND)
    assert body["spec"] == _stored({"teams": [{"team": "vision", "guaranteed_gpus": 32}]})
    exported = client.get("/api/v1/policies/alpha/export", headers=auth["viewer"]).text
    same = client.post(url, headers={**auth["viewer"], **YAML}, content=exported).json()
    assert same["changed"] is False and same["spec"] == same["current_spec"]
    bad = client.post(url, headers={**auth["viewer"], **YAML}, content="teams: [{team: 3}]")
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "spec.teams[0].team"
    assert client.post(url, content=document).status_code == 401
    versions = client.get("/api/v1/policies/alpha/versions", headers=auth["viewer"]).json()
    assert [v["version"] for v in versions] == [1, 2]


def test_anchors_aliases_and_thousands_of_bad_keys_are_refused_in_a_short_answer(
    client: TestClient, auth: dict
) -> None:
    # The preview is a viewer's: a document anyone may send must not cost the server
    # what it states after expansion. 13 kB naming one team 1,000 times through an alias
    # would be a million fields to validate; it is refused where the anchor is.
    _two_versions(client, auth)
    url = "/api/v1/policies/alpha/import/preview"
    headers = {**auth["viewer"], **YAML}
    fields = ", ".join(f"k{k}: 1" for k in range(1000))
    bomb = f"x: &a {{team: t, {fields}}}\nteams: [{', '.join(['*a'] * 1000)}]\n"
    refused = client.post(url, headers=headers, content=bomb)
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["field"] == "body" and error["details"] == {"line": 1, "column": 4}
    assert error["message"].startswith("body: an anchor or alias (&name, *name) at line 1,")
    alias = client.post(url, headers=headers, content="teams:\n  - team: a\n  - *b\n")
    assert alias.status_code == 422 and alias.json()["error"]["details"]["line"] == 3

    # Without aliases, one team with 20,000 unknown keys: the first 20 listed with their
    # lines, the rest counted.
    document = "teams:\n- team: a\n" + "".join(f"  k{k}: 1\n" for k in range(20_000))
    many = client.post(url, headers=headers, content=document)
    assert many.status_code == 422, many.text
    error = many.json()["error"]
    assert error["field"] == "spec.teams[0].k0" and error["details"]["line"] == 3
    listed = error["details"]["errors"]
    assert [(e["field"], e["line"]) for e in listed] == [
        (f"spec.teams[0].k{k}", k + 3) for k in range(20)
    ]
    assert error["details"]["more_errors"] == 19_980
    assert "19980 more errors after the 20 in details.errors" in error["message"]


def test_a_rollback_to_a_version_todays_schema_refuses_is_a_422_naming_the_version(
    client: TestClient, auth: dict, session: Session, clock: FrozenClock
) -> None:
    # Versions written before today's schema, straight into the table: one a field since
    # removed makes invalid, one that only lacks fields added since.
    for name, spec in (
        ("old", {"teams": [{"team": "vision", "gpus": 4}]}),
        ("terse", {"teams": [{"team": "vision"}]}),
    ):
        session.add(
            SlaPolicy(name=name, version=1, spec=spec, created_at=clock.now(), created_by="x")
        )
        session.commit()
        edited = client.put(
            f"/api/v1/policies/{name}", headers=auth["operator"], json={"spec": SECOND}
        )
        assert edited.status_code == 200, edited.text

    refused = client.post(
        "/api/v1/policies/old/rollback", headers=auth["operator"], json={"version": 1}
    )
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["field"] == "version"
    assert error["message"].startswith(
        "version: version 1 of SLA policy 'old' states terms that are not valid today "
        "(spec.teams[0].gpus: Extra inputs are not permitted)"
    )
    versions = client.get("/api/v1/policies/old/versions", headers=auth["viewer"]).json()
    assert [v["version"] for v in versions] == [1, 2]

    rolled = client.post(
        "/api/v1/policies/terse/rollback", headers=auth["operator"], json={"version": 1}
    )
    assert rolled.status_code == 200, rolled.text
    assert rolled.json()["spec"] == _stored({"teams": [{"team": "vision"}]})  # defaults filled
