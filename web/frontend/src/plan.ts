// The plan page (#plan&id=N): a plan as a unit. Its figures for people (GET /plans/{id}),
// its placement before and after on the nodes it touches (GET /plans/{id}/placement), its
// actions in the order their dependencies allow, drawn as a graph (plan_graph.ts) and
// listed, each with the actions it waits on and its saga's steps (GET /actions?plan_id=N,
// GET /plans/{id}/steps), and — while it is proposed — approve or reject it whole
// (POST /plans/{id}/approve|reject).
//
// While any of its actions has not ended, the page reads it again every REFRESH_MS; a
// reply for a plan no longer shown, or older than a newer read, is dropped (Latest).

import { api, hasScope, isAbort, Latest, Unauthorized } from "./api";
import { $, COLORS, esc } from "./dom";
import { ago, between, figure, gapPercent, solveTime, when } from "./format";
import { jobLink } from "./links";
import { forgetPick, graphView, markPicked, wireGraph } from "./plan_graph";
import type { ActionDetail, NodePlacement, Page, PlacedJob, PlanDetail, PlanPlacement, PlanStep } from "./types";

export const REFRESH_MS = 3000;
// The most actions a plan page reads (the API's page limit).
const ACTIONS_READ = 1000;
// app.actions.models.TERMINAL_ACTION_STATES: nothing about these changes any more.
const ENDED = new Set(["rejected", "succeeded", "failed", "compensated", "cancelled"]);
const FAILED = new Set(["failed", "compensating", "compensated"]);

const request = new Latest();
let refresh: number | undefined;
// What the page was last drawn from: a refresh that reads the same redraws nothing, so
// keyboard focus and a selection survive it.
let drawnFrom = "";

/** The plan id the address names, or null. */
function asked(): number | null {
  const params = new URLSearchParams(location.hash.slice(1));
  const id = params.get("id") ?? "";
  return location.hash.startsWith("#plan&") && /^[1-9][0-9]{0,9}$/.test(id) ? Number(id) : null;
}

export async function showPlan(): Promise<void> {
  window.clearTimeout(refresh);
  const view = $("#plan");
  const id = asked();
  const { signal, current } = request.begin();
  if (id == null) {
    view.innerHTML = `${BACK}<p class="error">No plan named in the address (#plan&amp;id=N, N from Plans &amp; actions).</p>`;
    view.dataset.plan = "";
    return;
  }
  if (view.dataset.plan !== String(id)) {
    view.dataset.plan = "";
    forgetPick();
    view.innerHTML = `${BACK}<p class="hint">Loading plan ${id}…</p>`;
  }
  let plan: PlanDetail, actions: Page<ActionDetail>, steps: PlanStep[], placement: PlanPlacement;
  try {
    [plan, actions, steps, placement] = await Promise.all([
      api<PlanDetail>(`/plans/${id}`, { signal }),
      api<Page<ActionDetail>>(`/actions?plan_id=${id}&limit=${ACTIONS_READ}`, { signal }),
      api<PlanStep[]>(`/plans/${id}/steps`, { signal }),
      api<PlanPlacement>(`/plans/${id}/placement`, { signal }),
    ]);
  } catch (failure) {
    if (current() && !isAbort(failure) && !(failure instanceof Unauthorized)) {
      const message = `Could not load plan ${id}: ${esc((failure as Error).message)}`;
      const shown = view.dataset.plan === String(id) && document.querySelector("#plan-load-error");
      // A failed refresh keeps what is shown and says so; the next one may succeed.
      if (shown) $("#plan-load-error").innerHTML = message;
      else view.innerHTML = `${BACK}<p class="error" id="plan-load-error">${message}</p>`;
      if (view.dataset.plan === String(id)) schedule(id);
    }
    return;
  }
  if (!current()) return;
  const live = actions.items.some((a) => !ENDED.has(a.state));
  const signature = JSON.stringify([plan, actions, steps, placement]);
  if (view.dataset.plan === String(id) && signature === drawnFrom && document.querySelector("#plan-refresh")) {
    $("#plan-load-error").textContent = "";
    $("#plan-refresh").textContent = refreshNote(live);
    if (live) schedule(id);
    return;
  }
  drawnFrom = signature;
  const decideError = document.querySelector("#plan-decide-error")?.textContent ?? "";
  view.innerHTML = `${BACK}
    <h2 id="plan-title">Plan #${plan.id} <span class="hint">in ${esc(plan.cluster ?? "—")}</span> <span class="plan-state state-${esc(plan.state)}" data-figure="state">${esc(plan.state)}</span></h2>
    ${header(plan, actions)}
    ${decide(plan)}
    <p class="error" id="plan-decide-error" role="alert">${esc(decideError)}</p>
    <p class="error" id="plan-load-error" role="status"></p>
    <h3>Placement, before → after</h3>
    ${placementView(placement)}
    <h3>Actions, in the order they may run</h3>
    ${actionsView(actions, steps)}
    ${waits(plan)}
    <p class="hint" id="plan-refresh">${esc(refreshNote(live))}</p>`;
  markPicked();
  view.dataset.plan = String(id);
  view.dataset.state = plan.state;
  view.dataset.live = String(live);
  if (live) schedule(id);
}

