// The queue (Queue & jobs): who waits, why, and for how long against the team's SLA.
//
// Jobs come in state groups, waiting ones first: pending (the longest waiting first), then
// suspended, then running (the longest running first); finished, failed and cancelled jobs
// only when asked for (the latest ended first). GET /jobs filters by one state, so each
// group is its own request and a page of PAGE_SIZE may span two groups: the first round
// asks for the first group's slice and every group's size (the whole first page at offset
// 0), a second round only for the slices the first did not bring.
//
// For a waiting job the page shows the scheduler's reason (the job's `reason`) and the
// latest plan's decision for it (GET /plans/decisions, for the jobs shown only: "wait" and
// the solver's reason, or the start it planned), its wait so far by this browser's clock, and — where
// the cluster's SLA policy (the policy named after the cluster, as the shaping cycle reads
// it) gives the team a `max_queue_wait_s` — the wait against that bound: "near" from NEAR
// of it, "overdue" past it (the solver's own test: waited > max).
//
// The selection lives in the address (#jobs&cluster=…&team=…&state=…&ended=1&offset=…): a
// reload or a link opens the same page. A value the page does not offer is dropped.
//
// While shown, the page reads its selection again every refreshPeriodMs() (refresh.ts):
// the selection drawn, not the controls (a team half typed is not applied), and only the
// parts that changed are rewritten, the focused job link kept.

import { api, isAbort, Latest, Unauthorized } from "./api";
import { $, count, esc, select } from "./dom";
import { duration } from "./format";
import { jobLink } from "./links";
import { Poller, redraw } from "./refresh";
import type { Cluster, Job, JobDecisions, Page, PlanDecision, Policy } from "./types";

export const PAGE_SIZE = 50;
// From this share of the max queue wait on, a waiting job is marked as near it.
export const NEAR = 0.8;

const WAITING = new Set(["pending", "suspended"]);
const ACTIVE = ["pending", "suspended", "running"];
const ENDED = ["finished", "failed", "cancelled"];
const STATES = [...ACTIVE, ...ENDED];
// Within a group (GET /jobs `sort`): the longest waiting or running first, the latest
// ended first.
const ORDER: Record<string, string> = {
  pending: "submit_time",
  suspended: "submit_time",
  running: "start_time",
  finished: "-end_time",
  failed: "-end_time",
  cancelled: "-end_time",
};
const MAX_TEAM_LENGTH = 128; // app.jobs.models.Job.team
const MAX_OFFSET = 2 ** 31 - 1; // app.core.paging.MAX_OFFSET: past it the API refuses

interface Selection {
  cluster: string;
  team: string;
  state: string;
  ended: boolean;
  offset: number;
}

const request = new Latest();
// The offset of the page shown (after clamping), for the pager and a bare #jobs.
let shownOffset = 0;
// The selection drawn last, which a refresh reads again.
let shownSelection: Selection | null = null;
const poller = new Poller("jobs", () => load(shownSelection ? { ...shownSelection, offset: shownOffset } : selection(), true));

export function fillQueueClusters(clusters: Cluster[]): void {
  const chooser = select("#job-cluster");
  const chosen = chooser.value;
  chooser.innerHTML =
    '<option value="">all clusters</option>' + clusters.map((c) => `<option value="${esc(c.name)}">${esc(c.name)}</option>`).join("");
  chooser.value = clusters.some((c) => c.name === chosen) ? chosen : "";
}

/** Once, at start: the state choices, and a change of filter or page redraws the view. */
export function wireQueue(): void {
  select("#job-state").innerHTML =
    '<option value="">waiting and running</option>' + STATES.map((s) => `<option value="${s}">${s}</option>`).join("");
  for (const id of ["#job-cluster", "#job-state", "#job-ended", "#job-team"]) $(id).addEventListener("change", () => choose(0));
  $("#job-prev").addEventListener("click", () => choose(Math.max(0, shownOffset - PAGE_SIZE)));
  $("#job-next").addEventListener("click", () => choose(shownOffset + PAGE_SIZE));
  $("#job-refresh").addEventListener("click", () => choose(shownOffset));
}

