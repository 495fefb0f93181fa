// Federation groups (GET /federation-groups): each group's members with their labels and
// mode, the link a start away from home is priced with, the group what-if (read-only) and,
// for operators, a plan now that proposes (advise) or dispatches (enforce) its moves.
// Operators edit a member's labels; admins create and delete groups and let clusters join
// and leave them. A refusal is shown next to the control that caused it, and the control
// keeps what was typed; the page is redrawn from the API only after a change was made.

import { ApiError, api, hasScope, isAbort, Latest, Unauthorized } from "./api";
import { $, count, esc } from "./dom";
import type { Cluster, FederationGroup, FederationWhatIf, MovesProposed } from "./types";

const groupsRequest = new Latest();
// One per group: a newer what-if or plan of a group replaces the older one's answer.
const resultRequests = new Map<string, Latest>();

const objective = new Intl.NumberFormat("en", { minimumFractionDigits: 1, maximumFractionDigits: 1 });
const signed = (v: number, format: (v: number) => string): string => `${v > 0 ? "+" : v < 0 ? "−" : "±"}${format(Math.abs(v))}`;

export async function showFederation(): Promise<void> {
  const { signal, current } = groupsRequest.begin();
  const [groups, clusters] = await Promise.all([
    api<FederationGroup[]>("/federation-groups", { signal }),
    api<Cluster[]>("/clusters", { signal }),
  ]);
  if (!current()) return;
  const byName = new Map(clusters.map((c) => [c.name, c]));
  const alone = clusters.filter((c) => !c.federation_group).map((c) => c.name);
  $("#group-form").hidden = !hasScope("admin");
  $("#federation-none").hidden = groups.length > 0;
  $("#federation-groups").innerHTML = groups.map((g) => groupCard(g, byName, alone)).join("");
}

function groupCard(group: FederationGroup, clusters: Map<string, Cluster>, alone: string[]): string {
  const name = esc(group.name);
  const operate = hasScope("operator");
  const administer = hasScope("admin");
  const columns = operate ? 6 : 5;
  const members =
    group.clusters.map((member) => memberRows(member, clusters.get(member), operate, administer, columns)).join("") ||
    `<tr><td colspan="${columns}">No member clusters yet.</td></tr>`;
  return `<article class="group-card" data-group="${name}">
    <h3>${name}</h3>
    ${group.description ? `<p class="description">${esc(group.description)}</p>` : ""}
    <p class="link hint">Link between members: <span data-link="bandwidth">${esc(count.format(group.inter_cluster_bandwidth_mib_per_s))} MiB/s</span>,
      <span data-link="overhead">${esc(count.format(group.inter_cluster_overhead_s))} s</span> overhead per start away from home,
      egress <span data-link="egress">${group.inter_cluster_egress_gpu_s_per_gib ? `${esc(count.format(group.inter_cluster_egress_gpu_s_per_gib))} GPU-s a GiB` : "free"}</span></p>
    <table class="members"><thead><tr><th>Cluster</th><th>Scheduler</th><th>Mode</th><th>Labels</th><th>GPUs</th>${operate ? "<th></th>" : ""}</tr></thead><tbody>${members}</tbody></table>
    <div class="group-buttons">
      <button data-what-if="${name}">What if</button>
      <button data-plan-group="${name}"${operate ? "" : ' disabled title="Needs a token with the operator scope"'}>Plan now</button>
      ${operate ? "" : '<span class="hint">Plan now needs the operator scope.</span>'}
    </div>
    ${administer ? groupAdmin(name, alone) + linkEditor(group) : ""}
    <div class="federation-result" data-result-for="${name}"></div>
  </article>`;
}

function memberRows(member: string, c: Cluster | undefined, operate: boolean, administer: boolean, columns: number): string {
  const name = esc(member);
  const labels = Object.entries(c?.labels ?? {})
    .map(([k, v]) => `<span class="label">${esc(k)}=${esc(v)}</span>`)
    .join(" ");
  const row = `<tr data-member="${name}"><td>${name}</td><td>${esc(c?.scheduler ?? "")}</td>
    <td class="mode">${esc(c?.mode ?? "")}</td><td class="labels">${labels || '<span class="hint">none</span>'}</td>
    <td>${c ? count.format(c.gpu_count) : ""}</td>`;
  if (!operate) return `${row}</tr>`;
  const lines = Object.entries(c?.labels ?? {})
    .map(([k, v]) => `${k}=${v}`)
    .join("\n");
  return `${row}<td class="member-buttons">
      ${c ? `<button type="button" data-edit-labels="${name}">Edit labels</button>` : ""}
      ${administer ? `<button type="button" data-remove-member="${name}">Remove</button>` : ""}
      <span class="error" data-error-for="member"></span></td></tr>
    <tr class="label-editor" data-labels-of="${name}" hidden><td colspan="${columns}">
      <form data-labels-form="${name}">
        <label>Labels of ${name}, one <code>key=value</code> a line
          <textarea name="label-lines" rows="4" cols="50" spellcheck="false">${esc(lines)}</textarea></label>
        <span class="error" data-error-for="labels"></span>
        <button>Save labels</button> <button type="button" data-cancel-labels>Cancel</button>
      </form></td></tr>`;
}

