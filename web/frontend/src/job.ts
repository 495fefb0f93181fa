// The job page (#job&id=N, N the job's id in GET /jobs/{id}): the job's fields and its
// history as one timeline, newest first — its submit, start and end, what the shaping
// plans decided about it (GET /plans/decisions/history: the latest plans of its cluster)
// and every action on it (GET /actions?job_id=N), with the saga step that failed where
// one did (GET /actions/{id}/steps).
//
// A waiting job is decided on again by every plan, mostly the same way: consecutive plans
// that decided the same are one entry ("× 12"), so a change of mind stands out.

import { api, isAbort, Latest, Unauthorized } from "./api";
import { $, esc } from "./dom";
import { duration } from "./format";
import type { ActionDetail, ActionStep, Job, Page, PlanDecisionOnJob } from "./types";

// How many actions and plans the page reads; it says so when there are more actions.
export const ACTIONS_SHOWN = 100;
export const PLANS_READ = 20;
// Actions whose saga the page reads for the step that failed (the latest ones).
const STEPS_READ = 20;
const FAILED = new Set(["failed", "compensating", "compensated"]);

const request = new Latest();

interface Entry {
  at: string;
  // Among entries at the same instant: an action after the plan that made it.
  rank: number;
  html: string;
}

export async function showJob(): Promise<void> {
  const view = $("#job");
  const asked = new URLSearchParams(location.hash.slice(1)).get("id") ?? "";
  const id = /^[1-9][0-9]{0,9}$/.test(asked) ? Number(asked) : null;
  const { signal, current } = request.begin();
  view.dataset.job = "";
  if (id == null) {
    view.innerHTML = `${BACK}<p class="error">No job named in the address (#job&amp;id=N, N from the queue).</p>`;
    return;
  }
  let job: Job;
  let actions: Page<ActionDetail>;
  let decisions: PlanDecisionOnJob[];
  let steps: Map<number, ActionStep[]>;
  try {
    [job, actions, decisions] = await Promise.all([
      api<Job>(`/jobs/${id}`, { signal }),
      api<Page<ActionDetail>>(`/actions?job_id=${id}&limit=${ACTIONS_SHOWN}`, { signal }),
      api<PlanDecisionOnJob[]>(`/plans/decisions/history?job_id=${id}&plans=${PLANS_READ}`, { signal }),
    ]);
    const failed = actions.items.filter((a) => FAILED.has(a.state)).slice(0, STEPS_READ);
    steps = new Map(
      await Promise.all(
        failed.map(async (a) => [a.id, await api<ActionStep[]>(`/actions/${a.id}/steps`, { signal })] as const),
      ),
    );
  } catch (failure) {
    if (current() && !isAbort(failure) && !(failure instanceof Unauthorized)) {
      view.innerHTML = `${BACK}<p class="error" id="job-load-error">Could not load job ${id}: ${esc((failure as Error).message)}</p>`;
      view.dataset.job = String(id);
    }
    return;
  }
  if (!current()) return;
  const timeline = [...jobEvents(job), ...planEntries(decisions), ...actions.items.map((a) => actionEntry(a, steps.get(a.id)))];
  timeline.sort((a, b) => Date.parse(b.at) - Date.parse(a.at) || b.rank - a.rank);
  const more =
    actions.total > actions.items.length
      ? `<p class="hint">The latest ${actions.items.length} of ${actions.total} actions on this job.</p>`
      : "";
  view.innerHTML = `${BACK}
    <h2 id="job-title">Job ${esc(job.external_id)} <span class="hint">in ${esc(job.cluster)}</span></h2>
    ${fields(job)}
    <h3>History, newest first</h3>${more}
    <ol id="job-timeline" class="timeline">${timeline.map((e) => e.html).join("") || '<li class="hint">Nothing yet.</li>'}</ol>
    <p class="hint">Plans: what the latest ${PLANS_READ} plans of ${esc(job.cluster)} decided about the job (a plan in observe mode or rejected changed nothing). Actions: what Shaper did or proposed to do to it, with the saga step that failed.</p>`;
  view.dataset.job = String(id);
}

const BACK = '<p class="crumbs"><a href="#jobs">← Queue &amp; jobs</a></p>';

const stamp = (iso: string | null | undefined): string => (iso ? `${iso.slice(0, 19).replace("T", " ")} UTC` : "—");