function choose(offset: number): void {
  history.replaceState(null, "", address({ ...controls(), offset }));
  showQueue().catch((error: unknown) => {
    if (!isAbort(error) && !(error instanceof Unauthorized)) console.error(error);
  });
}

function controls(): Selection {
  const state = select("#job-state").value;
  return {
    cluster: select("#job-cluster").value,
    team: $<HTMLInputElement>("#job-team").value.trim().slice(0, MAX_TEAM_LENGTH),
    state,
    ended: !state && $<HTMLInputElement>("#job-ended").checked,
    offset: shownOffset,
  };
}

function address(s: Selection): string {
  const params = new URLSearchParams();
  if (s.cluster) params.set("cluster", s.cluster);
  if (s.team) params.set("team", s.team);
  if (s.state) params.set("state", s.state);
  if (s.ended) params.set("ended", "1");
  if (s.offset) params.set("offset", String(s.offset));
  const query = params.toString();
  return query ? `#jobs&${query}` : "#jobs";
}

/** The address's selection where it names one (a bare #jobs keeps the controls'), put
 * into the controls; what the page does not offer is dropped. */
function selection(): Selection {
  const asked = new URLSearchParams(location.hash.slice(1));
  asked.delete("jobs");
  if ([...asked.keys()].length) {
    const offered = (chooser: HTMLSelectElement, value: string | null): string =>
      value !== null && [...chooser.options].some((o) => o.value === value) ? value : "";
    select("#job-cluster").value = offered(select("#job-cluster"), asked.get("cluster"));
    select("#job-state").value = offered(select("#job-state"), asked.get("state"));
    $<HTMLInputElement>("#job-team").value = asked.get("team") ?? "";
    $<HTMLInputElement>("#job-ended").checked = asked.get("ended") === "1";
    const offset = Number(asked.get("offset") ?? "0");
    shownOffset = Number.isSafeInteger(offset) && offset > 0 ? Math.min(offset, MAX_OFFSET) : 0;
  }
  const chosen = controls();
  $<HTMLInputElement>("#job-ended").disabled = chosen.state !== "";
  const normal = address(chosen);
  if (location.hash !== normal) history.replaceState(null, "", normal);
  return chosen;
}

function jobs(s: Selection, state: string, offset: number, limit: number, signal: AbortSignal): Promise<Page<Job>> {
  const params = new URLSearchParams({ state, sort: ORDER[state], limit: String(limit), offset: String(offset) });
  if (s.cluster) params.set("cluster", s.cluster);
  if (s.team) params.set("team", s.team);
  return api<Page<Job>>(`/jobs?${params}`, { signal });
}

/** The selection the address names (the router, a change of filter or page). */
export async function showQueue(): Promise<void> {
  await load(selection(), false);
}

async function load(chosen: Selection, refreshing: boolean): Promise<void> {
  try {
    await draw(chosen, refreshing);
  } finally {
    poller.schedule();
  }
}