/** An admin's controls of a group (``name`` escaped): a cluster joins, the group goes. */
function groupAdmin(name: string, alone: string[]): string {
  const join = alone.length
    ? `<form class="add-cluster" data-add-cluster="${name}">
        <label>Add cluster <select name="cluster">${alone.map((c) => `<option value="${esc(c)}">${esc(c)}</option>`).join("")}</select></label>
        <button>Add</button> <span class="error" data-error-for="cluster"></span></form>`
    : '<span class="hint">Every cluster is in a group: remove one from its group to add it here.</span>';
  return `<div class="group-admin">
    ${join}
    <span class="delete-group">
      <button type="button" data-delete-group="${name}">Delete group</button>
      <span class="delete-confirm" hidden>Delete ${name}? Its clusters are then planned alone.
        <button type="button" data-confirm-delete="${name}">Delete</button>
        <button type="button" data-cancel-delete>Cancel</button></span>
      <span class="error" data-error-for="delete"></span>
    </span>
  </div>`;
}

const groupPath = (group: string): string => `/federation-groups/${encodeURIComponent(group)}`;

// What a group's link costs (PATCH /federation-groups/{group} takes each).
const LINK_FIELDS = [
  "inter_cluster_bandwidth_mib_per_s",
  "inter_cluster_overhead_s",
  "inter_cluster_egress_gpu_s_per_gib",
] as const;

/** An admin's form for the group's link figures, filled with today's. */
function linkEditor(group: FederationGroup): string {
  const input = (field: (typeof LINK_FIELDS)[number], label: string): string =>
    `<label>${label} <input name="${field}" type="number" step="any" size="8" value="${esc(String(group[field]))}"></label>
     <span class="error" data-error-for="${field}"></span>`;
  return `<form class="link-editor" data-link-form="${esc(group.name)}">
      ${input("inter_cluster_bandwidth_mib_per_s", "Bandwidth, MiB/s")}
      ${input("inter_cluster_overhead_s", "Overhead, s")}
      ${input("inter_cluster_egress_gpu_s_per_gib", "Egress, GPU-s a GiB")}
      <button>Save link</button> <span class="error" data-error-for="link"></span>
    </form>`;
}

/** PATCHes the link figures; a refusal is shown by the field the API names. */
async function saveLink(group: string, form: HTMLFormElement): Promise<void> {
  const body: Record<string, number> = {};
  for (const field of LINK_FIELDS) {
    const text = (form.elements.namedItem(field) as HTMLInputElement).value.trim();
    if (text) body[field] = Number(text);
  }
  for (const error of form.querySelectorAll(".error")) error.textContent = "";
  try {
    await api(groupPath(group), { method: "PATCH", body: JSON.stringify(body) });
  } catch (error) {
    if (error instanceof Unauthorized) return;
    const field = error instanceof ApiError ? error.field : null;
    const at =
      form.querySelector(`[data-error-for="${CSS.escape(field ?? "link")}"]`) ?? form.querySelector('[data-error-for="link"]');
    if (at) at.textContent = (error as Error).message;
    return;
  }
  await redraw();
}

/**
 * Makes a change; the page is redrawn from the API when it was made, and otherwise the
 * refusal is written to ``errorAt`` and everything typed stays where it was.
 */
async function change(errorAt: Element | null, controls: Element, request: () => Promise<unknown>): Promise<void> {
  if (errorAt) errorAt.textContent = "";
  const buttons = [...controls.querySelectorAll<HTMLButtonElement>("button")].filter((b) => !b.disabled);
  buttons.forEach((b) => (b.disabled = true));
  try {
    await request();
  } catch (error) {
    if (!(error instanceof Unauthorized) && errorAt) errorAt.textContent = (error as Error).message;
    return;
  } finally {
    buttons.forEach((b) => (b.disabled = false));
  }
  await redraw();
}

function redraw(): Promise<void> {
  return showFederation().catch((error: unknown) => {
    if (!isAbort(error) && !(error instanceof Unauthorized)) console.error(error);
  });
}