function refreshNote(live: boolean): string {
  return live
    ? `Read ${when(new Date().toISOString())}; read again every ${REFRESH_MS / 1000} s while an action has not ended.`
    : "Every action has ended (or there is none): this page no longer changes.";
}

function schedule(id: number): void {
  window.clearTimeout(refresh);
  refresh = window.setTimeout(() => {
    // Only while this plan is still the page shown.
    if (asked() !== id || $("#plan").hidden) return;
    showPlan().catch((error: unknown) => {
      if (!isAbort(error) && !(error instanceof Unauthorized)) console.error(error);
    });
  }, REFRESH_MS);
}

const BACK = '<p class="crumbs"><a href="#actions">← Plans &amp; actions</a></p>';

function header(p: PlanDetail, actions: Page<ActionDetail>): string {
  const states = new Map<string, number>();
  for (const a of actions.items) states.set(a.state, (states.get(a.state) ?? 0) + 1);
  const tally = [...states].map(([state, n]) => `${n} ${state}`).join(", ");
  const rows: [string, string, string][] = [
    ["cluster", "Cluster", esc(p.cluster ?? "—")],
    ["policy", "Policy", `${esc(p.policy)} <span class="hint">· ${esc(p.engine)}</span>`],
    ["mode", "Mode", esc(p.mode)],
    ["state", "State", `${esc(p.state)}${p.state_reason ? `<div class="hint">${esc(p.state_reason)}</div>` : ""}`],
    ["created", "Created", `${esc(when(p.created_at))}<div class="hint">${esc(ago(p.created_at))}</div>`],
    ["status", "Solve", esc(p.status)],
    ["objective", "Objective", esc(figure(p.objective))],
    ["bound", "Best bound", esc(figure(p.best_bound))],
    ["gap", "Optimality gap", esc(gapPercent(p.gap))],
    ["solve-time", "Solve time", esc(solveTime(p.wall_time_s))],
    ["decided", "Decided", p.decided_at ? `${esc(p.decided_by ?? "?")}<div class="hint">${esc(when(p.decided_at))}</div>` : '<span class="hint">not yet</span>'],
    ["actions", "Actions", actions.total ? `${actions.total}<div class="hint">${esc(tally)}</div>` : "none"],
  ];
  return `<dl class="figures plan-fields" id="plan-fields">${rows
    .map(([key, label, value]) => `<div><dt>${label}</dt><dd data-field="${key}">${value}</dd></div>`)
    .join("")}</dl>`;
}

function decide(p: PlanDetail): string {
  if (p.state !== "proposed") return "";
  const allowed = hasScope("operator");
  const off = allowed ? "" : ' disabled title="Needs an operator token"';
  return `<div class="plan-decide" id="plan-decide">
    <button type="button" data-plan-verdict="approve" data-id="${p.id}"${off}>Approve plan</button>
    <button type="button" data-plan-verdict="reject" data-id="${p.id}"${off}>Reject plan</button>
    <span class="hint">${
      allowed
        ? "Every proposed action at once: approved, they run in the order below; rejected, none of them runs."
        : "Approving or rejecting a plan needs an operator token; this one is a viewer's."
    }</span></div>`;
}

