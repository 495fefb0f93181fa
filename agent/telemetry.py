"""Node telemetry from the agent: CPU and memory from /proc, GPUs through NVML.

GPU figures need NVIDIA's NVML bindings (`nvidia-ml-py`, module ``pynvml``) and a loaded
driver; on a node without them the agent reports CPU and memory only and says so once in
its log. Samples go to ``POST /api/v1/clusters/{cluster}/nodes/{node}/samples`` with the
node's ``agent:<cluster>/<node>`` token.
"""

from __future__ import annotations

import importlib
import logging
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from wire.telemetry import Metric, NodeSamples, SampleReport

log = logging.getLogger(__name__)


class NodeSampler:
    """Reads one node's utilization; CPU busy is measured between consecutive calls."""

    def __init__(self, node: str, *, proc: Path = Path("/proc")) -> None:
        self.node = node
        self.proc = proc
        self._last_cpu = self._cpu_times()
        self._nvml = _load_nvml()

    def _cpu_times(self) -> tuple[int, int]:
        """(busy, total) jiffies from the aggregate line of /proc/stat."""
        fields = [int(v) for v in (self.proc / "stat").read_text().splitlines()[0].split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        total = sum(fields[:8])  # guest time is already inside user/nice
        return total - idle, total

    def _memory_used_mib(self) -> float:
        info = {}
        for line in (self.proc / "meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            info[key] = int(rest.split()[0])  # kB
        return (info["MemTotal"] - info["MemAvailable"]) / 1024

    def sample(self, at: datetime | None = None) -> list[SampleReport]:
        at = at or datetime.now(UTC)
        busy, total = self._cpu_times()
        last_busy, last_total = self._last_cpu
        self._last_cpu = (busy, total)
        cpu = (busy - last_busy) / (total - last_total) if total > last_total else 0.0
        samples = [
            SampleReport(
                at=at, metric=Metric.cpu_util, node=self.node, value=min(max(cpu, 0.0), 1.0)
            ),
            SampleReport(
                at=at,
                metric=Metric.mem_used_mib,
                node=self.node,
                value=round(self._memory_used_mib(), 1),
            ),
        ]
        return samples + self._gpu_samples(at)

    def _gpu_samples(self, at: datetime) -> list[SampleReport]:
        if self._nvml is None:
            return []
        nvml = self._nvml
        samples = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            rates = nvml.nvmlDeviceGetUtilizationRates(handle)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            samples += [
                SampleReport(
                    at=at,
                    metric=Metric.gpu_util,
                    node=self.node,
                    gpu_index=index,
                    value=rates.gpu / 100,
                ),
                SampleReport(
                    at=at,
                    metric=Metric.gpu_mem_used_gib,
                    node=self.node,
                    gpu_index=index,
                    value=memory.used / 2**30,
                ),
            ]
        return samples


def _load_nvml() -> Any | None:
    try:
        nvml = importlib.import_module("pynvml")
        nvml.nvmlInit()
    except Exception as exc:  # no bindings, no driver or no GPU: CPU and memory only
        log.info("no GPU telemetry on this node (NVML unavailable: %s)", exc)
        return None
    return nvml


def push_samples(
    samples: list[SampleReport],
    *,
    control_plane: str,
    cluster: str,
    node: str,
    token: str,
    transport: httpx.BaseTransport | None = None,
    timeout_s: float = 10.0,
) -> int:
    """POST the samples; returns how many the control plane accepted. Raises on HTTP errors."""
    url = (
        f"{control_plane.rstrip('/')}/api/v1/clusters/{quote(cluster, safe='')}"
        f"/nodes/{quote(node, safe='')}/samples"
    )
    body = NodeSamples(samples=samples).model_dump(mode="json")
    with httpx.Client(timeout=timeout_s, transport=transport) as client:
        response = client.post(url, json=body, headers={"Authorization": f"Bearer {token}"})
    response.raise_for_status()
    return int(response.json()["accepted"])


def run(
    *,
    control_plane: str,
    cluster: str,
    node: str,
    token: str,
    interval_s: float,
    cycles: int | None = None,
) -> None:
    """Sample and push every ``interval_s``; a failed push is logged and retried next time."""
    sampler = NodeSampler(node)
    done = 0
    while cycles is None or done < cycles:
        time.sleep(interval_s)
        try:
            push_samples(
                sampler.sample(),
                control_plane=control_plane,
                cluster=cluster,
                node=node,
                token=token,
            )
        except httpx.HTTPError as exc:
            log.warning("node telemetry push failed: %s", exc)
        done += 1
