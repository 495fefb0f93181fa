// Federation groups (GET /federation-groups): each group's members with their labels and
// mode, the link a start away from home is priced with, the group what-if (read-only) and,
// for operators, a plan now that proposes (advise) or dispatches (enforce) its moves.

import { api, isAbort, Latest, session, Unauthorized } from "./api";
import { $, count, esc } from "./dom";
import type { Cluster, FederationGroup, FederationWhatIf, MovesProposed } from "./types";

const groupsRequest = new Latest();
// One per group: a newer what-if or plan of a group replaces the older one's answer.
const resultRequests = new Map<string, Latest>();

const objective = new Intl.NumberFormat("en", { minimumFractionDigits: 1, maximumFractionDigits: 1 });
const signed = (v: number, format: (v: number) => string): string => `${v > 0 ? "+" : v < 0 ? "−" : "±"}${format(Math.abs(v))}`;

// Scopes nest (viewer ⊂ operator ⊂ admin, app.core.security); the API decides, this only
// spares a viewer a button that can only be refused.
function mayOperate(): boolean {
  return session.scopes.includes("operator") || session.scopes.includes("admin");
}

export async function showFederation(): Promise<void> {
  const { signal, current } = groupsRequest.begin();
  const [groups, clusters] = await Promise.all([
    api<FederationGroup[]>("/federation-groups", { signal }),
    api<Cluster[]>("/clusters", { signal }),
  ]);
  if (!current()) return;
  const byName = new Map(clusters.map((c) => [c.name, c]));
  $("#federation-none").hidden = groups.length > 0;
  $("#federation-groups").innerHTML = groups.map((g) => groupCard(g, byName)).join("");
}

function groupCard(group: FederationGroup, clusters: Map<string, Cluster>): string {
  const name = esc(group.name);
  const members =
    group.clusters
      .map((member) => {
        const c = clusters.get(member);
        const labels = Object.entries(c?.labels ?? {})
          .map(([k, v]) => `<span class="label">${esc(k)}=${esc(v)}</span>`)
          .join(" ");
        return `<tr data-member="${esc(member)}"><td>${esc(member)}</td><td>${esc(c?.scheduler ?? "")}</td>
        <td class="mode">${esc(c?.mode ?? "")}</td><td class="labels">${labels || '<span class="hint">none</span>'}</td>
        <td>${c ? count.format(c.gpu_count) : ""}</td></tr>`;
      })
      .join("") || '<tr><td colspan="5">No member clusters yet.</td></tr>';
  const operate = mayOperate();
  return `<article class="group-card" data-group="${name}">
    <h3>${name}</h3>
    ${group.description ? `<p class="description">${esc(group.description)}</p>` : ""}
    <p class="link hint">Link between members: <span data-link="bandwidth">${esc(count.format(group.inter_cluster_bandwidth_mib_per_s))} MiB/s</span>,
      <span data-link="overhead">${esc(count.format(group.inter_cluster_overhead_s))} s</span> overhead per start away from home</p>
    <table class="members"><thead><tr><th>Cluster</th><th>Scheduler</th><th>Mode</th><th>Labels</th><th>GPUs</th></tr></thead><tbody>${members}</tbody></table>
    <div class="group-buttons">
      <button data-what-if="${name}">What if</button>
      <button data-plan-group="${name}"${operate ? "" : ' disabled title="Needs a token with the operator scope"'}>Plan now</button>
      ${operate ? "" : '<span class="hint">Plan now needs the operator scope.</span>'}
    </div>
    <div class="federation-result" data-result-for="${name}"></div>
  </article>`;
}

/** Runs ``ask`` for ``group`` and draws its answer, unless a newer one for the group began. */
async function answer<T>(
  group: string,
  ask: (signal: AbortSignal | undefined) => Promise<T>,
  draw: (body: T) => string,
  abortable: boolean,
): Promise<void> {
  let latest = resultRequests.get(group);
  if (!latest) resultRequests.set(group, (latest = new Latest()));
  const { signal, current } = latest.begin();
  const show = (html: string): void => {
    const panel = document.querySelector<HTMLElement>(`.federation-result[data-result-for="${CSS.escape(group)}"]`);
    if (panel && current()) panel.innerHTML = html;
  };
  show('<p class="hint">Planning…</p>');
  // A plan is never cancelled: it changes the server's state whether or not this page reads
  // the answer. The group's buttons stay off until it answered.
  const card = document.querySelector<HTMLElement>(`.group-card[data-group="${CSS.escape(group)}"]`);
  const enabled = [...(card?.querySelectorAll<HTMLButtonElement>(".group-buttons button") ?? [])].filter((b) => !b.disabled);
  enabled.forEach((b) => (b.disabled = true));
  try {
    show(draw(await ask(abortable ? signal : undefined)));
  } catch (error) {
    if (!isAbort(error) && !(error instanceof Unauthorized)) show(`<p class="error">${esc((error as Error).message)}</p>`);
  } finally {
    enabled.forEach((b) => (b.disabled = false));
  }
}