/** Approve or reject the plan shown; wired once (main.ts). */
export function wirePlan(): void {
  wireGraph($("#plan"));
  $("#plan").addEventListener("click", async (event) => {
    const button = event.target;
    if (!(button instanceof HTMLButtonElement) || !button.dataset.planVerdict) return;
    const verdict = button.dataset.planVerdict;
    document.querySelectorAll<HTMLButtonElement>("#plan-decide button").forEach((b) => (b.disabled = true));
    $("#plan-decide-error").textContent = "";
    try {
      await api(`/plans/${button.dataset.id}/${verdict}`, { method: "POST" });
    } catch (error) {
      if (error instanceof Unauthorized) return;
      $("#plan-decide-error").textContent = `Could not ${verdict} the plan: ${(error as Error).message}`;
    }
    await showPlan();
  });
}

// -- placement ---------------------------------------------------------------------------

/** Each GPU of a node's side (before or after): the job on it, or null when free. Jobs
 * with known indices take theirs; the others the first cells nobody holds. */
function cells(size: number, jobs: PlacedJob[]): (string | null)[] {
  const held: (string | null)[] = Array.from({ length: size }, () => null);
  for (const j of jobs) for (const i of j.gpu_indices) if (i < size) held[i] = j.job;
  for (const j of jobs) {
    let left = j.gpus - j.gpu_indices.length;
    for (let i = 0; left > 0 && i < size; i++) {
      if (held[i] === null) {
        held[i] = j.job;
        left--;
      }
    }
  }
  return held;
}

function side(size: number, jobs: PlacedJob[], colour: Map<string, string>, which: string): string {
  const strip = cells(size, jobs)
    .map((job, i) =>
      job === null
        ? `<span class="gpu" title="GPU ${i} · free"></span>`
        : `<span class="gpu held" style="background:${colour.get(job)}" data-job="${esc(job)}" title="GPU ${i} · ${esc(job)}"></span>`,
    )
    .join("");
  const names = jobs.length
    ? jobs.map((j) => `<span data-job="${esc(j.job)}" data-gpus="${j.gpus}">${jobLink(j.job_id, j.job)} × ${j.gpus}</span>`).join(", ")
    : '<span class="hint">all free</span>';
  return `<td class="side" data-side="${which}"><div class="strip" aria-hidden="true">${strip}</div><div class="holders">${names}</div></td>`;
}

function change(n: NodePlacement): string {
  const before = new Map(n.before.map((j) => [j.job, j.gpus]));
  const after = new Map(n.after.map((j) => [j.job, j.gpus]));
  const parts: string[] = [];
  for (const [job, gpus] of after) {
    const was = before.get(job) ?? 0;
    if (gpus > was) parts.push(`<span class="gain">+${esc(job)} ${gpus - was}</span>`);
  }
  for (const [job, gpus] of before) {
    const now = after.get(job) ?? 0;
    if (now < gpus) parts.push(`<span class="loss">−${esc(job)} ${gpus - now}</span>`);
  }
  return parts.join(" ") || '<span class="hint">unchanged</span>';
}

function placementView(p: PlanPlacement): string {
  if (!p.nodes.length) return '<p class="hint" id="plan-placement">The plan moves no job.</p>';
  const jobs = [...new Set(p.nodes.flatMap((n) => [...n.before, ...n.after].map((j) => j.job)))].sort();
  const colour = new Map(jobs.map((job, k) => [job, COLORS[k % COLORS.length]]));
  const rows = p.nodes
    .map((n) => {
      const used = (list: PlacedJob[]): number => list.reduce((sum, j) => sum + j.gpus, 0);
      const size = n.gpus ?? Math.max(used(n.before), used(n.after));
      const model = n.gpu_model ? `${esc(n.gpu_model)} × ${n.gpus ?? "?"}` : n.gpus != null ? `${n.gpus} GPUs` : "";
      return `<tr data-node="${esc(n.node)}"><th scope="row"><span class="name">${esc(n.node)}</span><div class="hint">${model}</div></th>
        ${side(size, n.before, colour, "before")}${side(size, n.after, colour, "after")}<td class="change" data-figure="change">${change(n)}</td></tr>`;
    })
    .join("");
  const note = p.complete
    ? "Each cell is a GPU, coloured by the job on it; the nodes the plan's actions touch, as the plan saw them."
    : "Rebuilt from the plan's actions (the plan was stored before its placement was): only the jobs they move are shown, not their neighbours.";
  return `<table id="plan-placement" data-complete="${p.complete}"><thead><tr><th>Node</th><th>Before</th><th>After</th><th>Change</th></tr></thead><tbody>${rows}</tbody></table>
    <p class="hint">${note}</p>`;
}

