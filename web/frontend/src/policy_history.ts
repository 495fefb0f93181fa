// An SLA policy's history (the SLA policies page): its versions (GET
// /policies/{name}/versions) with who wrote each, when and why, and a field-by-field diff
// between any two — by default the latest against the one before (policy_diff.ts).
//
// An operator can roll back to an older version (POST /policies/{name}/rollback: a new
// version with its terms) and import a YAML file, seeing its diff before saving
// (policy_yaml.ts); anyone can export a version as YAML.

import { api, hasScope, isAbort, Latest, Unauthorized } from "./api";
import { $, esc, select } from "./dom";
import { diff, diffRows, specFields } from "./policy_diff";
import { wirePolicyYaml } from "./policy_yaml";
import type { Policy } from "./types";

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
  const mayWrite = hasScope("operator") && !newestFirst[0].deleted;
  const options = newestFirst.map((v) => `<option value="${v.version}">version ${v.version}${v.deleted ? " (deleted)" : ""}</option>`).join("");
  panel.innerHTML = `<h2 id="policy-history-title">History of ${esc(name)} <span class="hint">${newestFirst.length} version${newestFirst.length === 1 ? "" : "s"}</span></h2>
    <div class="policy-yaml"><button type="button" id="policy-export">Export YAML</button>${
      mayWrite
        ? ` <label class="file-button">Import YAML <input type="file" id="policy-import-file" accept=".yaml,.yml,application/yaml,text/yaml"></label>`
        : ""
    }</div>
    <p id="policy-history-error" class="error" role="alert"></p>
    <div id="policy-import" hidden></div>
    <table id="policy-versions"><thead><tr><th>Version</th><th>When (UTC)</th><th>By</th><th>Comment</th>${mayWrite ? "<th></th>" : ""}</tr></thead><tbody>${newestFirst
      .map(
        (v, index) => `<tr data-version="${v.version}"${v.deleted ? ' class="deleted"' : ""}><td>${v.version}${v.deleted ? ' <span class="badge">deleted</span>' : ""}</td>
      <td>${esc(v.created_at.slice(0, 19).replace("T", " "))}</td><td data-figure="by">${esc(v.created_by)}</td><td data-figure="comment">${v.comment ? esc(v.comment) : '<span class="hint">no comment</span>'}</td>${
        // The current version and the deletion itself are no place to roll back to.
        mayWrite ? `<td>${index > 0 && !v.deleted ? `<button type="button" data-rollback="${v.version}">Roll back to this version</button>` : ""}</td>` : ""
      }</tr>`,
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
  for (const button of panel.querySelectorAll<HTMLButtonElement>("button[data-rollback]")) {
    button.addEventListener("click", () => void rollBack(name, Number(button.dataset.rollback), latest.version));
  }
  wirePolicyYaml(name, latest, policyWritten);
}

/** Tell the page a version was written (main.ts redraws the list and the editor) and
 *  redraw this history with it. */
export function policyWritten(saved: Policy): void {
  document.dispatchEvent(new CustomEvent<Policy>("policy-written", { detail: saved }));
  if (historyShownFor() === saved.name) void showPolicyHistory(saved.name);
}

async function rollBack(name: string, version: number, current: number): Promise<void> {
  const error = $("#policy-history-error");
  error.textContent = "";
  if (!confirm(`Roll ${name} back to version ${version}? This writes a new version (after ${current}) with version ${version}'s terms; the next shaping cycle uses them.`)) return;
  try {
    const saved = await api<Policy>(`/policies/${encodeURIComponent(name)}/rollback`, {
      method: "POST",
      body: JSON.stringify({ version }),
    });
    policyWritten(saved);
  } catch (failure) {
    if (!(failure instanceof Unauthorized)) error.textContent = (failure as Error).message;
  }
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
  $("#policy-diff tbody").innerHTML = diffRows(changes);
  const panel = $("#policy-history");
  panel.dataset.from = String(from.version);
  panel.dataset.to = String(to.version);
}

/** A version's spec as field path → value (JSON), and whether it is a deletion. */
function fieldsOf(policy: Policy): Map<string, string> {
  const fields = specFields(policy.spec);
  if (policy.deleted) fields.set(DELETED, "true");
  return fields;
}
