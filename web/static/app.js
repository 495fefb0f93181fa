// Shaper dashboard: a thin client of the REST API. The token lives in sessionStorage only.
"use strict";

const state = { token: null, clusters: [], jobOffset: 0, jobLimit: 50 };
const $ = (sel) => document.querySelector(sel);
const esc = (v) => String(v ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
const COLORS = ["#2f6fdf", "#d0542f", "#2a9d5b", "#8b4fd8", "#c08a00", "#0e8fa3", "#b53b7a"];

async function api(path, options = {}) {
  const response = await fetch(`/api/v1${path}`, {
    ...options,
    headers: { Authorization: `Bearer ${state.token}`, "Content-Type": "application/json", ...(options.headers || {}) },
  });
  if (response.status === 401) { signOut("The token was refused (missing, expired or revoked)."); throw new Error("unauthorized"); }
  const body = response.status === 204 ? null : await response.json();
  if (!response.ok) {
    const error = body && body.error ? body.error : { message: response.statusText };
    throw new Error(error.field ? `${error.field}: ${error.message}` : error.message);
  }
  return body;
}

function signOut(message) {
  sessionStorage.removeItem("shaper-token");
  state.token = null;
  document.querySelectorAll(".view").forEach((v) => (v.hidden = true));
  $("#login").hidden = false;
  $("#login-error").textContent = message || "";
}

async function signIn(token) {
  state.token = token;
  try {
    const me = await api("/whoami");
    sessionStorage.setItem("shaper-token", token);
    $("#whoami").textContent = `${me.name} · ${me.scopes.join(", ")}`;
    $("#login").hidden = true;
    state.clusters = await api("/clusters");
    for (const select of ["#node-cluster", "#job-cluster", "#idle-cluster"]) {
      const keep = select === "#job-cluster" ? '<option value="">all</option>' : "";
      $(select).innerHTML = keep + state.clusters.map((c) => `<option>${esc(c.name)}</option>`).join("");
    }
    route();
  } catch (error) {
    if (error.message !== "unauthorized") signOut(error.message);
  }
}

function route() {
  const view = (location.hash || "#overview").slice(1).split("&")[0] || "overview";
  document.querySelectorAll(".view").forEach((v) => (v.hidden = v.id !== view));
  document.querySelectorAll("#nav a").forEach((a) => a.classList.toggle("active", a.dataset.view === view));
  ({ overview: showOverview, nodes: showNodes, jobs: showJobs, actions: showActions, policies: showPolicies, simulations: showSimulations, idle: showIdle }[view] || showOverview)()
    .catch((error) => console.error(error));
}

async function showOverview() {
  $("#cluster-cards").innerHTML = state.clusters.map((c) => `
    <div class="card" data-cluster="${esc(c.name)}">
      <h3>${esc(c.name)} <span class="badge ${esc(c.connector_status)}">${esc(c.connector_status)}</span></h3>
      <div>${esc(c.scheduler)} · mode <b>${esc(c.mode)}</b> · policy ${esc(c.policy)}</div>
      <div class="big">${c.gpu_count} GPUs</div><div>${c.node_count} nodes</div>
      <div class="hint">${esc(c.description)}</div>
    </div>`).join("") || "<p>No clusters registered yet.</p>";
  const summary = await api(`/utilization?group_by=${$("#group-by").value}&bucket_s=1800`);
  $("#util-chart").innerHTML = chart(summary);
}

function chart(summary) {
  const width = 900, height = 260, left = 40, bottom = 24;
  const series = summary.series.filter((s) => s.points.length);
  if (!series.length) return "<p>No allocation history yet.</p>";
  const n = series[0].points.length;
  const x = (i) => left + (i / Math.max(1, n - 1)) * (width - left - 10);
  const y = (v) => 30 + (1 - Math.min(1, v)) * (height - bottom - 30);  // legend above
  let svg = `<svg width="${width}" height="${height}" role="img" aria-label="GPU allocation over time">`;
  for (const v of [0, 0.25, 0.5, 0.75, 1]) {
    svg += `<line x1="${left}" x2="${width - 10}" y1="${y(v)}" y2="${y(v)}" stroke="#e3e7ee"/><text x="4" y="${y(v) + 4}">${v * 100}%</text>`;
  }
  const first = new Date(series[0].points[0].start), last = new Date(series[0].points[n - 1].start);
  svg += `<text x="${left}" y="${height - 6}">${first.toISOString().slice(11, 16)} UTC</text><text x="${width - 80}" y="${height - 6}">${last.toISOString().slice(11, 16)} UTC</text>`;
  series.forEach((s, k) => {
    const color = COLORS[k % COLORS.length];
    const line = s.points.map((p, i) => `${x(i)},${y(p.allocated_share)}`).join(" ");
    svg += `<polyline class="allocated" data-key="${esc(s.key)}" fill="none" stroke="${color}" stroke-width="2" points="${line}"/>`;
    const measured = s.points.map((p, i) => (p.measured_util == null ? null : `${x(i)},${y(p.measured_util)}`)).filter(Boolean);
    if (measured.length > 1) svg += `<polyline fill="none" stroke="${color}" stroke-dasharray="4 3" points="${measured.join(" ")}"/>`;
    svg += `<text x="${left + k * 170}" y="14" style="fill:${color}">■ ${esc(s.key)} (${s.capacity_gpus} GPUs)</text>`;
  });
  return svg + "</svg>";
}

async function showNodes() {
  const cluster = $("#node-cluster").value;
  if (!cluster) { $("#gpu-map").innerHTML = "<p>No clusters.</p>"; return; }
  const [nodes, jobs] = await Promise.all([
    api(`/nodes?cluster=${encodeURIComponent(cluster)}&limit=1000&sort=name`),
    api(`/jobs?cluster=${encodeURIComponent(cluster)}&state=running&limit=1000`),
  ]);
  const holder = {};
  const counted = [];
  for (const job of jobs.items) for (const a of job.allocations) {
    if (a.gpu_indices.length) for (const i of a.gpu_indices) holder[`${a.node}/${i}`] = job.external_id;
    else counted.push([a, job.external_id]);
  }
  // Schedulers that only count GPUs (Kubernetes) name no device: show them on the
  // node's first cells no indexed job holds.
  const nodeSize = Object.fromEntries(nodes.items.map((n) => [n.name, n.gpu_count]));
  for (const [a, job] of counted) {
    let left = a.gpu_count;
    for (let i = 0; left > 0 && i < (nodeSize[a.node] || 0); i++) {
      if (!holder[`${a.node}/${i}`]) { holder[`${a.node}/${i}`] = job; left--; }
    }
  }
  $("#gpu-map").innerHTML = nodes.items.map((node) => {
    const gpus = Array.from({ length: node.gpu_count }, (_, i) => {
      const job = holder[`${node.name}/${i}`];
      return `<span class="gpu ${job ? "busy" : ""}" title="GPU ${i}${job ? ` · ${esc(job)}` : " · free"}"></span>`;
    }).join("");
    return `<div class="gpu-row ${esc(node.state)}"><span class="name">${esc(node.name)}</span>${gpus}<span class="hint">${esc(node.gpu_model || "no GPU")} · ${node.gpus_allocated}/${node.gpu_count} · ${esc(node.state)}</span></div>`;
  }).join("");
}

async function showJobs() {
  const params = new URLSearchParams({ limit: state.jobLimit, offset: state.jobOffset, sort: $("#job-sort").value });
  if ($("#job-cluster").value) params.set("cluster", $("#job-cluster").value);
  if ($("#job-state").value) params.set("state", $("#job-state").value);
  const page = await api(`/jobs?${params}`);
  $("#job-table tbody").innerHTML = page.items.map((j) => `<tr>
    <td>${esc(j.external_id)}</td><td>${esc(j.cluster)}</td><td>${esc(j.team)}</td><td>${esc(j.kind)}</td>
    <td>${j.priority}</td><td>${j.shape === "elastic" ? `${j.replicas}×${j.gpus_requested}` : j.gpus_requested}</td><td>${esc(j.state)}</td>
    <td>${j.allocations.map((a) => `${esc(a.node)}${a.gpu_indices.length ? `[${a.gpu_indices.join(",")}]` : `×${a.gpu_count}`}`).join(" ")}</td>
    <td>${j.submit_time ? esc(j.submit_time.slice(0, 16).replace("T", " ")) : ""}</td></tr>`).join("");
  const end = Math.min(page.offset + page.limit, page.total);
  $("#job-page").textContent = `${page.total ? page.offset + 1 : 0}–${end} of ${page.total}`;
  $("#job-prev").disabled = page.offset === 0;
  $("#job-next").disabled = end >= page.total;
}

async function showActions() {
  const [actions, plans] = await Promise.all([api("/actions?limit=100"), api("/plans?limit=20")]);
  $("#action-table tbody").innerHTML = actions.items.map((a) => `<tr>
    <td>${a.id}</td><td>${esc(a.cluster)}</td><td>${esc(a.kind)}</td><td>${esc(a.job_external_id)}</td>
    <td>${esc(a.source_node || "")} → ${esc(a.target_node || (a.target_replicas ?? ""))}</td><td>${esc(a.state)}</td>
    <td>${a.plan_id ?? ""}</td><td>${a.depends_on.map((d) => `#${d}`).join(" ")}</td>
    <td>${esc(a.reason)}${a.error ? `<br><span class="error">${esc(a.error)}</span>` : ""}</td>
    <td>${a.state === "proposed" ? `<button data-decide="approve" data-id="${a.id}">Approve</button> <button data-decide="reject" data-id="${a.id}">Reject</button>` : ""}</td></tr>`).join("")
    || '<tr><td colspan="10">No actions yet.</td></tr>';
  $("#plan-table tbody").innerHTML = plans.items.map((p) => `<tr data-plan="${p.id}">
    <td>${p.id}</td><td>${esc(p.cluster)}</td><td>${esc(p.created_at.slice(0, 19))}</td><td>${esc(p.policy)}</td><td>${esc(p.engine)}</td>
    <td>${esc(p.status)}</td><td>${esc(p.state)}${p.state_reason ? `<br><span class="hint">${esc(p.state_reason)}</span>` : ""}</td><td>${p.objective ?? ""}</td><td>${p.gap ?? ""}</td>
    <td>${p.decisions.slice(0, 5).map((d) => esc(`${d.job}: ${d.action} — ${d.reason}`)).join("<br>")}</td>
    <td>${p.state === "proposed" ? `<button data-plan-decide="approve" data-id="${p.id}">Approve plan</button> <button data-plan-decide="reject" data-id="${p.id}">Reject plan</button>` : ""}</td></tr>`).join("")
    || '<tr><td colspan="11">No plans yet.</td></tr>';
}

async function showPolicies() {
  const policies = await api("/policies");
  $("#policy-list").innerHTML = policies.length ? `<table><thead><tr><th>Policy</th><th>Version</th><th>By</th><th>Comment</th><th></th></tr></thead><tbody>${
    policies.map((p) => `<tr><td>${esc(p.name)}</td><td>${p.version}</td><td>${esc(p.created_by)}</td><td>${esc(p.comment)}</td>
      <td><button data-edit="${esc(p.name)}">Edit</button></td></tr>`).join("")}</tbody></table>` : "<p>No SLA policies yet.</p>";
  state.policies = Object.fromEntries(policies.map((p) => [p.name, p]));
}

async function showSimulations() {
  const results = await api("/simulations");
  const select = $("#sim-result"), chosen = select.value;
  select.innerHTML = results.map((r) => `<option value="${esc(r.name)}">${esc(r.scenario)}${r.seed == null ? "" : ` (seed ${r.seed})`} · ${esc(r.policies.join(", "))}</option>`).join("");
  if (results.some((r) => r.name === chosen)) select.value = chosen;
  $("#sim-none").hidden = results.length > 0;
  $("#sim-table").hidden = !results.length;
  if (!results.length) { $("#sim-chart").innerHTML = ""; return; }
  const result = await api(`/simulations/${encodeURIComponent(select.value)}`);
  const runs = Object.entries(result.runs);
  const base = result.runs.fifo ? result.runs.fifo.metrics.utilization : null;
  const num = (v, digits = 1) => (v == null ? "–" : Number(v).toFixed(digits));
  $("#sim-table tbody").innerHTML = runs.map(([policy, run]) => {
    const m = run.metrics;
    // Completion figures are lower bounds when some job never finished.
    const jct = m.jct_censored_jobs ? `≥ ${num(m.jct_mean_h)}` : num(m.jct_mean_h);
    const delta = base == null ? "" : `${m.utilization >= base ? "+" : ""}${(100 * (m.utilization - base)).toFixed(1)}`;
    return `<tr data-policy="${esc(policy)}"><td>${esc(policy)}</td><td>${num(100 * m.utilization)}</td><td>${delta}</td><td>${num(m.weighted_output)}</td>
      <td>${num(m.jobs_completed, 0)}/${num(m.jobs_arrived, 0)}</td><td>${jct}</td><td>${num(m.unmet_demand_replica_hours)}</td>
      <td>${num(m.migrations, 0)}</td><td>${num(m.preemptions, 0)}</td></tr>`;
  }).join("");
  $("#sim-chart").innerHTML = simChart(runs);
}

async function showIdle() {
  const cluster = $("#idle-cluster").value;
  if (!cluster) { $("#idle-summary").textContent = "No clusters."; return; }
  // No since/until: the server's last 24 h, by its own clock.
  const d = await api(`/diagnosis?cluster=${encodeURIComponent(cluster)}`);
  const hours = (v) => Number(v).toFixed(1);
  const pct = (v, of) => (of > 0 ? (100 * v / of).toFixed(1) : "–");
  $("#idle-summary").textContent = `${d.since.slice(0, 16).replace("T", " ")} – ${d.until.slice(0, 16).replace("T", " ")} UTC · `
    + `capacity ${hours(d.capacity_gpu_hours)} GPU-h · busy ${hours(d.busy_gpu_hours)} · idle ${hours(d.idle_gpu_hours)} (${pct(d.idle_gpu_hours, d.capacity_gpu_hours)} %)`;
  $("#idle-table tbody").innerHTML = d.causes.map((c) => `<tr data-cause="${esc(c.cause)}" data-gpu-hours="${esc(c.gpu_hours)}">
    <td>${esc(c.cause.replace(/_/g, " "))}</td><td>${hours(c.gpu_hours)}</td><td>${pct(c.gpu_hours, d.capacity_gpu_hours)}</td><td>${(100 * c.share_of_idle).toFixed(1)}</td></tr>`).join("")
    + `<tr class="total"><td>idle, all causes</td><td>${hours(d.idle_gpu_hours)}</td><td>${pct(d.idle_gpu_hours, d.capacity_gpu_hours)}</td><td>${d.idle_gpu_hours > 0 ? "100.0" : "–"}</td></tr>`;
  // GPU model × cause, causes in the API's order; only causes some model has hours of.
  const causes = d.causes.map((c) => c.cause).filter((cause) => d.by_gpu_model.some((g) => g.cause === cause && g.gpu_hours > 0));
  const models = [...new Set(d.by_gpu_model.map((g) => g.key ?? ""))];
  const cell = Object.fromEntries(d.by_gpu_model.map((g) => [`${g.key ?? ""}|${g.cause}`, g.gpu_hours]));
  $("#idle-model-table thead").innerHTML = `<tr><th>GPU model</th>${causes.map((c) => `<th>${esc(c.replace(/_/g, " "))}</th>`).join("")}<th>idle</th></tr>`;
  $("#idle-model-table tbody").innerHTML = models.map((m) => {
    const values = causes.map((c) => cell[`${m}|${c}`] || 0);
    return `<tr data-gpu-model="${esc(m)}"><td>${esc(m || "—")}</td>${values.map((v) => `<td>${hours(v)}</td>`).join("")}<td>${hours(values.reduce((a, b) => a + b, 0))}</td></tr>`;
  }).join("") || '<tr><td>No idle GPU-hours in the window.</td></tr>';
}

function simChart(runs) {
  const width = 900, height = 260, left = 40, bottom = 24;
  const horizon = Math.max(...runs.map(([, r]) => r.t_h[r.t_h.length - 1] || 0), 1);
  const x = (t) => left + (t / horizon) * (width - left - 10);
  const y = (v) => 30 + (1 - Math.min(1, v)) * (height - bottom - 30);
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

document.addEventListener("click", async (event) => {
  const target = event.target;
  if (target.dataset.planDecide) {
    try { await api(`/plans/${target.dataset.id}/${target.dataset.planDecide}`, { method: "POST" }); } catch (error) { alert(error.message); }
    await showActions();
    return;
  }
  if (target.dataset.decide) {
    try { await api(`/actions/${target.dataset.id}/${target.dataset.decide}`, { method: "POST" }); } catch (error) { alert(error.message); }
    showActions();
  } else if (target.dataset.edit) {
    const policy = state.policies[target.dataset.edit];
    $("#policy-name").value = policy.name;
    $("#policy-spec").value = JSON.stringify(policy.spec, null, 2);
    $("#policy-editor-title").textContent = `Edit ${policy.name} (now version ${policy.version})`;
  }
});

$("#policy-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  $("#policy-error").textContent = "";
  let spec;
  try { spec = JSON.parse($("#policy-spec").value); } catch (error) { $("#policy-error").textContent = `spec is not JSON: ${error.message}`; return; }
  const name = $("#policy-name").value, comment = $("#policy-comment").value;
  try {
    if (state.policies && state.policies[name]) await api(`/policies/${encodeURIComponent(name)}`, { method: "PUT", body: JSON.stringify({ spec, comment }) });
    else await api("/policies", { method: "POST", body: JSON.stringify({ name, spec, comment }) });
    showPolicies();
  } catch (error) { $("#policy-error").textContent = error.message; }
});

$("#login-form").addEventListener("submit", (event) => { event.preventDefault(); signIn($("#token-input").value.trim()); });
$("#group-by").addEventListener("change", showOverview);
$("#node-cluster").addEventListener("change", showNodes);
$("#sim-result").addEventListener("change", showSimulations);
$("#idle-cluster").addEventListener("change", showIdle);
for (const id of ["#job-cluster", "#job-state", "#job-sort"]) $(id).addEventListener("change", () => { state.jobOffset = 0; showJobs(); });
$("#job-prev").addEventListener("click", () => { state.jobOffset = Math.max(0, state.jobOffset - state.jobLimit); showJobs(); });
$("#job-next").addEventListener("click", () => { state.jobOffset += state.jobLimit; showJobs(); });
window.addEventListener("hashchange", () => { if (state.token) route(); });

// A token in the URL fragment (from `shaper demo`) is taken once and removed from the URL.
const fromFragment = new URLSearchParams(location.hash.slice(1)).get("token");
if (fromFragment) history.replaceState(null, "", location.pathname + "#overview");
const saved = fromFragment || sessionStorage.getItem("shaper-token");
if (saved) signIn(saved); else signOut();
