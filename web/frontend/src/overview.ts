// Fleet overview: per-cluster figures (GET /overview) and utilization over time
// (GET /utilization) drawn by uPlot (chart.ts, loaded once the figures are drawn: the
// cards come first, and a fresh load does not wait for uPlot's code).
//
// While shown, the page reads everything again every refreshPeriodMs() (refresh.ts): the
// figures and cards are rewritten only where they changed, and the chart only when its
// data did, keeping its zoom and its tooltip.

import { api, Latest } from "./api";
import { $, COLORS, esc, grouped, select } from "./dom";
import { Poller, redraw } from "./refresh";
import type {
  Cluster,
  ClusterFigures,
  FleetOverview,
  GpuFigures,
  SimulationListing,
  SimulationResult,
  UtilizationSummary,
} from "./types";

const RANGES: Record<string, { hours: number; bucket_s: number }> = {
  "6h": { hours: 6, bucket_s: 600 },
  "24h": { hours: 24, bucket_s: 1800 },
  "7d": { hours: 168, bucket_s: 3600 },
};

const figuresRequest = new Latest();
const chartRequest = new Latest();
const replayRequest = new Latest();
// The chart's code (uPlot), once asked for.
type Chart = typeof import("./chart");
let chartCode: Promise<Chart> | null = null;
let chart: Chart | null = null;

function loadChart(): Promise<Chart> {
  chartCode ??= import("./chart").then(
    (code) => (chart = code),
    (error: unknown) => {
      chartCode = null; // asked for again next time
      throw error;
    },
  );
  return chartCode;
}
// The reply the chart was drawn from: the same one again leaves it as it is.
let chartFrom = "";

/** The page as the router shows it, with the clusters as read at sign-in. */
export async function showOverview(clusters: Cluster[]): Promise<void> {
  await load(clusters, false);
}

/** ``clusters`` null: read them too (a refresh). */
async function load(clusters: Cluster[] | null, refreshing: boolean): Promise<void> {
  try {
    const figures = showFigures(clusters);
    // The chart and the replay are read once the figures are drawn (or have failed): the
    // cards share neither the server nor the page's thread with them.
    await Promise.allSettled([figures]);
    await Promise.all([figures, showChart(refreshing), showReplay()]);
  } finally {
    // Said once the page is drawn (or has failed): main.ts then fetches the cluster map's
    // code in idle time.
    if (!refreshing) document.dispatchEvent(new Event("overview-drawn"));
    poller.schedule();
  }
}

const poller = new Poller("overview", () => load(null, true));

// The counterfactual: the latest `shaper sim compare` result, each policy's utilization
// beside FIFO's (the Simulations page has the rest).
async function showReplay(): Promise<void> {
  const { signal, current } = replayRequest.begin();
  const results = await api<SimulationListing[]>("/simulations", { signal });
  if (!current()) return;
  const panel = $("#replay");
  if (!results.length) {
    redraw(panel, '<p class="hint">No replay yet: <code>shaper sim compare</code> writes one.</p>');
    return;
  }
  const latest = results[0];
  const result = await api<SimulationResult>(`/simulations/${encodeURIComponent(latest.name)}`, { signal });
  if (!current()) return;
  const fifo = result.runs.fifo?.metrics.utilization;
  const rows = Object.entries(result.runs)
    .map(([policy, run]) => {
      const util = run.metrics.utilization;
      const delta = fifo == null || policy === "fifo" ? "" : `${util >= fifo ? "+" : ""}${(100 * (util - fifo)).toFixed(1)} pt`;
      return `<tr data-policy="${esc(policy)}"><td>${esc(policy)}</td><td>${(100 * util).toFixed(1)} %</td><td>${delta}</td></tr>`;
    })
    .join("");
  redraw(
    panel,
    `<h3>Latest replay</h3>
    <p class="hint">${esc(latest.scenario)}${latest.seed == null ? "" : ` (seed ${latest.seed})`}: GPU utilization by policy over the same trace</p>
    <table><thead><tr><th>Policy</th><th>Util</th><th>vs FIFO</th></tr></thead><tbody>${rows}</tbody></table>
    <p><a href="#simulations">All results</a></p>`,
  );
}

// The figures' read started at sign-in (readFiguresEarly), for the first showing to take.
interface FiguresRead {
  reply: Promise<FleetOverview>;
  signal: AbortSignal;
  current: () => boolean;
}
let early: FiguresRead | null = null;

/**
 * Starts reading the figures now, beside sign-in's reads (main.ts), when the overview is
 * the page it will show: on a fresh load they are then not read only after those.
 */
export function readFiguresEarly(): void {
  const { signal, current } = figuresRequest.begin();
  const reply = api<FleetOverview>("/overview", { signal });
  reply.catch(() => undefined); // showFigures takes the failure, if it takes the read
  early = { reply, signal, current };
}

/** The early read if no read has begun since it, else a new one. */
function figuresRead(): FiguresRead {
  const started = early;
  early = null;
  if (started?.current()) return started;
  const { signal, current } = figuresRequest.begin();
  return { reply: api<FleetOverview>("/overview", { signal }), signal, current };
}

