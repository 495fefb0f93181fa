"""The two ways to talk to Slurm: its CLI (JSON output, munge auth) and slurmrestd (JWT).

Both turn every failure into :class:`ConnectorError` with ``retryable`` set: the controller
being unreachable is retryable, a missing binary, a refused token or an unknown API is not.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from connectors.base import ConnectorError
from connectors.slurm.config import SlurmConnectorConfig
from connectors.slurm.versions import is_data_parser

logger = logging.getLogger(__name__)

Document = dict[str, Any]
RunCommand = Callable[..., subprocess.CompletedProcess[str]]

# Messages of Slurm's CLI that mean "the controller (or munge) is not reachable right now".
_TRANSIENT_MARKERS = (
    "unable to contact slurm controller",
    "connection refused",
    "socket timed out",
    "zero bytes were transmitted",
    "communication connection failure",
    "backup controller",
    "munge",
    "slurm_receive_msg",
    "resource temporarily unavailable",
)


def is_transient(message: str) -> bool:
    lowered = message.lower()
    return any(marker in lowered for marker in _TRANSIENT_MARKERS)


class SlurmCli:
    """Runs Slurm's commands with the cluster's environment (``SLURM_CONF``)."""

    def __init__(self, config: SlurmConnectorConfig, *, run: RunCommand = subprocess.run) -> None:
        self._config = config
        self._run = run
        self._env = dict(os.environ)
        if config.slurm_conf is not None:
            self._env["SLURM_CONF"] = str(config.slurm_conf)

    def _binary(self, name: str) -> str:
        return str(self._config.bin_dir / name) if self._config.bin_dir else name

    def run(
        self,
        args: Sequence[str],
        *,
        what: str,
        input: str | None = None,
        clean_env: Mapping[str, str] | None = None,
    ) -> str:
        """Run a Slurm command; ``input`` goes to its stdin. ``clean_env``: run it in that
        environment (plus ``SLURM_CONF``) instead of the connector's — sbatch hands its
        environment to the job, and the connector's holds its own secrets."""
        command = [self._binary(args[0]), *args[1:]]
        env = self._env
        if clean_env is not None:
            env = dict(clean_env)
            if self._config.slurm_conf is not None:
                env["SLURM_CONF"] = str(self._config.slurm_conf)
        try:
            result = self._run(
                command,
                capture_output=True,
                text=True,
                env=env,
                timeout=self._config.timeout_s,
                check=False,
                **({"input": input} if input is not None else {}),
            )
        except FileNotFoundError:
            raise ConnectorError(
                f"{what}: {command[0]!r} not found; install slurm-client or set bin_dir",
                retryable=False,
            ) from None
        except subprocess.TimeoutExpired:
            raise ConnectorError(
                f"{what}: {' '.join(command)} timed out after {self._config.timeout_s} s",
                retryable=True,
            ) from None
        if result.returncode != 0:
            message = (result.stderr or result.stdout).strip() or f"exit {result.returncode}"
            raise ConnectorError(f"{what}: {message}", retryable=is_transient(message))
        return result.stdout

    def read_json(self, args: Sequence[str], *, what: str) -> Document:
        output = self.run(args, what=what)
        try:
            document = json.loads(output)
        except json.JSONDecodeError as error:
            # Slurm prints partial output when the controller goes away mid-answer.
            raise ConnectorError(f"{what}: output is not JSON ({error})", retryable=True) from None
        if not isinstance(document, dict):
            raise ConnectorError(f"{what}: output is not a JSON object", retryable=False)
        return document

    def token(self, *, username: str, lifespan_s: int) -> str:
        output = self.run(
            ["scontrol", "token", f"username={username}", f"lifespan={lifespan_s}"],
            what="scontrol token",
        )
        for line in output.splitlines():
            if line.startswith("SLURM_JWT="):
                return line.removeprefix("SLURM_JWT=").strip()
        raise ConnectorError("scontrol token: no SLURM_JWT in its output", retryable=False)