async function draw(chosen: Selection, refreshing: boolean): Promise<void> {
  const groups = chosen.state ? [chosen.state] : chosen.ended ? STATES : ACTIVE;
  const { signal, current } = request.begin();
  const error = $("#job-error");
  let items: Job[];
  let totals: number[];
  let offset: number;
  let policies: Policy[];
  let plans: Map<string, JobDecisions>;
  // Where in its group each group's slice starts (a page may begin mid-group).
  const starts = groups.map(() => 0);
  try {
    const [policyList, first] = await Promise.all([
      api<Policy[]>("/policies", { signal }),
      Promise.all(
        groups.map((state, i) =>
          jobs(chosen, state, i === 0 ? chosen.offset : 0, i === 0 || chosen.offset === 0 ? PAGE_SIZE : 1, signal),
        ),
      ),
    ]);
    policies = policyList;
    totals = first.map((p) => p.total);
    const grand = totals.reduce((a, b) => a + b, 0);
    // Past the end (a link from a longer queue): its last page.
    offset = chosen.offset >= grand && grand > 0 ? Math.floor((grand - 1) / PAGE_SIZE) * PAGE_SIZE : chosen.offset;
    const slices: Promise<Job[]>[] = [];
    let before = 0;
    groups.forEach((state, i) => {
      const start = Math.max(0, offset - before);
      starts[i] = start;
      const end = Math.min(totals[i], offset + PAGE_SIZE - before);
      before += totals[i];
      if (end <= start) return;
      const had = first[i];
      if (had.offset === start && had.items.length >= end - start) slices.push(Promise.resolve(had.items.slice(0, end - start)));
      else slices.push(jobs(chosen, state, start, end - start, signal).then((p) => p.items));
    });
    items = (await Promise.all(slices)).flat();
    // The latest plan's word on each waiting job shown, per cluster.
    const waiting = new Map<string, string[]>();
    for (const j of items) if (WAITING.has(j.state)) waiting.set(j.cluster, [...(waiting.get(j.cluster) ?? []), j.external_id]);
    const latest = await Promise.all(
      [...waiting].map(([cluster, ids]) => {
        const params = new URLSearchParams({ cluster });
        for (const id of ids) params.append("job", id);
        return api<JobDecisions>(`/plans/decisions?${params}`, { signal });
      }),
    );
    plans = new Map(latest.map((d) => [d.cluster, d]));
  } catch (failure) {
    if (current() && !isAbort(failure) && !(failure instanceof Unauthorized)) {
      error.textContent = `Could not load the queue: ${(failure as Error).message}`;
      error.hidden = false;
      // A failed refresh keeps what is shown, under the error; the next one may succeed.
      if (!refreshing) {
        redraw($("#job-table tbody"), "");
        setText($("#job-page"), "");
        redraw($("#job-totals"), "");
      }
    }
    return;
  }
  if (!current()) return;
  error.hidden = true;
  error.textContent = "";
  shownOffset = offset;
  shownSelection = chosen;
  if (offset !== chosen.offset) history.replaceState(null, "", address({ ...chosen, offset }));
  const view = $("#jobs");
  view.dataset.cluster = chosen.cluster;
  view.dataset.team = chosen.team;
  view.dataset.state = chosen.state;
  view.dataset.ended = chosen.ended ? "1" : "";
  view.dataset.offset = String(offset);

  const bounds = maxWaits(policies);
  const teams = new Set(items.map((j) => j.team));
  for (const policy of policies) for (const t of policyTeams(policy)) if (typeof t.team === "string") teams.add(t.team);
  redraw(
    $("#job-teams"),
    [...teams]
      .sort()
      .map((t) => `<option value="${esc(t)}"></option>`)
      .join(""),
  );

  const now = Date.now();
  let group = "";
  const rows: string[] = [];
  for (const j of items) {
    if (j.state !== group) {
      group = j.state;
      const index = groups.indexOf(group);
      const more = (starts[index] ?? 0) > 0 ? " (continued)" : "";
      rows.push(
        `<tr class="group" data-group="${esc(group)}"><th colspan="11">${esc(group)} · ${count.format(totals[index] ?? 0)}${more}</th></tr>`,
      );
    }
    rows.push(row(j, now, rowMark(j, now, bounds), bounds.get(j.cluster)?.get(j.team) ?? null, plans.get(j.cluster)));
  }
  const body = $("#job-table tbody");
  const focused = focusedJob(body);
  const rewritten = redraw(
    body,
    rows.join("") ||
      `<tr><td colspan="11" class="hint">No ${chosen.state ? `${esc(chosen.state)} ` : chosen.ended ? "" : "waiting or running "}jobs${chosen.cluster ? ` in ${esc(chosen.cluster)}` : ""}${chosen.team ? ` of team ${esc(chosen.team)}` : ""}.</td></tr>`,
  );
  if (rewritten && focused) body.querySelector<HTMLElement>(`tr[data-job="${CSS.escape(focused)}"] a`)?.focus({ preventScroll: true });
  const grand = totals.reduce((a, b) => a + b, 0);
  const end = Math.min(offset + PAGE_SIZE, grand);
  setText($("#job-page"), `${grand ? offset + 1 : 0}–${end} of ${count.format(grand)}`);
  const marked = (mark: Mark): number => items.filter((j) => rowMark(j, now, bounds) === mark).length;
  const [overdue, near] = [marked("overdue"), marked("near")];
  const onPage = [overdue ? `<span data-marked="overdue">${overdue} past max wait</span>` : "", near ? `<span data-marked="near">${near} near it</span>` : ""]
    .filter(Boolean)
    .join(", ");
  redraw(
    $("#job-totals"),
    groups.map((state, i) => `<span data-total="${esc(state)}">${esc(state)} ${count.format(totals[i])}</span>`).join(" · ") +
      (onPage ? ` — on this page: ${onPage}` : ""),
  );
  $<HTMLButtonElement>("#job-prev").disabled = offset === 0;
  $<HTMLButtonElement>("#job-next").disabled = end >= grand;
}

