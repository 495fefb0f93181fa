"""Import a site's scheduler quotas as the cluster's Shaper SLA policy, marked as imported.

``shaper connector import-policies --kind kueue --cluster NAME --control-plane URL
[--set kubeconfig=PATH] [--set context=NAME] [--cluster-queue CQ …] [--selector LABELS]
[--policy NAME] [--replace] [--dry-run]``

1. Reads the ClusterQueues with the kubeconfig (``--set kubeconfig=…``, optionally
   ``--set context=…``) or, without one, in the cluster with the Pod's ServiceAccount —
   the Kueue connector's own options (connectors.kubernetes.config); all of them, or those
   named by ``--cluster-queue`` / matched by ``--selector``.
2. Translates them (connectors.kueue.policies: one team per ClusterQueue).
3. Reads the policy named like the cluster (the one its shaping applies; ``--policy`` to
   write another) and merges: the imported teams' Kueue terms replace theirs; the
   policy's other teams, its services and the teams' Shaper-only fields stay (``--replace``
   writes the imported spec alone).
4. Identical to the current version → nothing is written. Else ``POST`` (no policy yet,
   or a deleted one) or ``PUT`` a new version with the comment ``imported from Kueue
   ClusterQueues <names> of <context> (<server>) at <UTC time>``.

The token (``--token`` or ``SHAPER_OPERATOR_TOKEN``) needs the operator scope to write;
it is sent only as the Authorization header, never printed or logged. ``--dry-run``
prints the spec that would be written (merged with the current version when a control
plane and token are given) and writes nothing.

Exit status: 0 written or up to date, 1 refused or failed (the control plane's or the API
server's reason on stderr), 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import httpx
from kubernetes import client
from kubernetes import config as kube_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from pydantic import ValidationError

from connectors.base import ConnectorError
from connectors.kubernetes.client import api_client
from connectors.kubernetes.config import KubernetesConnectorConfig
from connectors.kueue.policies import ImportedPolicy, import_cluster_queues, merged_spec
from connectors.runner import option_argument

TOKEN_ENV = "SHAPER_OPERATOR_TOKEN"
KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta2"
MAX_COMMENT = 1024
POLICY_PATH = "/api/v1/policies"


class ImportFailed(Exception):
    """Why the import wrote nothing (a refused token, an unreachable server …)."""


@dataclass(frozen=True)
class Source:
    """The ClusterQueues read, and where from (for the comment)."""

    cluster_queues: list[dict[str, Any]]
    where: str


def read_cluster_queues(config: KubernetesConnectorConfig, *, selector: str | None) -> Source:
    """Every ClusterQueue (matching ``selector``), paginated, and a description of the
    API server: ``context <name> (<server>)`` or ``in-cluster (<server>)``."""
    api = api_client(kubeconfig=config.kubeconfig, context=config.context)
    try:
        custom = client.CustomObjectsApi(api)
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            page = custom.list_cluster_custom_object(
                KUEUE_GROUP,
                KUEUE_VERSION,
                "clusterqueues",
                label_selector=selector or "",
                limit=config.page_size,
                _continue=token or None,
            )
            items.extend(page.get("items", []))
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                break
        server = str(api.configuration.host)
    except ApiException as error:
        raise ImportFailed(
            f"cannot list ClusterQueues ({error.status} {error.reason}): {error.body}"
        ) from error
    except OSError as error:  # urllib3's connection errors are OSErrors
        raise ImportFailed(f"cannot reach the API server: {error}") from error
    finally:
        api.close()
    return Source(items, f"{_context_name(config)} ({server})")


def _context_name(config: KubernetesConnectorConfig) -> str:
    if config.kubeconfig is None:
        return "in-cluster"
    if config.context:
        return f"context {config.context}"
    try:
        _, active = kube_config.list_kube_config_contexts(config_file=str(config.kubeconfig))
    except (ConfigException, OSError):
        return f"kubeconfig {config.kubeconfig}"
    return f"context {active['name']}"


def comment_for(names: Sequence[str], where: str, now: datetime) -> str:
    """``imported from Kueue ClusterQueues a, b of <where> at <UTC time>``, the names
    shortened (``… and N more``) to fit the comment's 1,024 characters."""
    stamp = now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    listed = list(names)
    while True:
        more = len(names) - len(listed)
        shown = ", ".join(listed) + (f" and {more} more" if more else "")
        text = f"imported from Kueue ClusterQueues {shown} of {where} at {stamp}"
        if len(text) <= MAX_COMMENT or not listed:
            return text[:MAX_COMMENT]
        listed.pop()


@dataclass(frozen=True)
class Outcome:
    written: bool
    version: int | None
    spec: dict[str, Any]


class ControlPlane:
    """The policy API, over HTTP with a bearer token."""

    def __init__(
        self, url: str, token: str, *, transport: httpx.BaseTransport | None = None
    ) -> None:
        self.http = httpx.Client(
            base_url=url.rstrip("/"),
            headers={"Authorization": f"Bearer {token}"},
            timeout=30.0,
            transport=transport,
        )

    def close(self) -> None:
        self.http.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self.http.request(method, path, **kwargs)
        except httpx.HTTPError as error:
            raise ImportFailed(f"cannot reach the control plane: {error}") from error

    def current(self, name: str) -> dict[str, Any] | None:
        """The policy's current version, or None (none yet, or deleted)."""
        response = self._call("GET", f"{POLICY_PATH}/{quote(name, safe='')}")
        if response.status_code == 404:
            return None
        _raise_for(response, f"reading policy {name!r}")
        body: dict[str, Any] = response.json()
        return body

    def write(
        self, name: str, spec: dict[str, Any], comment: str, *, exists: bool
    ) -> dict[str, Any]:
        if exists:
            response = self._call(
                "PUT",
                f"{POLICY_PATH}/{quote(name, safe='')}",
                json={"spec": spec, "comment": comment},
            )
        else:
            response = self._call(
                "POST", POLICY_PATH, json={"name": name, "spec": spec, "comment": comment}
            )
        _raise_for(response, f"writing policy {name!r}")
        body: dict[str, Any] = response.json()
        return body