/** ``key=value`` lines (blank lines skipped) as the map PATCH /clusters/{name} replaces. */
function parseLabels(text: string): Record<string, string> {
  const entries = text.split("\n").flatMap((line, at): [string, string][] => {
    if (!line.trim()) return [];
    const equals = line.indexOf("=");
    if (equals < 0) throw new Error(`labels: line ${at + 1} (${line.trim()}) is not key=value`);
    return [[line.slice(0, equals).trim(), line.slice(equals + 1).trim()]];
  });
  // fromEntries, not assignment: a key such as __proto__ stays a key, for the API to judge.
  return Object.fromEntries(entries);
}

const GROUP_FIELDS: string[] = ["name", "description", ...LINK_FIELDS];

async function createGroup(form: HTMLFormElement): Promise<void> {
  const value = (field: string): string => (form.elements.namedItem(field) as HTMLInputElement).value.trim();
  const errors = new Map(GROUP_FIELDS.map((f) => [f, form.querySelector(`[data-error-for="${f}"]`)]));
  for (const error of errors.values()) if (error) error.textContent = "";
  const body: Record<string, string | number> = { name: value("name") };
  if (value("description")) body.description = value("description");
  for (const field of LINK_FIELDS) {
    // Left empty: the API's default.
    if (value(field)) body[field] = Number(value(field));
  }
  // Shown by the field at fault (the API names it), else under the form.
  const at = (error: unknown): Element | null => {
    const field = error instanceof ApiError ? error.field : null;
    return errors.get(field ?? "") ?? form.querySelector("#group-form-error");
  };
  $("#group-form-error").textContent = "";
  try {
    await api("/federation-groups", { method: "POST", body: JSON.stringify(body) });
  } catch (error) {
    if (error instanceof Unauthorized) return;
    const where = at(error);
    if (where) where.textContent = (error as Error).message;
    return;
  }
  form.reset();
  await redraw();
}

function onClick(event: Event): void {
  const target = event.target;
  if (!(target instanceof HTMLElement)) return;
  const card = target.closest<HTMLElement>(".group-card");
  const group = card?.dataset.group;
  if (!card || group === undefined) return;
  const { editLabels, removeMember, deleteGroup, confirmDelete } = target.dataset;
  const row = target.closest("tr");
  if (editLabels !== undefined) {
    const editor = card.querySelector<HTMLElement>(`tr[data-labels-of="${CSS.escape(editLabels)}"]`);
    if (editor) editor.hidden = !editor.hidden;
    editor?.querySelector("textarea")?.focus();
  } else if ("cancelLabels" in target.dataset) {
    const editor = target.closest<HTMLElement>("tr.label-editor");
    if (editor) editor.hidden = true;
  } else if (removeMember !== undefined && row) {
    const path = `${groupPath(group)}/clusters/${encodeURIComponent(removeMember)}`;
    void change(row.querySelector('[data-error-for="member"]'), row, () => api(path, { method: "DELETE" }));
  } else if (deleteGroup !== undefined || "cancelDelete" in target.dataset) {
    const asking = deleteGroup !== undefined;
    const ask = card.querySelector<HTMLElement>("[data-delete-group]");
    const confirming = card.querySelector<HTMLElement>(".delete-confirm");
    if (ask) ask.hidden = asking;
    if (confirming) confirming.hidden = !asking;
  } else if (confirmDelete !== undefined) {
    const controls = card.querySelector(".delete-group") ?? card;
    void change(controls.querySelector('[data-error-for="delete"]'), controls, () => api(groupPath(group), { method: "DELETE" }));
  }
}

function onSubmit(event: Event): void {
  const form = event.target;
  if (!(form instanceof HTMLFormElement)) return;
  if (form.id === "group-form") {
    event.preventDefault();
    void createGroup(form);
    return;
  }
  const group = form.closest<HTMLElement>(".group-card")?.dataset.group;
  if (group === undefined) return;
  const { addCluster, labelsForm, linkForm } = form.dataset;
  if (addCluster !== undefined) {
    event.preventDefault();
    const cluster = (form.elements.namedItem("cluster") as HTMLSelectElement).value;
    const path = `${groupPath(group)}/clusters/${encodeURIComponent(cluster)}`;
    void change(form.querySelector('[data-error-for="cluster"]'), form, () => api(path, { method: "PUT" }));
  } else if (linkForm !== undefined) {
    event.preventDefault();
    void saveLink(group, form);
  } else if (labelsForm !== undefined) {
    event.preventDefault();
    const text = (form.elements.namedItem("label-lines") as HTMLTextAreaElement).value;
    const path = `/clusters/${encodeURIComponent(labelsForm)}`;
    void change(form.querySelector('[data-error-for="labels"]'), form, () =>
      api(path, { method: "PATCH", body: JSON.stringify({ labels: parseLabels(text) }) }),
    );
  }
}

/** Once, at start: the page's controls are redrawn, the section that holds them is not. */
export function wireFederation(): void {
  const section = $("#federation");
  section.addEventListener("click", onClick);
  section.addEventListener("submit", onSubmit);
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