function fields(j: Job): string {
  const gpus = j.shape === "elastic" ? `${j.replicas} × ${j.gpus_requested}` : String(j.gpus_requested);
  const placement = j.allocations.length
    ? j.allocations
        .map((a) => `${esc(a.node)}${a.gpu_indices.length ? ` [${a.gpu_indices.join(", ")}]` : ` × ${a.gpu_count}`}`)
        .join(", ")
    : '<span class="hint">none</span>';
  const rows: [string, string, string][] = [
    ["state", "State", esc(j.state)],
    ["team", "Team", esc(j.team)],
    ["queue", "Queue", esc(j.queue)],
    ["sla-class", "SLA class", esc(j.sla_class)],
    ["kind", "Kind", `${esc(j.kind)} · ${esc(j.shape)}`],
    ["gpus", "GPUs", gpus],
    ["priority", "Priority", String(j.priority)],
    ["placement", "Placement", placement],
    ["submitted", "Submitted", esc(stamp(j.submit_time))],
    ["started", "Started", esc(stamp(j.start_time))],
    ["ended", "Ended", esc(stamp(j.end_time))],
    ["waited", j.start_time ? "Waited" : "Waiting for", esc(waited(j))],
    ["time-limit", "Time limit", j.time_limit_s ? esc(duration(j.time_limit_s)) : '<span class="hint">none given</span>'],
    ["reason", "Scheduler's reason", j.reason ? esc(j.reason) : '<span class="hint">none given</span>'],
    ["residency", "May run in", residency(j)],
    ["speeds", "Own speeds", speeds(j)],
  ];
  return `<dl class="figures job-fields" id="job-fields">${rows
    .map(([key, label, value]) => `<div><dt>${label}</dt><dd data-field="${key}">${value}</dd></div>`)
    .join("")}</dl>`;
}

/** The job's own residency rule: the labels a cluster of its group must have and the
 * clusters it names (its team's rule is the SLA policy's, shown on the policy page). */
function residency(j: Job): string {
  const rule = j.residency;
  if (!rule) return '<span class="hint">any cluster its team may use</span>';
  const parts: string[] = [];
  const selector = Object.entries(rule.cluster_selector);
  if (selector.length) parts.push(`clusters labelled ${selector.map(([k, v]) => `${k}=${v}`).join(", ")}`);
  if (rule.allowed_clusters !== null) {
    parts.push(rule.allowed_clusters.length ? `only ${rule.allowed_clusters.join(", ")}` : "only its own cluster");
  }
  return parts.length ? esc(parts.join("; ")) : '<span class="hint">any cluster its team may use</span>';
}

/** The job's own speed on GPU models, as its owner wrote it (the catalogue's scale; the
 * plan keeps the catalogue's pace over the models named, so these say how it differs). */
function speeds(j: Job): string {
  const own = Object.entries(j.speeds ?? {});
  if (!own.length) return '<span class="hint">its models\' speeds</span>';
  return esc(own.map(([model, speed]) => `${model} ${speed}`).join(", "));
}

/** Submit to start, or to now (this browser's clock) while it waits. */
function waited(j: Job): string {
  if (!j.submit_time) return "—";
  const until = j.start_time ? Date.parse(j.start_time) : j.end_time ? Date.parse(j.end_time) : Date.now();
  return duration((until - Date.parse(j.submit_time)) / 1000);
}

function jobEvents(j: Job): Entry[] {
  const events: [string | null, string, string][] = [
    [j.submit_time, "submitted", `submitted to ${esc(j.cluster)} (queue ${esc(j.queue)})`],
    [j.start_time, "started", "started"],
    [j.end_time, "ended", esc(j.state)],
  ];
  return events
    .filter((e): e is [string, string, string] => e[0] !== null)
    .map(([at, event, text]) => ({
      at,
      rank: 0,
      html: `<li class="event job-event" data-kind="job" data-event="${event}"><time>${esc(stamp(at))}</time> <b>Job ${text}</b></li>`,
    }));
}