export function whatIf(group: string): Promise<void> {
  const path = `/federation-groups/${encodeURIComponent(group)}/what-if`;
  return answer(group, (signal) => api<FederationWhatIf>(path, { method: "POST", signal }), drawWhatIf, true);
}

export function planGroup(group: string): Promise<void> {
  const path = `/federation-groups/${encodeURIComponent(group)}/plan`;
  return answer(group, () => api<MovesProposed>(path, { method: "POST" }), drawPlan, false);
}

function drawWhatIf(w: FederationWhatIf): string {
  const figure = (which: "alone" | "federated"): string =>
    `<td data-figure="${which}-pending-started">${count.format(w[which].pending_started)}</td>`;
  const objectiveCell = (which: "alone" | "federated"): string =>
    `<td data-figure="${which}-objective" data-value="${esc(w[which].objective)}">${objective.format(w[which].objective)}</td>`;
  const started = w.federated.pending_started - w.alone.pending_started;
  const gained = w.federated.objective - w.alone.objective;
  const moves = w.moves.length
    ? `<table class="moves"><thead><tr><th>Job</th><th>From → to</th><th>GPUs</th><th>Nodes</th></tr></thead><tbody>${w.moves
        .map(
          (m) => `<tr data-job="${esc(m.job)}"><td>${esc(m.job)}</td><td class="route">${esc(m.from_cluster)} → ${esc(m.to_cluster)}</td>
          <td>${count.format(m.gpus)}</td><td>${m.nodes.map(esc).join(", ")}</td></tr>`,
        )
        .join("")}</tbody></table>`
    : '<p class="no-moves">No pending job would start in another cluster.</p>';
  const link = w.link
    ? ` · a start away from home priced at ${esc(count.format(w.link.bandwidth_mib_per_s))} MiB/s (${
        w.link.measured_transfers ? `measured on ${count.format(w.link.measured_transfers)} transfers` : "configured"
      })`
    : "";
  const examples = w.stays_home_examples ?? [];
  const stays = w.stays_home
    ? `<details class="stays-home"><summary>${count.format(w.stays_home)} pending ${w.stays_home === 1 ? "job stays" : "jobs stay"} home</summary><ul>${examples
        .map((s) => `<li>${esc(s.cluster)}/${esc(s.job)}: ${esc(s.why)}</li>`)
        .join("")}</ul></details>`
    : "";
  return `<h4>What if ${esc(w.group)} were planned as one</h4>
    <p class="hint">Planned at ${esc(w.planned_at.slice(0, 19).replace("T", " "))} UTC with ${esc(w.policy)} · ${count.format(w.pending_jobs)} pending, ${count.format(w.movable_jobs)} could move${link}</p>
    <table class="what-if"><thead><tr><th></th><th>Each cluster alone</th><th>Federated</th><th>Difference</th></tr></thead><tbody>
      <tr><th>Pending jobs started</th>${figure("alone")}${figure("federated")}<td>${signed(started, (v) => count.format(v))}</td></tr>
      <tr><th>Objective</th>${objectiveCell("alone")}${objectiveCell("federated")}<td>${signed(gained, (v) => objective.format(v))}</td></tr>
    </tbody></table>
    <h4>Moves</h4>${moves}${stays}
    <p class="hint dispatch">${esc(w.dispatch)}</p>`;
}

function drawPlan(p: MovesProposed): string {
  const ids = (list: number[]): string =>
    list.length ? list.map((id) => `<a href="#actions&action=${id}" data-action-link="${id}">#${id}</a>`).join(" ") : "none";
  const skipped = Object.entries(p.skipped);
  return `<h4>Planned ${esc(p.group)} now</h4>
    <table class="plan-outcome"><tbody>
      <tr><th>Proposed now (approve them on Plans &amp; actions)</th><td data-outcome="proposed">${ids(p.proposed)}</td></tr>
      <tr><th>Approved and dispatched now (enforce)</th><td data-outcome="approved">${ids(p.approved)}</td></tr>
      <tr><th>Still proposed from an earlier plan</th><td data-outcome="kept">${count.format(p.kept)}</td></tr>
      <tr><th>Earlier proposals superseded</th><td data-outcome="superseded">${count.format(p.superseded)}</td></tr>
    </tbody></table>
    ${
      skipped.length
        ? `<p>Not made:</p><ul class="skipped">${skipped.map(([job, why]) => `<li data-skipped="${esc(job)}">${esc(job)}: ${esc(why)}</li>`).join("")}</ul>`
        : ""
    }
    <p><a href="#actions">Plans &amp; actions</a></p>`;
}