// -- actions -----------------------------------------------------------------------------

/** Each action's stage: 1 with no prerequisite in the plan, else one past its latest. */
function stages(actions: ActionDetail[]): Map<number, number> {
  const byId = new Map(actions.map((a) => [a.id, a]));
  const stage = new Map<number, number>();
  const visit = (a: ActionDetail, path: Set<number>): number => {
    const known = stage.get(a.id);
    if (known !== undefined) return known;
    path.add(a.id);
    let deepest = 0;
    for (const d of a.depends_on) {
      const prerequisite = byId.get(d);
      // A cycle cannot be planned (the cycle defers it); guard anyway.
      if (prerequisite && !path.has(d)) deepest = Math.max(deepest, visit(prerequisite, path));
    }
    path.delete(a.id);
    stage.set(a.id, deepest + 1);
    return deepest + 1;
  };
  for (const a of actions) visit(a, new Set());
  return stage;
}

function placementText(placement: Record<string, number>, node: string | null): string {
  const nodes = Object.entries(placement);
  return nodes.length ? nodes.map(([name, gpus]) => `${name} × ${gpus}`).join(", ") : (node ?? "");
}

function actionsView(actions: Page<ActionDetail>, steps: PlanStep[]): string {
  if (!actions.items.length) {
    return '<p class="hint" id="plan-actions">No actions: the plan observed, or found nothing worth doing.</p>';
  }
  const stage = stages(actions.items);
  const byId = new Map(actions.items.map((a) => [a.id, a]));
  const stepsOf = new Map<number, PlanStep[]>();
  for (const s of steps) stepsOf.set(s.action_id, [...(stepsOf.get(s.action_id) ?? []), s]);
  const ordered = [...actions.items].sort((a, b) => (stage.get(a.id) ?? 0) - (stage.get(b.id) ?? 0) || a.id - b.id);
  const last = Math.max(...stage.values());
  const groups = Array.from({ length: last }, (_, k) => ordered.filter((a) => stage.get(a.id) === k + 1));
  const more = actions.total > actions.items.length ? `<p class="hint">The first ${actions.items.length} of ${actions.total} actions.</p>` : "";
  return `${graphView(actions.items, stage, stepsOf)}${more}<ol id="plan-actions" class="stages">${groups
    .map(
      (group, k) => `<li class="stage" data-stage="${k + 1}"><div class="stage-title">Stage ${k + 1} <span class="hint">${
        k === 0 ? "— waits on nothing" : `— each waits on actions of earlier stages`
      }</span></div>${group.map((a) => actionCard(a, byId, stage, stepsOf.get(a.id) ?? [])).join("")}</li>`,
    )
    .join("")}</ol>`;
}

