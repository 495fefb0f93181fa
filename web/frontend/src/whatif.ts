// The Simulations page's what-if form: an operator starts a run of a built-in scenario,
// or the replay of a trace file uploaded with it, under some policies (POST /simulations,
// JSON or multipart/form-data), the page follows its progress, and when it is done shows
// its result with the page's own table and chart.

import { api, ApiError, hasScope, isAbort, Latest, Unauthorized } from "./api";
import { $, esc, select } from "./dom";
import { showSimulations } from "./pages";
import type { WhatIfOptions, WhatIfRun } from "./types";

const POLL_MS = 700;
const optionsRequest = new Latest();
const pollRequest = new Latest();
let filled = false;
// The largest trace the API takes (GET /simulations/options), checked before sending.
let uploadMaxMb = Infinity;
// The run this page follows. Kept when the page is left, so that coming back resumes it.
let followed: string | null = null;
let timer: number | undefined;
// Replies that arrive after the page was left start no polling.
let onPage = false;

export async function showSimulationsPage(): Promise<void> {
  onPage = true;
  await Promise.all([showSimulations(), showForm()]);
  if (!followed && hasScope("operator")) {
    // A page opened (or reloaded) while a run is on follows it.
    const latest = await api<WhatIfRun[]>("/simulations/runs");
    followed = latest.find((r) => r.state === "queued" || r.state === "running")?.id ?? null;
  }
  if (followed && onPage) poll(followed);
}

/** The page was left: no more polls, and a reply still on its way is dropped. */
export function leaveSimulations(): void {
  onPage = false;
  window.clearTimeout(timer);
  pollRequest.begin();
}

export function wireWhatIf(): void {
  $("#whatif-form").addEventListener("submit", (event) => {
    event.preventDefault();
    void start();
  });
  // A chosen trace is replayed instead of the scenario, with the replay's own options.
  $("#whatif-trace").addEventListener("change", () => {
    const replaying = traceFile() !== null;
    select("#whatif-scenario").disabled = replaying;
    $("#whatif-replay").hidden = !replaying;
    clearErrors();
  });
}

function traceFile(): File | null {
  return $<HTMLInputElement>("#whatif-trace").files?.[0] ?? null;
}

const REPLAY_FIELDS: Record<string, string> = {
  gpus: "#whatif-gpus",
  gpus_per_node: "#whatif-gpus-per-node",
  window_end_h: "#whatif-window-end",
};

function clearErrors(): void {
  $("#whatif-error").textContent = "";
  for (const error of document.querySelectorAll("#whatif-form [data-error-for]")) error.textContent = "";
  for (const input of document.querySelectorAll("#whatif-form [aria-invalid]")) input.removeAttribute("aria-invalid");
}

/** Shown by the field at fault where the form has it (the API names it), else under the form. */
function showError(error: unknown): void {
  const field = error instanceof ApiError ? error.field : null;
  const where = field ? document.querySelector(`#whatif-form [data-error-for="${CSS.escape(field)}"]`) : null;
  (where ?? $("#whatif-error")).textContent = (error as Error).message;
  const input = field ? document.querySelector(`#whatif-form [name="${CSS.escape(field)}"]`) : null;
  if (where && input) input.setAttribute("aria-invalid", "true");
}

async function showForm(): Promise<void> {
  const form = $("#whatif-form");
  // The API refuses a viewer's run; the form is not offered to one.
  form.hidden = !hasScope("operator");
  if (form.hidden || filled) return;
  const { signal, current } = optionsRequest.begin();
  const options = await api<WhatIfOptions>("/simulations/options", { signal });
  if (!current()) return;
  uploadMaxMb = options.upload_max_mb;
  $("#whatif-trace-hint").insertAdjacentText("beforeend", `, up to ${options.upload_max_mb} MiB`);
  select("#whatif-scenario").innerHTML = options.scenarios.map((s) => `<option>${esc(s)}</option>`).join("");
  // All ticked, as `shaper sim compare` runs all by default.
  $("#whatif-policies").innerHTML =
    "<legend>Policies</legend>" +
    options.policies.map((p) => `<label><input type="checkbox" name="policy" value="${esc(p)}" checked> ${esc(p)}</label>`).join(" ");
  filled = true;
}

async function start(): Promise<void> {
  clearErrors();
  const policies = [...document.querySelectorAll<HTMLInputElement>("#whatif-policies input:checked")].map((i) => i.value);
  const seed = $<HTMLInputElement>("#whatif-seed").value.trim();
  const trace = traceFile();
  let body: string | FormData;
  if (trace) {
    if (trace.size > uploadMaxMb * 2 ** 20) {
      showError(new ApiError(`trace: over ${uploadMaxMb} MiB, the most an upload may send`, 413, "trace"));
      return;
    }
    body = new FormData();
    body.append("trace", trace, trace.name);
    for (const policy of policies) body.append("policies", policy);
    if (seed !== "") body.append("seed", seed);
    for (const [field, input] of Object.entries(REPLAY_FIELDS)) {
      const value = $<HTMLInputElement>(input).value.trim();
      if (value !== "") body.append(field, value);
    }
  } else {
    body = JSON.stringify({ scenario: select("#whatif-scenario").value, policies, seed: seed === "" ? null : Number(seed) });
  }
  try {
    const run = await api<WhatIfRun>("/simulations", { method: "POST", body });
    followed = run.id;
    render(run);
    if (onPage) poll(run.id);
  } catch (error) {
    if (!(error instanceof Unauthorized)) showError(error);
  }
}

function poll(id: string): void {
  window.clearTimeout(timer);
  const { signal, current } = pollRequest.begin();
  api<WhatIfRun>(`/simulations/runs/${encodeURIComponent(id)}`, { signal })
    .then(async (run) => {
      if (!current()) return;
      render(run);
      if (run.state === "queued" || run.state === "running") {
        timer = window.setTimeout(() => poll(id), POLL_MS);
        return;
      }
      followed = null;
      if (run.state === "done" && run.result) await showResult(run.result);
    })
    .catch((error: unknown) => {
      if (!isAbort(error) && current()) $("#whatif-error").textContent = (error as Error).message;
    });
}

function render(run: WhatIfRun): void {
  const active = run.state === "queued" || run.state === "running";
  const bar = $<HTMLProgressElement>("#whatif-progress");
  bar.hidden = !active;
  bar.value = run.progress;
  const done = `${run.policies_done} of ${run.policies.length} policies done`;
  const status = $("#whatif-status");
  status.dataset.state = run.state;
  status.textContent = {
    queued: `${run.scenario}: queued behind another run`,
    running: `${run.scenario}: running ${run.current_policy ?? ""} · ${done} · ${(100 * run.progress).toFixed(0)} %`,
    done: `${run.scenario}: done, ${run.policies.join(", ")}${run.seed == null ? "" : ` (seed ${run.seed})`}`,
    failed: `${run.scenario}: failed`,
  }[run.state];
  $("#whatif-error").textContent = run.error ?? "";
}

async function showResult(name: string): Promise<void> {
  // Chosen before the listing is read again, which keeps the choice once it lists it.
  const chooser = select("#sim-result");
  if (![...chooser.options].some((o) => o.value === name)) chooser.add(new Option(name, name));
  chooser.value = name;
  await showSimulations();
}
