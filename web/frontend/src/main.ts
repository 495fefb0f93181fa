// Shaper dashboard: a thin client of the REST API. The token lives in sessionStorage only.
// Loaded by app.js (boot.ts), which has begun the first page's reads: start() takes them.

import { adoptReads, api, dropReads, isAbort, session, Unauthorized } from "./api";
import { $, count, esc, select } from "./dom";
import { fillClusterFilter, followWidth, readFiguresEarly, redrawChart, showOverview } from "./overview";
import type { Begun } from "./boot";
import type { Cluster, Policy } from "./types";

// The other pages' code (build.mjs): each page's file is loaded when the page is first
// shown (or something on it is used), so a fresh load of the overview parses and runs only
// the overview's. They take this file's shared modules from it, one copy of their state.
export * from "./api";
export * from "./dom";
export * from "./refresh";

let clusters: Cluster[] = [];
// Each route() call (and signing out): a page's code that arrives after a later one shows
// nothing.
let routed = 0;

function signOut(message = ""): void {
  routed++; // a page whose code is still on its way is not shown
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
  // The overview's figures are read beside who the token is and the clusters, not after;
  // another page's code is asked for then too (route() takes it).
  if (viewAsked() === "overview") readFiguresEarly();
  else Promise.resolve(VIEWS[viewAsked()]()).catch(() => undefined);
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
    queueCode.refill();
    forecastsCode.refill();
    route();
  } catch (error) {
    if (!(error instanceof Unauthorized)) signOut(String((error as Error).message ?? error));
  }
}

/** A page's file that did not load (import() rejected: the network, the server). */
class CodeNotLoaded extends Error {
  constructor(
    readonly file: string,
    cause: unknown,
  ) {
    super(String((cause as Error)?.message ?? cause));
  }
}

/** A page's code, loaded once (wired and given the clusters then); a failed load is tried
 * again next time. */
class Code<T> {
  /** The code once here and wired. */
  now: T | null = null;
  private loaded: Promise<T> | null = null;

  constructor(
    // Its file, as the error shown when it does not load names it.
    private readonly file: string,
    private readonly load: () => Promise<T>,
    private readonly wire: (code: T) => void = () => {},
    // Gives the page the clusters as read at sign-in.
    private readonly fill: (code: T) => void = () => {},
  ) {}

  get(): Promise<T> {
    this.loaded ??= this.load().then(
      (code) => {
        this.wire(code);
        this.fill(code);
        this.now = code;
        return code;
      },
      (error: unknown) => {
        this.loaded = null;
        throw new CodeNotLoaded(this.file, error);
      },
    );
    return this.loaded;
  }

  /** The clusters again, if the code is here (a page whose code comes later takes them then). */
  refill(): void {
    if (this.now) this.fill(this.now);
  }
}

const mapCode = new Code("map.js", () => import("./map"), (code) => code.wireMap());
const queueCode = new Code(
  "queue.js",
  () => import("./queue"),
  (code) => code.wireQueue(),
  (code) => code.fillQueueClusters(clusters),
);
const jobCode = new Code("job.js", () => import("./job"));
const pagesCode = new Code("pages.js", () => import("./pages"));
const planCode = new Code("plan.js", () => import("./plan"), (code) => code.wirePlan());
const historyCode = new Code("policy_history.js", () => import("./policy_history"));
const whatIfCode = new Code("whatif.js", () => import("./whatif"), (code) => code.wireWhatIf());
const federationCode = new Code("federation.js", () => import("./federation"), (code) => code.wireFederation());
const forecastsCode = new Code(
  "forecasts.js",
  () => import("./forecasts"),
  (code) => code.wireForecasts(),
  (code) => code.fillForecastClusters(clusters),
);

// Each view: how it is shown, once its code is here (the overview's is in this file).
type Show = () => Promise<void>;
const VIEWS: Record<string, () => Show | Promise<Show>> = {
  overview: () => () => showOverview(clusters),
  nodes: () => mapCode.get().then((code) => code.showNodes),
  jobs: () => queueCode.get().then((code) => code.showQueue),
  job: () => jobCode.get().then((code) => code.showJob),
  actions: () => pagesCode.get().then((code) => code.showActions),
  plan: () => planCode.get().then((code) => code.showPlan),
  policies: () => pagesCode.get().then((code) => code.showPolicies),
  simulations: () => whatIfCode.get().then((code) => code.showSimulationsPage),
  idle: () => pagesCode.get().then((code) => code.showIdle),
  federation: () => federationCode.get().then((code) => code.showFederation),
  forecasts: () => forecastsCode.get().then((code) => code.showForecasts),
};

/** The view the address asks for (the overview when it asks for none or an unknown one). */
function viewAsked(): string {
  const asked = (location.hash || "#overview").slice(1).split("&")[0] || "overview";
  return asked in VIEWS ? asked : "overview";
}

// Each page's name, as the error that its code did not load says it.
const TITLES: Record<string, string> = { job: "job", plan: "plan" };
document.querySelectorAll<HTMLAnchorElement>("#nav a").forEach((a) => (TITLES[a.dataset.view ?? ""] = a.textContent ?? ""));

/** Says in the page (#page-error, an alert) that a page's code did not load, with a button
 * that tries again; ``what``: the page, or what was asked of it. */