function actionCard(a: ActionDetail, byId: Map<number, ActionDetail>, stage: Map<number, number>, steps: PlanStep[]): string {
  const from = placementText(a.source_placement, a.source_node);
  let to = placementText(a.target_placement, a.target_node);
  if (a.target_replicas != null) to = `${to ? `${to}, ` : ""}${a.target_replicas} replicas`;
  const where = a.target_cluster ? `${esc(a.cluster)} → ${esc(a.target_cluster)} · ` : "";
  const waits = a.depends_on.length
    ? `waits on ${a.depends_on
        .map((d) => {
          const p = byId.get(d);
          return `<span class="wait-on state-${esc(p?.state ?? "")}" data-on="${d}">#${d}${p ? ` ${esc(p.kind)}${p.job_external_id ? ` ${esc(p.job_external_id)}` : ""} (${esc(p.state)})` : ""}</span>`;
        })
        .join(", ")}`
    : "waits on nothing";
  const times = [
    `proposed ${when(a.created_at)}`,
    a.decided_at ? `${a.state === "rejected" ? "rejected" : "decided"} by ${a.decided_by ?? "?"} ${when(a.decided_at)}` : "",
    a.finished_at ? `ended ${when(a.finished_at)}` : "",
    a.finished_at && a.decided_at ? `took ${between(a.decided_at, a.finished_at)} from the decision` : "",
  ].filter(Boolean);
  const error = a.error ? `<div class="error" data-figure="error">${esc(a.error)}</div>` : "";
  return `<div class="plan-action state-${esc(a.state)}${FAILED.has(a.state) ? " failed" : ""}" data-action="${a.id}" data-state="${esc(a.state)}" data-stage="${stage.get(a.id)}" data-depends-on="${a.depends_on.join(" ")}">
    <div><b>#${a.id} ${esc(a.kind)}</b> ${a.job_external_id ? jobLink(a.job_id, a.job_external_id) : ""} <span class="state" data-figure="state">${esc(a.state)}</span>
    <span data-figure="placement">${where}${esc(from || "—")} → ${esc(to || "—")}</span></div>
    <div class="waits" data-figure="waits">${waits}</div>
    ${a.reason ? `<div class="hint" data-figure="reason">${esc(a.reason)}</div>` : ""}${error}
    <div class="hint" data-figure="times">${esc(times.join(" · "))}${a.attempts > 1 ? ` · ${a.attempts} attempts` : ""}</div>
    ${stepsTable(steps, ENDED.has(a.state))}</div>`;
}

function stepsTable(steps: PlanStep[], ended: boolean): string {
  if (!steps.length) return `<div class="hint no-steps">${ended ? "No saga step ran." : "No saga step has run yet."}</div>`;
  const rows = steps
    .map((s) => {
      const row = `<tr class="step state-${esc(s.state)}" data-step="${esc(s.name)}" data-phase="${esc(s.phase)}" data-state="${esc(s.state)}">
      <td>${s.seq}</td><td>${esc(s.phase === "forward" ? s.name : `${s.phase} ${s.name}`)}</td><td data-figure="where">${esc(s.queue)}</td>
      <td data-figure="step-state">${esc(s.state)}</td><td data-figure="attempts">${s.attempts}</td>
      <td>${esc(when(s.sent_at))}</td><td>${esc(when(s.finished_at))}</td><td data-figure="took">${esc(between(s.sent_at, s.finished_at))}</td></tr>`;
      const failed = s.state === "failed" ? `<tr class="step-error" data-step="${esc(s.name)}"><td></td><td colspan="7" class="error" data-figure="step-error">${esc(s.error ?? "failed, with no error text")}</td></tr>` : "";
      return row + failed;
    })
    .join("");
  return `<table class="steps"><thead><tr><th>#</th><th>Step</th><th>Where</th><th>State</th><th>Attempts</th><th>Sent (UTC)</th><th>Finished (UTC)</th><th>Took</th></tr></thead><tbody>${rows}</tbody></table>`;
}

/** The jobs the plan left waiting, counted by reason (its other decisions are its actions). */
function waits(p: PlanDetail): string {
  const reasons = new Map<string, number>();
  for (const d of p.decisions) if (d.action === "wait") reasons.set(d.reason, (reasons.get(d.reason) ?? 0) + 1);
  if (!reasons.size) return "";
  const total = [...reasons.values()].reduce((a, b) => a + b, 0);
  const list = [...reasons]
    .sort((a, b) => b[1] - a[1])
    .map(([reason, n]) => `<span data-reason="${esc(reason)}">${esc(reason.replace(/_/g, " "))} ${n}</span>`)
    .join(", ");
  return `<p id="plan-waits">The plan leaves <b>${total}</b> job${total === 1 ? "" : "s"} waiting: ${list} <span class="hint">(each job's reason on the queue page)</span>.</p>`;
}