/** The job whose link has the focus in the table, to give it back after a redraw. */
function focusedJob(body: HTMLElement): string | null {
  const active = document.activeElement;
  return active instanceof HTMLElement && body.contains(active) ? (active.closest<HTMLElement>("tr[data-job]")?.dataset.job ?? null) : null;
}

function setText(element: HTMLElement, text: string): void {
  if (element.textContent !== text) element.textContent = text;
}

/** Per cluster, per team: the max queue wait (s) of the cluster's SLA policy. */
function maxWaits(policies: Policy[]): Map<string, Map<string, number>> {
  const bounds = new Map<string, Map<string, number>>();
  for (const policy of policies) {
    const byTeam = new Map<string, number>();
    for (const t of policyTeams(policy)) {
      if (typeof t.team === "string" && typeof t.max_queue_wait_s === "number") byTeam.set(t.team, t.max_queue_wait_s);
    }
    bounds.set(policy.name, byTeam);
  }
  return bounds;
}

/** A policy's teams as the API stores them (app.policies.models.TeamPolicy), unchecked. */
function policyTeams(policy: Policy): { team?: unknown; max_queue_wait_s?: unknown }[] {
  const teams = (policy.spec as { teams?: unknown } | null)?.teams;
  return Array.isArray(teams) ? (teams as { team?: unknown; max_queue_wait_s?: unknown }[]) : [];
}

type Mark = "overdue" | "near" | "within" | "unbounded";

const MARK_TEXT: Record<Mark, string> = {
  overdue: "⚠ past max wait",
  near: "▲ near max wait",
  within: "",
  unbounded: "",
};

/** A waiting job's wait so far (s), by the browser's clock; null without a submit time. */
function waitedS(j: Job, now: number): number | null {
  return j.submit_time ? Math.max(0, (now - Date.parse(j.submit_time)) / 1000) : null;
}

/** Where a waiting job stands against its max queue wait; "" for a job not waiting. */
function rowMark(j: Job, now: number, bounds: Map<string, Map<string, number>>): Mark | "" {
  if (!WAITING.has(j.state)) return "";
  const maxWait = bounds.get(j.cluster)?.get(j.team);
  const waited = waitedS(j, now);
  if (maxWait == null || waited == null) return "unbounded";
  return waited > maxWait ? "overdue" : waited >= NEAR * maxWait ? "near" : "within";
}

