// Shaper dashboard: a thin client of the REST API. The token lives in sessionStorage only.
// Loaded by app.js (boot.ts), which has begun the first page's reads: start() takes them.

import { adoptReads, api, dropReads, isAbort, session, Unauthorized } from "./api";
import { $, esc, select } from "./dom";
import { planGroup, showFederation, whatIf, wireFederation } from "./federation";
import { fillForecastClusters, showForecasts, wireForecasts } from "./forecasts";
import { showJob } from "./job";
import { showNodes, wireMap } from "./map";
import { fillClusterFilter, followWidth, readFiguresEarly, redrawChart, showOverview } from "./overview";
import { showPlan, wirePlan } from "./plan";
import { pageState, showActions, showIdle, showPolicies, showSimulations } from "./pages";
import { policyWritten, showPolicyHistory } from "./policy_history";
import { fillQueueClusters, showQueue, wireQueue } from "./queue";
import { leaveSimulations, showSimulationsPage, wireWhatIf } from "./whatif";
import type { Begun } from "./boot";
import type { Cluster, Policy } from "./types";

let clusters: Cluster[] = [];

function signOut(message = ""): void {
  sessionStorage.removeItem("shaper-token");
  dropReads();
  session.token = null;
  session.scopes = [];
  document.querySelectorAll<HTMLElement>(".view").forEach((v) => (v.hidden = true));
  $("#login").hidden = false;
  $("#login-error").textContent = message;
}
session.onUnauthorized = signOut;

async function signIn(token: string): Promise<void> {
  session.token = token;
  // The overview's figures are read beside who the token is and the clusters, not after.
  if (viewAsked() === "overview") readFiguresEarly();
  try {
    const [me, listed] = await Promise.all([
      api<{ name: string; scopes: string[] }>("/whoami"),
      api<Cluster[]>("/clusters"),
    ]);
    // A read app.js began for a page no longer asked for (the address changed meanwhile)
    // goes: kept, a later first visit would draw its old reply as current.
    dropReads();
    sessionStorage.setItem("shaper-token", token);
    session.scopes = me.scopes;
    $("#whoami").textContent = `${me.name} · ${me.scopes.join(", ")}`;
    $("#login").hidden = true;
    clusters = listed;
    for (const id of ["#node-cluster", "#idle-cluster"]) {
      select(id).innerHTML = clusters.map((c) => `<option>${esc(c.name)}</option>`).join("");
    }
    fillClusterFilter(clusters);
    fillQueueClusters(clusters);
    fillForecastClusters(clusters);
    route();
  } catch (error) {
    if (!(error instanceof Unauthorized)) signOut(String((error as Error).message ?? error));
  }
}

const VIEWS: Record<string, () => Promise<void>> = {
  overview: () => showOverview(clusters),
  nodes: showNodes,
  jobs: showQueue,
  job: showJob,
  actions: showActions,
  plan: showPlan,
  policies: showPolicies,
  simulations: showSimulationsPage,
  idle: showIdle,
  federation: showFederation,
  forecasts: showForecasts,
};

/** The view the address asks for (the overview when it asks for none or an unknown one). */
function viewAsked(): string {
  const asked = (location.hash || "#overview").slice(1).split("&")[0] || "overview";
  return asked in VIEWS ? asked : "overview";
}

function route(): void {
  const view = viewAsked();
  if (view !== "simulations") leaveSimulations();
  document.querySelectorAll<HTMLElement>(".view").forEach((v) => (v.hidden = v.id !== view));
  // A job's page belongs to the queue, a plan's to Plans & actions.
  const tab = view === "job" ? "jobs" : view === "plan" ? "actions" : view;
  document.querySelectorAll<HTMLAnchorElement>("#nav a").forEach((a) => a.classList.toggle("active", a.dataset.view === tab));
  run(VIEWS[view]);
}

function run(show: () => Promise<void>): void {
  show().catch((error: unknown) => {
    if (!isAbort(error) && !(error instanceof Unauthorized)) console.error(error);
  });
}

document.addEventListener("click", async (event) => {
  const target = event.target;
  if (!(target instanceof HTMLElement)) return;
  const { planDecide, decide, edit, id, whatIf: whatIfGroup, planGroup: planned, policyHistory } = target.dataset;
  if (policyHistory) {
    run(() => showPolicyHistory(policyHistory));
  } else if (whatIfGroup) {
    run(() => whatIf(whatIfGroup));
  } else if (planned) {
    run(() => planGroup(planned));
  } else if (planDecide || decide) {
    const path = planDecide ? `/plans/${id}/${planDecide}` : `/actions/${id}/${decide}`;
    try {
      await api(path, { method: "POST" });
    } catch (error) {
      alert((error as Error).message);
    }
    run(showActions);
  } else if (edit) {
    const policy = pageState.policies[edit];
    $<HTMLInputElement>("#policy-name").value = policy.name;
    $<HTMLTextAreaElement>("#policy-spec").value = JSON.stringify(policy.spec, null, 2);
    $("#policy-editor-title").textContent = `Edit ${policy.name} (now version ${policy.version})`;
  }
});

// A version written by the form, a rollback or an import (policy_history.ts).
document.addEventListener("policy-written", (event) => {
  const saved = (event as CustomEvent<Policy>).detail;
  pageState.policies[saved.name] = saved;
  run(showPolicies);
  if ($<HTMLInputElement>("#policy-name").value !== saved.name) return;
  // The version written, from the server: more than one past the version the form was
  // opened on when someone else saved in between; and its terms, so that the next save
  // starts from them rather than from what a rollback or an import replaced.
  $("#policy-editor-title").textContent = `Edit ${saved.name} (now version ${saved.version})`;
  $<HTMLTextAreaElement>("#policy-spec").value = JSON.stringify(saved.spec, null, 2);
});

$("#policy-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  $("#policy-error").textContent = "";
  let spec: unknown;
  try {
    spec = JSON.parse($<HTMLTextAreaElement>("#policy-spec").value);
  } catch (error) {
    $("#policy-error").textContent = `spec is not JSON: ${(error as Error).message}`;
    return;
  }
  const name = $<HTMLInputElement>("#policy-name").value;
  const comment = $<HTMLInputElement>("#policy-comment").value;
  try {
    const saved = pageState.policies[name]
      ? await api<Policy>(`/policies/${encodeURIComponent(name)}`, { method: "PUT", body: JSON.stringify({ spec, comment }) })
      : await api<Policy>("/policies", { method: "POST", body: JSON.stringify({ name, spec, comment }) });
    policyWritten(saved);
  } catch (error) {
    $("#policy-error").textContent = (error as Error).message;
  }
});

$("#login-form").addEventListener("submit", (event) => {
  event.preventDefault();
  void signIn($<HTMLInputElement>("#token-input").value.trim());
});
for (const id of ["#group-by", "#util-cluster", "#util-range"]) select(id).addEventListener("change", redrawChart);
select("#node-cluster").addEventListener("change", () => run(showNodes));
select("#sim-result").addEventListener("change", () => run(showSimulations));
select("#idle-cluster").addEventListener("change", () => run(showIdle));
window.addEventListener("hashchange", () => {
  if (session.token) route();
});
followWidth();
wireFederation();
wireForecasts();
wireQueue();
wirePlan();
wireMap();
wireWhatIf();

/** Called by app.js (boot.ts) with the token it found (in the URL fragment or this tab's
 * storage) and the reads it began with it. */
export function start(token: string | null, begun: Record<string, Begun>): void {
  adoptReads(token, begun);
  if (token) void signIn(token);
  else signOut();
}