class SlurmRest:
    """GET requests to slurmrestd with ``X-SLURM-USER-NAME``/``X-SLURM-USER-TOKEN``."""

    def __init__(
        self,
        config: SlurmConnectorConfig,
        *,
        cli: SlurmCli,
        transport: httpx.BaseTransport | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if config.rest_url is None:
            raise ValueError("SlurmRest needs rest_url")
        self._config = config
        self._cli = cli
        self._monotonic = monotonic
        self._minted: tuple[str, float] | None = None
        self._http = httpx.Client(
            base_url=config.rest_url.rstrip("/"), timeout=config.timeout_s, transport=transport
        )

    def close(self) -> None:
        self._http.close()

    def _token(self) -> str:
        config = self._config
        if config.rest_token is not None:
            return config.rest_token.get_secret_value()
        if config.rest_token_file is not None:
            try:
                token = Path(config.rest_token_file).read_text().strip()
            except OSError as error:
                raise ConnectorError(
                    f"slurmrestd token file {config.rest_token_file}: {error}", retryable=True
                ) from None
            if not token:
                # slurmrestd would answer an empty token like an unreachable slurmctld.
                raise ConnectorError(
                    f"slurmrestd token file {config.rest_token_file} is empty", retryable=True
                )
            return token
        # Renew at half the lifespan so a token never expires between mint and use.
        now = self._monotonic()
        if self._minted is None or now - self._minted[1] > config.rest_token_lifespan_s / 2:
            token = self._cli.token(
                username=config.rest_user, lifespan_s=config.rest_token_lifespan_s
            )
            self._minted = (token, now)
        return self._minted[0]

    def get(self, endpoint: str) -> Document:
        path = f"/slurm/{self._config.rest_api_version}/{endpoint}"
        what = f"slurmrestd GET {path}"
        for attempt in (1, 2):
            headers = {
                "X-SLURM-USER-NAME": self._config.rest_user,
                "X-SLURM-USER-TOKEN": self._token(),
            }
            try:
                response = self._http.get(path, headers=headers)
            except httpx.HTTPError as error:
                raise ConnectorError(f"{what}: {error!r}", retryable=True) from None
            if response.status_code in (401, 403) and self._minted is not None and attempt == 1:
                self._minted = None  # a minted token may have been revoked: mint once more
                continue
            break
        if response.status_code >= 500:
            # slurmrestd answers a rejected JWT like an unreachable slurmctld (500, "Unspecified
            # error"), so a minted token is minted afresh next time (e.g. after a key rotation).
            self._minted = None
        return self._decode(response, what=what)

    def _decode(self, response: httpx.Response, *, what: str) -> Document:
        status = response.status_code
        if status in (401, 403):
            raise ConnectorError(
                f"{what}: slurmrestd refused the JWT for user {self._config.rest_user!r} "
                f"({status}: {response.text[:200]})",
                retryable=False,
            )
        if status == 404:
            version = self._config.rest_api_version
            served_by = (
                f"openapi/{version} among the plugins of its -s option (Slurm 22.05)"
                if not is_data_parser(version)
                else f"data_parser/{version}, which its -d option may leave out (Slurm 23.11+)"
            )
            raise ConnectorError(
                f"{what}: not found; does slurmrestd serve {version}: {served_by}?",
                retryable=False,
            )
        try:
            document = response.json()
        except ValueError:
            raise ConnectorError(
                f"{what}: {status} with a body that is not JSON: {response.text[:200]!r}",
                retryable=status >= 500,
            ) from None
        if status >= 500:
            errors = document.get("errors") if isinstance(document, dict) else None
            detail = errors or response.text[:200]
            raise ConnectorError(f"{what}: {status} {detail}", retryable=True)
        if status >= 400:
            raise ConnectorError(f"{what}: {status} {response.text[:300]}", retryable=False)
        if not isinstance(document, dict):
            raise ConnectorError(f"{what}: answer is not a JSON object", retryable=False)
        return document