/** Consecutive plans (newest first) that decided the same about the job, as one entry. */
function planEntries(history: PlanDecisionOnJob[]): Entry[] {
  const runs: PlanDecisionOnJob[][] = [];
  const same = (a: PlanDecisionOnJob, b: PlanDecisionOnJob): boolean =>
    a.plan_state === b.plan_state && a.mode === b.mode && JSON.stringify(a.decision) === JSON.stringify(b.decision);
  for (const h of history) {
    const last = runs[runs.length - 1];
    if (last && same(last[0], h)) last.push(h);
    else runs.push([h]);
  }
  return runs.map((run) => {
    const [newest, oldest] = [run[0], run[run.length - 1]];
    const d = newest.decision;
    const times = run.length > 1 ? ` <span class="hint">× ${run.length} plans, since ${esc(stamp(oldest.created_at))}</span>` : "";
    const plans = run.map((h) => `#${h.plan_id}`).join(" ");
    return {
      at: newest.created_at,
      rank: 1,
      html: `<li class="event plan-decision" data-kind="plan" data-plans="${run.map((h) => h.plan_id).join(" ")}" data-decision="${esc(d.action)}" data-reason="${esc(d.reason)}">
        <time>${esc(stamp(newest.created_at))}</time> <b>Plan ${esc(run.length > 1 ? plans : `#${newest.plan_id}`)}</b>
        <span class="hint">(${esc(newest.mode)}, ${esc(newest.plan_state)})</span>: <b>${esc(d.action)}</b>${d.from ? ` from ${esc(d.from)} to ${esc(d.to ?? "—")}` : d.to ? ` on ${esc(d.to)}` : ""}
        · ${esc(d.reason.replace(/_/g, " "))}${d.message ? ` — ${esc(d.message)}` : ""}${times}</li>`,
    };
  });
}

function placementText(placement: Record<string, number>, node: string | null): string {
  const nodes = Object.entries(placement);
  if (nodes.length) return nodes.map(([name, gpus]) => `${name} × ${gpus}`).join(", ");
  return node ?? "";
}

function actionEntry(a: ActionDetail, steps: ActionStep[] | undefined): Entry {
  const from = placementText(a.source_placement, a.source_node);
  let to = placementText(a.target_placement, a.target_node);
  if (a.target_replicas != null) to = `${to ? `${to}, ` : ""}${a.target_replicas} replicas`;
  const where = a.target_cluster ? `${a.cluster} → ${a.target_cluster}` : a.cluster;
  const move = from || to ? `<span data-figure="placement">${esc(from || "—")} → ${esc(to || "—")}</span>` : "";
  const times = [
    `proposed ${stamp(a.created_at)}`,
    a.decided_at ? `${a.state === "rejected" ? "rejected" : "decided"} by ${a.decided_by ?? "?"} ${stamp(a.decided_at)}` : "",
    a.finished_at ? `ended ${stamp(a.finished_at)}` : `last change ${stamp(a.updated_at)}`,
    a.attempts > 1 ? `${a.attempts} attempts` : "",
  ].filter(Boolean);
  const failedSteps = (steps ?? []).filter((s) => s.state === "failed");
  const stepErrors = failedSteps
    .map(
      (s) =>
        `<div class="step-error error" data-step="${esc(s.name)}" data-phase="${esc(s.phase)}">step ${s.seq} (${esc(s.phase)} ${esc(s.name)} on ${esc(s.queue)}) failed${
          s.finished_at ? ` at ${esc(stamp(s.finished_at))}` : ""
        }: <span data-figure="step-error">${esc(s.error ?? "no error text")}</span></div>`,
    )
    .join("");
  const error = a.error ? `<div class="error" data-figure="error">${esc(a.error)}</div>` : "";
  return {
    at: a.created_at,
    rank: 2,
    html: `<li class="event action state-${esc(a.state)}" data-kind="action" data-action="${a.id}" data-state="${esc(a.state)}">
      <time>${esc(stamp(a.created_at))}</time> <b>Action #${a.id} ${esc(a.kind)}</b> <span class="state" data-figure="state">${esc(a.state)}</span>
      in <span data-figure="cluster">${esc(where)}</span>${move ? ` · ${move}` : ""}${a.plan_id != null ? ` <span class="hint">plan #${a.plan_id}</span>` : ""}
      <div class="hint" data-figure="times">${esc(times.join(" · "))}</div>
      ${a.reason ? `<div data-figure="reason">${esc(a.reason)}</div>` : ""}${error}${stepErrors}</li>`,
  };
}
