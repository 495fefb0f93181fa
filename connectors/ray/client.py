"""The Ray head's REST APIs over HTTP: the state API, the Jobs API and Serve's API.

One :class:`httpx.Client` per connector (shareable between the telemetry and action
threads). Every failure becomes a :class:`ConnectorError`: the head unreachable, a
timeout, 429 and 5xx may pass on a retry; other 4xx will not, and the message names the
request. Answers are plain JSON (dicts and lists): connectors.ray.translate turns them
into Shaper's wire types.
"""

from __future__ import annotations

from typing import Any

import httpx

from connectors.base import ConnectorError
from connectors.ray.config import RayConnectorConfig

# What the state API lists, and the filter that keeps each list to what telemetry needs.
_STATE_FILTERS: dict[str, dict[str, str]] = {
    "nodes": {},
    "placement_groups": {},
    "actors": {"filter_keys": "state", "filter_predicates": "=", "filter_values": "ALIVE"},
    "tasks": {"filter_keys": "state", "filter_predicates": "=", "filter_values": "RUNNING"},
}


class RayHttpError(ConnectorError):
    """Ray answered a request with an error status."""

    def __init__(self, message: str, *, status: int, body: str) -> None:
        super().__init__(message, retryable=status == 429 or status >= 500)
        self.status = status
        self.body = body


class RayDashboard:
    def __init__(
        self, config: RayConnectorConfig, *, transport: httpx.BaseTransport | None = None
    ) -> None:
        self.config = config
        self.base = config.dashboard_url.rstrip("/")
        self._http = httpx.Client(base_url=self.base, timeout=config.timeout_s, transport=transport)

    def close(self) -> None:
        self._http.close()

    def request(self, method: str, path: str, *, what: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as error:
            raise ConnectorError(
                f"{what}: the Ray head at {self.base} is unreachable ({error!r})", retryable=True
            ) from error
        if response.status_code >= 400:
            body = response.text
            # Ray's dashboard answers a failed submission with a whole traceback: its last
            # line says what was wrong.
            last = next((line for line in reversed(body.splitlines()) if line.strip(".")), "")
            raise RayHttpError(
                f"{what}: Ray answered {response.status_code}: {last[:500]}",
                status=response.status_code,
                body=body,
            )
        try:
            return response.json()
        except ValueError as error:
            raise ConnectorError(
                f"{what}: Ray answered {response.status_code} with no JSON: {response.text[:200]}",
                retryable=True,
            ) from error

    # --- state API -------------------------------------------------------------------------

    def list_state(self, kind: str) -> list[dict[str, Any]]:
        """``/api/v0/<kind>?detail=1``, whole: a truncated or partial answer is an error, for
        telemetry must never push part of the cluster as if it were all of it."""
        what = f"list Ray {kind}"
        params = {"detail": "1", "limit": str(self.config.list_limit), **_STATE_FILTERS[kind]}
        document = self.request("GET", f"/api/v0/{kind}", what=what, params=params)
        try:
            data = document["data"]["result"]
            items: list[dict[str, Any]] = data["result"]
        except (KeyError, TypeError) as error:
            raise ConnectorError(
                f"{what}: unexpected answer {str(document)[:300]}", retryable=False
            ) from error
        if not document.get("result", True):
            raise ConnectorError(f"{what}: {document.get('msg')}", retryable=True)
        warning = data.get("partial_failure_warning")
        if warning:
            raise ConnectorError(f"{what}: Ray's answer is partial ({warning})", retryable=True)
        # "total" counts what Ray has before filters; "num_after_truncation" what it kept
        # of those before filtering: fewer means the limit cut the list.
        total = int(data.get("total", 0))
        kept = int(data.get("num_after_truncation", total))
        if total > kept:
            raise ConnectorError(
                f"{what}: Ray has {total}, its state API looked at {kept} "
                f"(list_limit {self.config.list_limit})",
                retryable=True,
            )
        return items

    # --- Jobs API --------------------------------------------------------------------------

    def list_jobs(self) -> list[dict[str, Any]]:
        jobs = self.request("GET", "/api/jobs/", what="list Ray jobs")
        if not isinstance(jobs, list):
            raise ConnectorError(
                f"list Ray jobs: unexpected answer {str(jobs)[:300]}", retryable=False
            )
        return jobs

    def submit_job(self, body: dict[str, Any]) -> str:
        answer = self.request(
            "POST", "/api/jobs/", what=f"submit Ray job {body.get('submission_id')}", json=body
        )
        return str(answer["submission_id"])

    def stop_job(self, submission_id: str) -> None:
        self.request(
            "POST", f"/api/jobs/{submission_id}/stop", what=f"stop Ray job {submission_id}"
        )

    # --- Serve -----------------------------------------------------------------------------

    def serve_applications(self) -> dict[str, dict[str, Any]]:
        """Serve's applications by name; none when Serve does not run on the cluster."""
        details = self.request("GET", "/api/serve/applications/", what="read Ray Serve")
        applications = details.get("applications") if isinstance(details, dict) else None
        return applications if isinstance(applications, dict) else {}

    def scale_deployment(self, application: str, deployment: str, replicas: int) -> None:
        self.request(
            "POST",
            f"/api/v1/applications/{application}/deployments/{deployment}/scale",
            what=f"scale Ray Serve deployment {deployment} of {application}",
            json={"target_num_replicas": replicas},
        )