function showNotLoaded(what: string, error: CodeNotLoaded, retry: () => void): void {
  const panel = $("#page-error");
  panel.innerHTML = `<p>${esc(what)} could not be loaded: its code, ${esc(error.file)}, did not arrive (${esc(error.message)}).</p>
    <button type="button">Retry</button>`;
  panel.querySelector("button")?.addEventListener("click", () => {
    clearNotLoaded();
    retry();
  });
}

function clearNotLoaded(): void {
  $("#page-error").textContent = "";
}

function route(): void {
  const view = viewAsked();
  clearNotLoaded();
  if (view !== "simulations") whatIfCode.now?.leaveSimulations();
  // A job's page belongs to the queue, a plan's to Plans & actions.
  const tab = view === "job" ? "jobs" : view === "plan" ? "actions" : view;
  document.querySelectorAll<HTMLAnchorElement>("#nav a").forEach((a) => a.classList.toggle("active", a.dataset.view === tab));
  const mine = ++routed;
  // The page is shown once its code is here and wired: no control of it is ever dead.
  const shown = (show: Show): void => {
    if (mine !== routed) return;
    document.querySelectorAll<HTMLElement>(".view").forEach((v) => (v.hidden = v.id !== view));
    run(show);
  };
  const code = VIEWS[view]();
  if (code instanceof Promise) {
    code.then(shown, (error: unknown) => {
      if (mine !== routed) return;
      console.error(error);
      if (!(error instanceof CodeNotLoaded)) return;
      // Not the page asked for: the one before it goes, the error says which could not come.
      document.querySelectorAll<HTMLElement>(".view").forEach((v) => (v.hidden = true));
      showNotLoaded(`The ${TITLES[view] ?? view} page`, error, route);
    });
  } else {
    shown(code);
  }
}

/** ``what``: what the action does, for the error shown if the code it needs does not load. */
function run(show: () => Promise<void>, what = "This page's part"): void {
  show().catch((error: unknown) => {
    if (isAbort(error) || error instanceof Unauthorized) return;
    console.error(error);
    if (error instanceof CodeNotLoaded) showNotLoaded(what, error, () => run(show, what));
  });
}

document.addEventListener("click", async (event) => {
  const target = event.target;
  if (!(target instanceof HTMLElement)) return;
  const { planDecide, decide, edit, id, whatIf: whatIfGroup, planGroup: planned, policyHistory } = target.dataset;
  if (policyHistory) {
    run(async () => (await historyCode.get()).showPolicyHistory(policyHistory), "The policy's versions");
  } else if (whatIfGroup) {
    run(async () => (await federationCode.get()).whatIf(whatIfGroup), "The what-if");
  } else if (planned) {
    run(async () => (await federationCode.get()).planGroup(planned), "The group's plan");
  } else if (planDecide || decide) {
    const path = planDecide ? `/plans/${id}/${planDecide}` : `/actions/${id}/${decide}`;
    try {
      await api(path, { method: "POST" });
    } catch (error) {
      alert((error as Error).message);
    }
    run(async () => (await pagesCode.get()).showActions(), "The Plans & actions page");
  } else if (edit) {
    const policy = (await pagesCode.get()).pageState.policies[edit];
    $<HTMLInputElement>("#policy-name").value = policy.name;
    $<HTMLTextAreaElement>("#policy-spec").value = JSON.stringify(policy.spec, null, 2);
    $("#policy-editor-title").textContent = `Edit ${policy.name} (now version ${policy.version})`;
  }
});

// A version written by the form, a rollback or an import (policy_history.ts).
document.addEventListener("policy-written", async (event) => {
  const saved = (event as CustomEvent<Policy>).detail;
  const { pageState, showPolicies } = await pagesCode.get();
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
    const [{ pageState }, { policyWritten }] = await Promise.all([pagesCode.get(), historyCode.get()]);
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
select("#node-cluster").addEventListener("change", () => run(async () => (await mapCode.get()).showNodes(), "The cluster map"));
select("#sim-result").addEventListener("change", () => run(async () => (await pagesCode.get()).showSimulations(), "The simulation result"));
select("#idle-cluster").addEventListener("change", () => run(async () => (await pagesCode.get()).showIdle(), "Why idle"));
window.addEventListener("hashchange", () => {
  if (session.token) route();
});
// The overview drawn, the cluster map's code is fetched (and Intl's locale data loaded) in
// idle time, once: a first visit to the map then waits for its read alone, not for its code.
document.addEventListener(
  "overview-drawn",
  () => {
    const warm = (): void => {
      count.format(0);
      mapCode.get().catch(() => undefined); // fetched again when the map is shown
    };
    // Safari has no requestIdleCallback.
    if (typeof requestIdleCallback === "function") requestIdleCallback(warm, { timeout: 2_000 });
    else setTimeout(warm, 0);
  },
  { once: true },
);
followWidth();

/** Called by app.js (boot.ts) with the token it found (in the URL fragment or this tab's
 * storage) and the reads it began with it. */
export function start(token: string | null, begun: Record<string, Begun>): void {
  adoptReads(token, begun);
  if (token) void signIn(token);
  else signOut();
}