async function showFigures(known: Cluster[] | null): Promise<void> {
  const { reply, signal, current } = figuresRead();
  // A refresh reads the clusters too: their connector status and any cluster new since.
  const [overview, clusters] = await Promise.all([
    reply,
    known ? Promise.resolve(known) : api<Cluster[]>("/clusters", { signal }),
  ]);
  if (!current()) return;
  const byName = new Map(clusters.map((c) => [c.name, c]));
  redraw($("#fleet-figures"), figureList(overview.fleet, "fleet"));
  redraw(
    $("#cluster-cards"),
    overview.clusters.map((figures) => card(figures, byName.get(figures.cluster))).join("") ||
      "<p>No clusters registered yet.</p>",
  );
  redraw(
    $("#overview-note"),
    esc(
      `Idle but allocated: GPUs held by jobs on nodes that measured under ${Math.round(100 * overview.busy_threshold)} % busy ` +
        `over the last ${Math.round(overview.recent_s / 60)} min; unmeasured: nodes with no sample in that time.`,
    ),
  );
}

function card(figures: ClusterFigures, cluster: Cluster | undefined): string {
  const status = cluster?.connector_status ?? "never_seen";
  return `
    <div class="card" data-cluster="${esc(figures.cluster)}">
      <h3>${esc(figures.cluster)} <span class="badge ${esc(status)}">${esc(status)}</span></h3>
      <div>${esc(cluster?.scheduler)} · mode <b>${esc(figures.mode)}</b> · policy ${esc(cluster?.policy)}</div>
      <div class="big">${cluster?.gpu_count ?? figures.gpus} GPUs</div><div>${cluster?.node_count ?? 0} nodes</div>
      ${usageBar(figures)}
      ${figureList(figures, figures.cluster)}
      <div class="hint">${esc(cluster?.description)}</div>
    </div>`;
}

function usageBar(f: GpuFigures): string {
  if (!f.gpus) return "";
  const pct = (v: number): string => `${((100 * v) / f.gpus).toFixed(2)}%`;
  const busy = f.allocated - f.idle_allocated - f.unmeasured_allocated;
  return `<div class="usage" role="img" title="${f.allocated} of ${f.gpus} GPUs allocated (${f.idle_allocated} idle, ${f.unmeasured_allocated} unmeasured), ${f.free} free" aria-label="${f.allocated} of ${f.gpus} GPUs allocated, ${f.idle_allocated} of them idle, ${f.free} free">
    <span class="busy" style="width:${pct(busy)}"></span><span class="unmeasured" style="width:${pct(f.unmeasured_allocated)}"></span><span class="idle" style="width:${pct(f.idle_allocated)}"></span><span class="free" style="width:${pct(f.free)}"></span>
  </div>`;
}

const plural = (n: number, one: string, many: string): string => (n === 1 ? one : many);

function figureList(f: GpuFigures, key: string): string {
  const item = (label: string, name: keyof GpuFigures, unit = "", extra = ""): string =>
    `<div><dt>${label}</dt><dd><span data-figure="${name}">${grouped(f[name])}</span>${unit}${extra}</dd></div>`;
  return `<dl class="figures" data-figures="${esc(key)}">
    ${item("Allocated", "allocated", ` / ${grouped(f.gpus)} GPUs`)}
    ${item("Free", "free", " GPUs")}
    ${item("Idle but allocated", "idle_allocated", " GPUs", f.unmeasured_allocated ? ` <span class="hint">(+<span data-figure="unmeasured_allocated">${grouped(f.unmeasured_allocated)}</span> unmeasured)</span>` : "")}
    ${item("Pending", "pending_jobs", plural(f.pending_jobs, " job", " jobs"), ` · <span data-figure="pending_gpus">${grouped(f.pending_gpus)}</span> GPUs`)}
    ${item("Awaiting approval", "awaiting_approval_actions", plural(f.awaiting_approval_actions, " action", " actions"), ` · <span data-figure="awaiting_approval_plans">${grouped(f.awaiting_approval_plans)}</span>${plural(f.awaiting_approval_plans, " plan", " plans")}`)}
    ${f.gpus_down ? item("Down", "gpus_down", " GPUs") : ""}
  </dl>`;
}

export function fillClusterFilter(clusters: Cluster[]): void {
  select("#util-cluster").innerHTML =
    '<option value="">all clusters</option>' + clusters.map((c) => `<option>${esc(c.name)}</option>`).join("");
}

/** ``refreshing``: the same selection read again, so a zoom into it is kept. */
async function showChart(refreshing = false): Promise<void> {
  const range = RANGES[select("#util-range").value] ?? RANGES["24h"];
  const params = new URLSearchParams({ group_by: select("#group-by").value, bucket_s: String(range.bucket_s) });
  const cluster = select("#util-cluster").value;
  if (cluster) params.set("cluster", cluster);
  // No until: the server's own clock; since is only set for a range other than its 24 h.
  if (range.hours !== 24) {
    params.set("since", new Date(Date.now() - range.hours * 3600_000).toISOString());
  }
  const { signal, current } = chartRequest.begin();
  const [summary, code] = await Promise.all([
    api<UtilizationSummary>(`/utilization?${params}`, { signal }),
    loadChart(),
  ]);
  if (!current()) return;
  // The same reply redraws nothing: the zoom, the cursor and its tooltip stay.
  const from = JSON.stringify(summary);
  if (code.drawn() && from === chartFrom) return;
  chartFrom = from;
  code.draw($("#util-chart"), summary, refreshing, COLORS);
}

export function redrawChart(): void {
  showChart(false).catch(reportChartError);
}

function reportChartError(error: unknown): void {
  if (error instanceof DOMException && error.name === "AbortError") return;
  chart?.drop();
  $("#util-chart").textContent = `Could not load utilization: ${String(error)}`;
}

// The chart is as wide as its panel, whatever the window does.
export function followWidth(): void {
  const holder = $("#util-chart");
  new ResizeObserver(() => {
    if (holder.clientWidth > 0) chart?.fit(holder.clientWidth);
  }).observe(holder);
}