def _raise_for(response: httpx.Response, doing: str) -> None:
    if response.is_success:
        return
    try:
        error = response.json().get("error") or {}
        message = str(error.get("message") or response.text)
    except (ValueError, AttributeError):
        message = response.text
    hint = ""
    if response.status_code == 401:
        hint = f" (check --token / {TOKEN_ENV})"
    elif response.status_code == 403:
        hint = " (importing policies needs a token with the operator scope)"
    elif response.status_code == 409:
        hint = " (another edit wrote a version first; run the import again)"
    raise ImportFailed(f"{doing}: {response.status_code} {message}{hint}")


def import_policy(
    control_plane: ControlPlane,
    *,
    name: str,
    imported: ImportedPolicy,
    where: str,
    now: datetime,
    replace: bool = False,
) -> Outcome:
    """Create or version ``name`` with the imported teams; nothing when unchanged."""
    current = control_plane.current(name)
    spec = merged_spec(current["spec"] if current else None, imported.spec, replace=replace)
    if current is not None and spec == current["spec"]:
        return Outcome(written=False, version=int(current["version"]), spec=spec)
    comment = comment_for(imported.teams, where, now)
    written = control_plane.write(name, spec, comment, exists=current is not None)
    return Outcome(written=True, version=int(written["version"]), spec=spec)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="shaper connector import-policies",
        description="Import a site's Kueue ClusterQueues as the cluster's SLA policy.",
    )
    parser.add_argument("--kind", required=True, choices=["kueue"])
    parser.add_argument("--cluster", required=True, help="the Shaper cluster")
    parser.add_argument("--policy", help="the policy to write (default: named like the cluster)")
    parser.add_argument("--control-plane", metavar="URL", help="the control plane's URL")
    parser.add_argument("--token", default=None, help=f"an operator token (or {TOKEN_ENV})")
    parser.add_argument(
        "--set",
        type=option_argument,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="connector option, e.g. --set kubeconfig=/path --set context=NAME",
    )
    parser.add_argument(
        "--cluster-queue",
        action="append",
        default=[],
        metavar="NAME",
        help="import this ClusterQueue (repeatable; default: all)",
    )
    parser.add_argument("--selector", help="import the ClusterQueues with these labels")
    parser.add_argument(
        "--replace",
        action="store_true",
        help="write the imported teams alone (drop the policy's other teams and services)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print the spec that would be written"
    )
    args = parser.parse_args(argv)
    token = args.token or os.environ.get(TOKEN_ENV) or None
    if not args.dry_run and not args.control_plane:
        parser.error("--control-plane is required (unless --dry-run)")
    if args.control_plane and not token and not args.dry_run:
        parser.error(f"--token (or {TOKEN_ENV}) is required")
    policy = args.policy or args.cluster
    try:
        config = KubernetesConnectorConfig(cluster=args.cluster, **dict(args.set))
    except (ValidationError, TypeError) as error:
        print(f"import-policies: bad configuration: {error}", file=sys.stderr)
        return 2
    try:
        source = read_cluster_queues(config, selector=args.selector)
        only = set(args.cluster_queue) or None
        found = {str(cq["metadata"]["name"]) for cq in source.cluster_queues}
        missing = sorted((only or set()) - found)
        if missing:
            raise ImportFailed(f"no ClusterQueue {', '.join(missing)} on {source.where}")
        imported = import_cluster_queues(source.cluster_queues, only=only)
        if not imported.teams:
            raise ImportFailed(f"no ClusterQueue to import on {source.where}")
        for note in imported.notes:
            print(f"note: {note}", file=sys.stderr)
        now = datetime.now(UTC)
        if args.dry_run:
            spec = imported.spec
            if args.control_plane and token:
                plane = ControlPlane(args.control_plane, token)
                try:
                    current = plane.current(policy)
                finally:
                    plane.close()
                spec = merged_spec(current["spec"] if current else None, spec, replace=args.replace)
            print(json.dumps(spec, indent=2))
            print(f"comment: {comment_for(imported.teams, source.where, now)}", file=sys.stderr)
            return 0
        assert token is not None  # checked above
        plane = ControlPlane(args.control_plane, token)
        try:
            outcome = import_policy(
                plane,
                name=policy,
                imported=imported,
                where=source.where,
                now=now,
                replace=args.replace,
            )
        finally:
            plane.close()
    except (ImportFailed, ConnectorError) as error:
        print(f"import-policies: {error}", file=sys.stderr)
        return 1
    teams = ", ".join(imported.teams)
    if outcome.written:
        print(f"policy {policy}: version {outcome.version} written (teams {teams})")
    else:
        print(f"policy {policy}: up to date at version {outcome.version}; nothing written")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
