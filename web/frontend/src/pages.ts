// The pages not yet rebuilt on the new stack, ported from the first dashboard as they were,
// each behind a Latest so that a slower reply for an older selection is never drawn.

import { api, Latest } from "./api";
import { $, COLORS, esc, select } from "./dom";
import { figure, gapPercent, when } from "./format";
import { jobLink } from "./links";
import type { Action, Diagnosis, Page, Plan, Policy, SimulationListing, SimulationResult } from "./types";

export const pageState = { policies: {} as Record<string, Policy> };

const actionsRequest = new Latest();
const policiesRequest = new Latest();
const simulationsRequest = new Latest();
const idleRequest = new Latest();

export async function showActions(): Promise<void> {
  const { signal, current } = actionsRequest.begin();
  const [actions, plans] = await Promise.all([
    api<Page<Action>>("/actions?limit=100", { signal }),
    api<Page<Plan>>("/plans?limit=20", { signal }),
  ]);
  if (!current()) return;
  // #actions&action=N (the Federation page's links): that action's row is marked.
  const marked = new URLSearchParams(location.hash.slice(1)).get("action");
  $("#action-table tbody").innerHTML =
    actions.items
      .map(
        (a) => `<tr data-action="${a.id}"${String(a.id) === marked ? ' class="marked"' : ""}>
    <td>${a.id}</td><td>${esc(a.cluster)}${a.target_cluster ? ` → ${esc(a.target_cluster)}` : ""}</td><td>${esc(a.kind)}</td><td>${jobLink(a.job_id, a.job_external_id ?? "")}</td>
    <td>${esc(a.source_node || "")} → ${esc(a.target_node || (a.target_replicas ?? ""))}</td><td>${esc(a.state)}</td>
    <td>${a.plan_id == null ? "" : `${a.plan_id} <a href="#plan&id=${a.plan_id}" data-plan-link="${a.plan_id}" aria-label="Plan ${a.plan_id}">open</a>`}</td><td>${a.depends_on.map((d) => `#${d}`).join(" ")}</td>
    <td>${esc(a.reason)}${a.error ? `<br><span class="error">${esc(a.error)}</span>` : ""}</td>
    <td>${a.state === "proposed" ? `<button data-decide="approve" data-id="${a.id}">Approve</button> <button data-decide="reject" data-id="${a.id}">Reject</button>` : ""}</td></tr>`,
      )
      .join("") || '<tr><td colspan="10">No actions yet.</td></tr>';
  document.querySelector("#action-table tr.marked")?.scrollIntoView({ block: "center" });
  $("#plan-table tbody").innerHTML =
    plans.items
      .map(
        (p) => `<tr data-plan="${p.id}">
    <td><a href="#plan&id=${p.id}" data-plan-link="${p.id}">#${p.id}</a></td><td>${esc(p.cluster)}</td><td>${esc(when(p.created_at))}</td><td>${esc(p.policy)}</td><td>${esc(p.engine)}</td>
    <td>${esc(p.status)}</td><td>${esc(p.state)}${p.state_reason ? `<br><span class="hint">${esc(p.state_reason)}</span>` : ""}</td><td>${esc(figure(p.objective))}</td><td>${esc(gapPercent(p.gap))}</td>
    <td>${p.decisions
      .slice(0, 5)
      .map((d) => esc(`${d.job}: ${d.action} — ${d.reason}`))
      .join("<br>")}</td>
    <td>${p.state === "proposed" ? `<button data-plan-decide="approve" data-id="${p.id}">Approve plan</button> <button data-plan-decide="reject" data-id="${p.id}">Reject plan</button>` : ""}</td></tr>`,
      )
      .join("") || '<tr><td colspan="11">No plans yet.</td></tr>';
}

export async function showPolicies(): Promise<void> {
  const { signal, current } = policiesRequest.begin();
  const policies = await api<Policy[]>("/policies", { signal });
  if (!current()) return;
  $("#policy-list").innerHTML = policies.length
    ? `<table><thead><tr><th>Policy</th><th>Version</th><th>By</th><th>Comment</th><th></th></tr></thead><tbody>${policies
        .map(
          (p) => `<tr><td>${esc(p.name)}</td><td>${p.version}</td><td>${esc(p.created_by)}</td><td>${esc(p.comment)}</td>
      <td><button data-edit="${esc(p.name)}">Edit</button> <button data-policy-history="${esc(p.name)}">History</button></td></tr>`,
        )
        .join("")}</tbody></table>`
    : "<p>No SLA policies yet.</p>";
  pageState.policies = Object.fromEntries(policies.map((p) => [p.name, p]));
}

export async function showSimulations(): Promise<void> {
  const { signal, current } = simulationsRequest.begin();
  const results = await api<SimulationListing[]>("/simulations", { signal });
  if (!current()) return;
  const chooser = select("#sim-result");
  const chosen = chooser.value;
  chooser.innerHTML = results
    .map(
      (r) =>
        `<option value="${esc(r.name)}">${esc(r.scenario)}${r.seed == null ? "" : ` (seed ${r.seed})`} · ${esc(r.policies.join(", "))}</option>`,
    )
    .join("");
  if (results.some((r) => r.name === chosen)) chooser.value = chosen;
  $("#sim-none").hidden = results.length > 0;
  $("#sim-table").hidden = !results.length;
  if (!results.length) {
    $("#sim-chart").innerHTML = "";
    return;
  }
  const result = await api<SimulationResult>(`/simulations/${encodeURIComponent(chooser.value)}`, { signal });
  if (!current()) return;
  const runs = Object.entries(result.runs);
  const base = result.runs.fifo ? result.runs.fifo.metrics.utilization : null;
  const num = (v: number | null | undefined, digits = 1): string => (v == null ? "–" : Number(v).toFixed(digits));
  $("#sim-table tbody").innerHTML = runs
    .map(([policy, run]) => {
      const m = run.metrics;
      // Completion figures are lower bounds when some job never finished; the tail and the
      // end stand beside the mean (a mean alone flatters a policy that starves long jobs).
      const bound = m.jct_censored_jobs ? "≥ " : "";
      const jct = `${bound}${num(m.jct_mean_h)}`;
      const p99 = `${bound}${num(m.jct_p99_h)}`;
      const makespan = `${bound}${num(m.makespan_h)}`;
      const delta = base == null ? "" : `${m.utilization >= base ? "+" : ""}${(100 * (m.utilization - base)).toFixed(1)}`;
      return `<tr data-policy="${esc(policy)}"><td>${esc(policy)}</td><td>${num(100 * m.utilization)}</td><td>${delta}</td><td>${num(m.weighted_output)}</td>
      <td>${num(m.jobs_completed, 0)}/${num(m.jobs_arrived, 0)}</td><td>${jct}</td><td>${p99}</td><td>${makespan}</td><td>${num(m.unmet_demand_replica_hours)}</td>
      <td>${num(m.migrations, 0)}</td><td>${num(m.preemptions, 0)}</td></tr>`;
    })
    .join("");
  $("#sim-chart").innerHTML = simChart(runs);
}

export async function showIdle(): Promise<void> {
  const cluster = select("#idle-cluster").value;
  const { signal, current } = idleRequest.begin();
  if (!cluster) {
    $("#idle-summary").textContent = "No clusters.";
    return;
  }
  // No since/until: the server's last 24 h, by its own clock.
  const d = await api<Diagnosis>(`/diagnosis?cluster=${encodeURIComponent(cluster)}`, { signal });
  if (!current()) return;
  const hours = (v: number): string => Number(v).toFixed(1);
  const pct = (v: number, of: number): string => (of > 0 ? ((100 * v) / of).toFixed(1) : "–");
  $("#idle-summary").textContent =
    `${d.since.slice(0, 16).replace("T", " ")} – ${d.until.slice(0, 16).replace("T", " ")} UTC · ` +
    `capacity ${hours(d.capacity_gpu_hours)} GPU-h · busy ${hours(d.busy_gpu_hours)} · idle ${hours(d.idle_gpu_hours)} (${pct(d.idle_gpu_hours, d.capacity_gpu_hours)} %)`;
  $("#idle-table tbody").innerHTML =
    d.causes
      .map(
        (c) => `<tr data-cause="${esc(c.cause)}" data-gpu-hours="${esc(c.gpu_hours)}">
    <td>${esc(c.cause.replace(/_/g, " "))}</td><td>${hours(c.gpu_hours)}</td><td>${pct(c.gpu_hours, d.capacity_gpu_hours)}</td><td>${(100 * c.share_of_idle).toFixed(1)}</td></tr>`,
      )
      .join("") +
    `<tr class="total"><td>idle, all causes</td><td>${hours(d.idle_gpu_hours)}</td><td>${pct(d.idle_gpu_hours, d.capacity_gpu_hours)}</td><td>${d.idle_gpu_hours > 0 ? "100.0" : "–"}</td></tr>`;
  // GPU model × cause, causes in the API's order; only causes some model has hours of.
  const causes = d.causes
    .map((c) => c.cause)
    .filter((cause) => d.by_gpu_model.some((g) => g.cause === cause && g.gpu_hours > 0));
  const models = [...new Set(d.by_gpu_model.map((g) => g.key ?? ""))];
  const cell = Object.fromEntries(d.by_gpu_model.map((g) => [`${g.key ?? ""}|${g.cause}`, g.gpu_hours]));
  $("#idle-model-table thead").innerHTML =
    `<tr><th>GPU model</th>${causes.map((c) => `<th>${esc(c.replace(/_/g, " "))}</th>`).join("")}<th>idle</th></tr>`;
  $("#idle-model-table tbody").innerHTML =
    models
      .map((m) => {
        const values = causes.map((c) => cell[`${m}|${c}`] || 0);
        return `<tr data-gpu-model="${esc(m)}"><td>${esc(m || "—")}</td>${values.map((v) => `<td>${hours(v)}</td>`).join("")}<td>${hours(values.reduce((a, b) => a + b, 0))}</td></tr>`;
      })
      .join("") || "<tr><td>No idle GPU-hours in the window.</td></tr>";
}

function simChart(runs: [string, SimulationResult["runs"][string]][]): string {
  const width = 900,
    height = 260,
    left = 40,
    bottom = 24;
  const horizon = Math.max(...runs.map(([, r]) => r.t_h[r.t_h.length - 1] || 0), 1);
  const x = (t: number): number => left + (t / horizon) * (width - left - 10);
  const y = (v: number): number => 30 + (1 - Math.min(1, v)) * (height - bottom - 30);
  let svg = `<svg width="${width}" height="${height}" role="img" aria-label="Utilization over simulated time">`;
  for (const v of [0, 0.25, 0.5, 0.75, 1]) {
    svg += `<line x1="${left}" x2="${width - 10}" y1="${y(v)}" y2="${y(v)}" stroke="#e3e7ee"/><text x="4" y="${y(v) + 4}">${v * 100}%</text>`;
  }
  svg += `<text x="${left}" y="${height - 6}">0 h</text><text x="${width - 60}" y="${height - 6}">${horizon.toFixed(0)} h</text>`;
  runs.forEach(([policy, run], k) => {
    const color = COLORS[k % COLORS.length];
    const line = run.t_h.map((t, i) => `${x(t)},${y(run.utilization[i])}`).join(" ");
    svg += `<polyline class="sim-line" data-policy="${esc(policy)}" fill="none" stroke="${color}" stroke-width="2" points="${line}"/>`;
    svg += `<text x="${left + k * 140}" y="14" style="fill:${color}">■ ${esc(policy)}</text>`;
  });
  return svg + "</svg>";
}