function row(j: Job, now: number, mark: Mark | "", maxWait: number | null, plan: JobDecisions | undefined): string {
  const gpus = j.shape === "elastic" ? `${j.replicas}×${j.gpus_requested}` : String(j.gpus_requested);
  const placement = j.allocations
    .map((a) => `${esc(a.node)}${a.gpu_indices.length ? `[${a.gpu_indices.join(",")}]` : `×${a.gpu_count}`}`)
    .join(" ");
  let wait = "";
  let why = "";
  if (mark) {
    wait = waitCell(waitedS(j, now), maxWait, mark);
    why = reasonCell(j, plan);
  } else {
    wait = '<td class="wait"></td>';
    why = `<td class="why">${j.end_time ? `<span class="hint">ended ${esc(when(j.end_time))}</span>` : ""}</td>`;
  }
  return `<tr data-job="${esc(j.external_id)}" data-cluster="${esc(j.cluster)}" data-state="${esc(j.state)}"${mark ? ` data-sla="${mark}" class="sla-${mark}"` : ""}>
    <td>${jobLink(j.id, j.external_id)}</td><td>${esc(j.cluster)}</td><td data-figure="team">${esc(j.team)}</td><td>${esc(j.sla_class)}</td>
    <td data-figure="priority">${j.priority}</td><td data-figure="gpus">${gpus}</td><td data-figure="state">${esc(j.state)}</td>
    ${wait}${why}<td>${placement}</td><td>${j.submit_time ? esc(when(j.submit_time)) : ""}</td></tr>`;
}

function waitCell(waited: number | null, maxWait: number | null, mark: Mark): string {
  if (waited == null) return '<td class="wait hint">no submit time</td>';
  const bound =
    maxWait == null
      ? ""
      : ` <span class="of-max">of ${esc(duration(maxWait))} max (${maxWait > 0 ? Math.floor((100 * waited) / maxWait) : "∞"} %)</span>${
          MARK_TEXT[mark] ? ` <span class="sla-badge" data-mark="${mark}">${MARK_TEXT[mark]}</span>` : ""
        }`;
  const title =
    maxWait == null ? "no max queue wait for this team in the cluster's SLA policy" : `the SLA's max queue wait: ${duration(maxWait)}`;
  return `<td class="wait" title="${esc(title)}" data-waited-s="${Math.floor(waited)}" data-max-wait-s="${maxWait ?? ""}"><span data-figure="waited">${esc(duration(waited))}</span>${bound}</td>`;
}

function reasonCell(j: Job, plan: JobDecisions | undefined): string {
  const scheduler = `<span class="source">scheduler:</span> ${
    j.reason ? `<span data-figure="reason">${esc(j.reason)}</span>` : '<span data-figure="reason" class="hint">no reason from the scheduler</span>'
  }`;
  let solver: string;
  if (!plan || plan.plan_id == null || plan.created_at == null) {
    solver = '<span class="hint" data-decision="">no plan for this cluster yet</span>';
  } else {
    const decision: PlanDecision | undefined = plan.decisions.find((d) => d.job === j.external_id);
    const made = `plan #${plan.plan_id} (${esc(when(plan.created_at))})`;
    solver = decision
      ? `<span class="decision" data-decision="${esc(decision.action)}" data-plan="${plan.plan_id}" data-reason="${esc(decision.reason)}"><span class="source">${made}:</span> <b>${esc(decision.action)}</b>${decision.to ? ` on ${esc(decision.to)}` : ""} · <span data-figure="plan-reason">${esc(decision.reason.replace(/_/g, " "))}</span>${decision.message ? ` — <span data-figure="plan-message">${esc(decision.message)}</span>` : ""}</span>`
      : `<span class="hint" data-decision="" data-plan="${plan.plan_id}">not in ${made}</span>`;
  }
  return `<td class="why">${scheduler}${solver}</td>`;
}

const when = (iso: string): string => iso.slice(0, 16).replace("T", " ");
