// An SLA policy as a YAML file, for keeping policies in Git: export a version (GET
// /policies/{name}/export), and import a file (an operator), first seeing what it would
// change against the current version (POST …/import/preview, validated by the API as
// the import itself is) and then saving it as a new version (POST …/import).

import { api, session, Unauthorized } from "./api";
import { $, esc } from "./dom";
import { diff, diffRows, specFields } from "./policy_diff";
import type { Policy } from "./types";

interface ImportPreview {
  name: string;
  current_version: number;
  current_spec: unknown;
  spec: unknown;
  changed: boolean;
}

const YAML = { "Content-Type": "application/yaml" };

/** Wire the history panel's Export and Import controls for `name`, whose latest version
 *  is `latest`; `written` is told of a version an import wrote. */
export function wirePolicyYaml(name: string, latest: Policy, written: (saved: Policy) => void): void {
  $("#policy-export").addEventListener("click", () => void exportYaml(name, latest.version));
  const picker = document.querySelector<HTMLInputElement>("#policy-import-file");
  picker?.addEventListener("change", () => {
    const file = picker.files?.[0];
    // Cleared, so that choosing the same file again (after fixing it) is a change too.
    picker.value = "";
    if (file) void previewImport(name, file, written);
  });
}

async function exportYaml(name: string, version: number): Promise<void> {
  const error = $("#policy-history-error");
  error.textContent = "";
  // Not api(): the answer is YAML, not JSON.
  const response = await fetch(`/api/v1/policies/${encodeURIComponent(name)}/export?version=${version}`, {
    headers: { Authorization: `Bearer ${session.token ?? ""}` },
  });
  if (response.status === 401) {
    session.onUnauthorized("The token was refused (missing, expired or revoked).");
    return;
  }
  if (!response.ok) {
    const body = (await response.json().catch(() => null)) as { error?: { message: string } } | null;
    error.textContent = body?.error?.message ?? response.statusText;
    return;
  }
  const link = document.createElement("a");
  link.href = URL.createObjectURL(new Blob([await response.text()], { type: "application/yaml" }));
  link.download = `${name}-v${version}.yaml`;
  link.click();
  setTimeout(() => URL.revokeObjectURL(link.href), 0);
}

async function previewImport(name: string, file: File, written: (saved: Policy) => void): Promise<void> {
  const error = $("#policy-history-error");
  const panel = $("#policy-import");
  error.textContent = "";
  panel.hidden = true;
  const text = await file.text();
  let preview: ImportPreview;
  try {
    preview = await api<ImportPreview>(`/policies/${encodeURIComponent(name)}/import/preview`, {
      method: "POST",
      headers: YAML,
      body: text,
    });
  } catch (failure) {
    // The API's message names the field (or the line) once: "spec.teams[0].team: … (line 2)".
    if (!(failure instanceof Unauthorized)) error.textContent = `${file.name}: ${(failure as Error).message}`;
    return;
  }
  const changes = diff(specFields(preview.current_spec), specFields(preview.spec));
  const summary = preview.changed
    ? `${changes.length} field${changes.length === 1 ? "" : "s"} differ between version ${preview.current_version} and ${file.name}.`
    : `${file.name} has the terms of version ${preview.current_version} already; nothing to save.`;
  panel.innerHTML = `<h3 id="policy-import-title">Import ${esc(file.name)} into ${esc(name)}</h3>
    <p id="policy-import-summary">${esc(summary)}</p>
    ${
      changes.length
        ? `<table id="policy-import-diff"><thead><tr><th>Field</th><th>version ${preview.current_version}</th><th>${esc(file.name)}</th></tr></thead><tbody>${diffRows(changes)}</tbody></table>`
        : ""
    }
    ${preview.changed ? `<label>Comment <input id="policy-import-comment" size="60" value="${esc(`imported from ${file.name}`)}"></label> <button type="button" id="policy-import-save">Save as a new version</button>` : ""}
    <button type="button" id="policy-import-cancel">${preview.changed ? "Cancel" : "Close"}</button>`;
  panel.hidden = false;
  $("#policy-import-cancel").addEventListener("click", () => {
    panel.hidden = true;
    panel.innerHTML = "";
  });
  if (preview.changed) $("#policy-import-save").addEventListener("click", () => void saveImport(name, text, written));
}

async function saveImport(name: string, text: string, written: (saved: Policy) => void): Promise<void> {
  const error = $("#policy-history-error");
  error.textContent = "";
  const comment = $<HTMLInputElement>("#policy-import-comment").value;
  try {
    const saved = await api<Policy>(`/policies/${encodeURIComponent(name)}/import?comment=${encodeURIComponent(comment)}`, {
      method: "POST",
      headers: YAML,
      body: text,
    });
    written(saved);
  } catch (failure) {
    if (!(failure instanceof Unauthorized)) error.textContent = (failure as Error).message;
  }
}
