// The dashboard's first script (app.js): a few hundred bytes, so that it takes no time to
// run. It takes the token, starts the reads the first page needs (who the token is, the
// clusters and, on the overview, its figures) and only then runs the rest of the
// dashboard (main.ts, main.js): the server answers while the browser parses and runs that.
// It is built on its own (build.mjs) and imports no code that main.ts imports: that would be
// a second copy, with state of its own. Its reads reach main.ts through start().

import "uplot/dist/uPlot.min.css";
import "./style.css";

// A token in the URL fragment (from `shaper demo`) is taken once and removed from the
// address (its query, such as ?refresh_ms=, stays).
const fromFragment = new URLSearchParams(location.hash.slice(1)).get("token");
if (fromFragment) history.replaceState(null, "", `${location.pathname}${location.search}#overview`);
const token = fromFragment || sessionStorage.getItem("shaper-token");

/** A GET begun here, as api.ts would make it; the first api() call for its path takes it. */
export interface Begun {
  response: Promise<Response>;
  controller: AbortController;
}

function begin(path: string): Begun {
  const controller = new AbortController();
  const response = fetch(`/api/v1${path}`, {
    signal: controller.signal,
    headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json" },
  });
  response.catch(() => undefined); // its taker gets the failure; an untaken read has none
  return { response, controller };
}

const begun: Record<string, Begun> = {};
if (token) {
  // The overview is the page shown when the address names none (or one that is no page:
  // main.ts reads it then without this head start).
  const view = location.hash.slice(1).split("&")[0];
  if (view === "" || view === "overview") begun["/overview"] = begin("/overview");
  begun["/whoami"] = begin("/whoami");
  begun["/clusters"] = begin("/clusters");
}

// main.js works on the page: it runs once the document is parsed (this script is deferred,
// index.html, so it is by now; the wait is for a page that loads it otherwise).
const parsed =
  document.readyState === "loading"
    ? new Promise((done) => document.addEventListener("DOMContentLoaded", done, { once: true }))
    : Promise.resolve();
// Its name as the browser sees it (beside this file), not one for esbuild to bundle in.
const MAIN = "./main.js";
void parsed
  .then(() => import(MAIN) as Promise<typeof import("./main")>)
  .then((main) => main.start(token, begun));
