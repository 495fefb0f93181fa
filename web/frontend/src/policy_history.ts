// An SLA policy's history (the SLA policies page): its versions (GET
// /policies/{name}/versions) with who wrote each, when and why, and a field-by-field diff
// between any two — by default the latest against the one before.
//
// A field is a path into the spec: a team or service is named by its `team` or `service`
// rather than its place in the list (teams[research].guaranteed_gpus), so reordering the
// teams changes nothing and a team added or removed shows as its fields added or removed.

import { api, isAbort, Latest, Unauthorized } from "./api";
import { $, esc, select } from "./dom";
import type { Policy } from "./types";

// The lists whose entries are named by a field (app.policies.models.SlaPolicySpec).
const NAMED_BY: Record<string, string> = { teams: "team", services: "service" };
const DELETED = "(policy deleted)";

const request = new Latest();
let shown: { name: string; versions: Policy[] } | null = null;

/** The policy whose history is on the page, if any (a save of it redraws the history). */
export function historyShownFor(): string | null {
  return shown?.name ?? null;
}

export async function showPolicyHistory(name: string): Promise<void> {
  const panel = $("#policy-history");
  const { signal, current } = request.begin();
  let versions: Policy[];
  try {
    versions = await api<Policy[]>(`/policies/${encodeURIComponent(name)}/versions`, { signal });
  } catch (failure) {
    if (current() && !isAbort(failure) && !(failure instanceof Unauthorized)) {
      panel.innerHTML = `<p class="error">Could not load the history of ${esc(name)}: ${esc((failure as Error).message)}</p>`;
    }
    return;
  }
  if (!current()) return;
  const newestFirst = [...versions].sort((a, b) => b.version - a.version);
  shown = { name, versions: newestFirst };
  const options = newestFirst.map((v) => `<option value="${v.version}">version ${v.version}${v.deleted ? " (deleted)" : ""}</option>`).join("");
  panel.innerHTML = `<h2 id="policy-history-title">History of ${esc(name)} <span class="hint">${newestFirst.length} version${newestFirst.length === 1 ? "" : "s"}</span></h2>
    <table id="policy-versions"><thead><tr><th>Version</th><th>When (UTC)</th><th>By</th><th>Comment</th></tr></thead><tbody>${newestFirst
      .map(
        (v) => `<tr data-version="${v.version}"${v.deleted ? ' class="deleted"' : ""}><td>${v.version}${v.deleted ? ' <span class="badge">deleted</span>' : ""}</td>
      <td>${esc(v.created_at.slice(0, 19).replace("T", " "))}</td><td data-figure="by">${esc(v.created_by)}</td><td data-figure="comment">${v.comment ? esc(v.comment) : '<span class="hint">no comment</span>'}</td></tr>`,
      )
      .join("")}</tbody></table>
    <div class="diff-controls"><label>Compare <select id="diff-from" aria-label="the older version">${options}</select></label>
    <label>with <select id="diff-to" aria-label="the newer version">${options}</select></label></div>
    <p id="policy-diff-summary" class="hint"></p>
    <table id="policy-diff"><thead><tr><th>Field</th><th id="diff-from-head"></th><th id="diff-to-head"></th></tr></thead><tbody></tbody></table>`;
  const [latest, before] = [newestFirst[0], newestFirst[1] ?? newestFirst[0]];
  select("#diff-from").value = String(before.version);
  select("#diff-to").value = String(latest.version);
  for (const id of ["#diff-from", "#diff-to"]) select(id).addEventListener("change", drawDiff);
  panel.dataset.policy = name;
  panel.dataset.latest = String(latest.version);
  drawDiff();
}

function drawDiff(): void {
  if (!shown) return;
  const versions = shown.versions;
  const pick = (id: string): Policy | undefined => versions.find((v) => String(v.version) === select(id).value);
  const [from, to] = [pick("#diff-from"), pick("#diff-to")];
  if (!from || !to) return;
  $("#diff-from-head").textContent = `version ${from.version}`;
  $("#diff-to-head").textContent = `version ${to.version}`;
  const changes = diff(fieldsOf(from), fieldsOf(to));
  const summary = $("#policy-diff-summary");
  if (from.version === to.version) summary.textContent = `Version ${to.version} against itself: choose two versions.`;
  else if (!changes.length) summary.textContent = `Versions ${from.version} and ${to.version} have the same spec.`;
  else summary.textContent = `${changes.length} field${changes.length === 1 ? "" : "s"} differ between version ${from.version} and version ${to.version}.`;
  $("#policy-diff tbody").innerHTML = changes
    .map(
      (c) => `<tr data-field="${esc(c.field)}" data-change="${c.change}" class="diff-${c.change}" title="${c.change}"><td><code>${esc(c.field)}</code></td>
      <td class="old">${c.old === undefined ? '<span class="hint">—</span>' : `<code>${esc(c.old)}</code>`}</td>
      <td class="new">${c.new === undefined ? '<span class="hint">—</span>' : `<code>${esc(c.new)}</code>`}</td></tr>`,
    )
    .join("");
  const panel = $("#policy-history");
  panel.dataset.from = String(from.version);
  panel.dataset.to = String(to.version);
}

interface FieldChange {
  field: string;
  change: "added" | "removed" | "changed";
  old: string | undefined;
  new: string | undefined;
}

/** The fields that differ, in the newer version's order, then those only the older has. */
function diff(older: Map<string, string>, newer: Map<string, string>): FieldChange[] {
  const changes: FieldChange[] = [];
  for (const [field, value] of newer) {
    const was = older.get(field);
    if (was === undefined) changes.push({ field, change: "added", old: undefined, new: value });
    else if (was !== value) changes.push({ field, change: "changed", old: was, new: value });
  }
  for (const [field, value] of older) {
    if (!newer.has(field)) changes.push({ field, change: "removed", old: value, new: undefined });
  }
  return changes;
}

/** A version's spec as field path → value (JSON), and whether it is a deletion. */
function fieldsOf(policy: Policy): Map<string, string> {
  const fields = new Map<string, string>();
  if (policy.spec && typeof policy.spec === "object") {
    for (const [key, value] of Object.entries(policy.spec)) flatten(value, key, key, fields);
  }
  if (policy.deleted) fields.set(DELETED, "true");
  return fields;
}

function flatten(value: unknown, path: string, key: string, into: Map<string, string>): void {
  const nameKey = NAMED_BY[key];
  if (Array.isArray(value) && nameKey && value.every((e) => e && typeof e === "object" && typeof e[nameKey] === "string")) {
    for (const entry of value as Record<string, unknown>[]) {
      const prefix = `${path}[${String(entry[nameKey])}]`;
      const rest = Object.entries(entry).filter(([k]) => k !== nameKey);
      // An entry of nothing but its name is still there.
      if (!rest.length) into.set(prefix, "{}");
      for (const [k, v] of rest) flatten(v, `${prefix}.${k}`, k, into);
    }
  } else if (value && typeof value === "object" && !Array.isArray(value) && Object.keys(value).length) {
    for (const [k, v] of Object.entries(value)) flatten(v, `${path}.${k}`, k, into);
  } else {
    // Scalars, lists of scalars and empty containers are compared whole.
    into.set(path, JSON.stringify(value));
  }
}
