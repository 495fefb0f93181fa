// Fleet overview: per-cluster figures (GET /overview) and utilization over time
// (GET /utilization) drawn by uPlot, which keeps 100k points interactive: its cursor gives
// the tooltip and legend values, a drag on the plot zooms, a double click zooms back out.
//
// While shown, the page reads everything again every refreshPeriodMs() (refresh.ts): the
// figures and cards are rewritten only where they changed, and the chart only when its
// data did, keeping its zoom and its tooltip.

import uPlot from "uplot";
import { api, Latest } from "./api";
import { $, COLORS, count, esc, select } from "./dom";
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

const CHART_HEIGHT = 300;
const RANGES: Record<string, { hours: number; bucket_s: number }> = {
  "6h": { hours: 6, bucket_s: 600 },
  "24h": { hours: 24, bucket_s: 1800 },
  "7d": { hours: 168, bucket_s: 3600 },
};
const formatTime = uPlot.fmtDate("{YYYY}-{MM}-{DD} {HH}:{mm}");

const figuresRequest = new Latest();
const chartRequest = new Latest();
const replayRequest = new Latest();
let plot: uPlot | null = null;
// The reply the chart was drawn from: the same one again leaves it as it is.
let chartFrom = "";

/** The page as the router shows it, with the clusters as read at sign-in. */
export async function showOverview(clusters: Cluster[]): Promise<void> {
  await load(clusters, false);
}

/** ``clusters`` null: read them too (a refresh). */
async function load(clusters: Cluster[] | null, refreshing: boolean): Promise<void> {
  try {
    await Promise.all([showFigures(clusters), showChart(refreshing), showReplay()]);
  } finally {
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
    `<div><dt>${label}</dt><dd><span data-figure="${name}">${count.format(f[name])}</span>${unit}${extra}</dd></div>`;
  return `<dl class="figures" data-figures="${esc(key)}">
    ${item("Allocated", "allocated", ` / ${count.format(f.gpus)} GPUs`)}
    ${item("Free", "free", " GPUs")}
    ${item("Idle but allocated", "idle_allocated", " GPUs", f.unmeasured_allocated ? ` <span class="hint">(+<span data-figure="unmeasured_allocated">${count.format(f.unmeasured_allocated)}</span> unmeasured)</span>` : "")}
    ${item("Pending", "pending_jobs", plural(f.pending_jobs, " job", " jobs"), ` · <span data-figure="pending_gpus">${count.format(f.pending_gpus)}</span> GPUs`)}
    ${item("Awaiting approval", "awaiting_approval_actions", plural(f.awaiting_approval_actions, " action", " actions"), ` · <span data-figure="awaiting_approval_plans">${count.format(f.awaiting_approval_plans)}</span>${plural(f.awaiting_approval_plans, " plan", " plans")}`)}
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
  const summary = await api<UtilizationSummary>(`/utilization?${params}`, { signal });
  if (!current()) return;
  // The same reply redraws nothing: the zoom, the cursor and its tooltip stay.
  const from = JSON.stringify(summary);
  if (plot && from === chartFrom) return;
  chartFrom = from;
  draw(summary, refreshing);
}

export function redrawChart(): void {
  showChart(false).catch(reportChartError);
}

function reportChartError(error: unknown): void {
  if (error instanceof DOMException && error.name === "AbortError") return;
  plot?.destroy();
  plot = null;
  $("#util-chart").textContent = `Could not load utilization: ${String(error)}`;
}

/** What a refreshed chart keeps of the one it replaces (same grouping): the zoomed range,
 * and the cursor where it was over the plot (so its tooltip stays open). */
interface Kept {
  zoom: { min: number; max: number } | null;
  cursor: { left: number; top: number } | null;
}

function keep(summary: UtilizationSummary, holder: HTMLElement): Kept {
  if (!plot || holder.dataset.groupBy !== summary.group_by) return { zoom: null, cursor: null };
  const times = plot.data[0];
  const { min, max } = plot.scales.x;
  const zoomed = min != null && max != null && times.length > 0 && (min > times[0] || max < times[times.length - 1]);
  const { left, top } = plot.cursor;
  return {
    zoom: zoomed ? { min, max } : null,
    cursor: left != null && top != null && left >= 0 && top >= 0 ? { left, top } : null,
  };
}

function draw(summary: UtilizationSummary, refreshing: boolean): void {
  const holder = $("#util-chart");
  const kept: Kept = refreshing ? keep(summary, holder) : { zoom: null, cursor: null };
  plot?.destroy();
  plot = null;
  holder.replaceChildren();
  const groups = summary.series.filter((s) => s.points.length);
  holder.dataset.groupBy = summary.group_by;
  holder.dataset.keys = groups.map((s) => s.key).join(",");
  holder.dataset.points = String(groups[0]?.points.length ?? 0);
  if (!groups.length) {
    holder.textContent = "No allocation history yet.";
    return;
  }
  const times = groups[0].points.map((p) => Date.parse(p.start) / 1000);
  const data: (number | null)[][] = [times];
  const series: uPlot.Series[] = [{ label: "Time", value: (_u, v) => (v == null ? "–" : formatTime(new Date(v * 1000))) }];
  groups.forEach((group, k) => {
    const stroke = COLORS[k % COLORS.length];
    const gpus = group.points.map((p) => p.allocated_gpus);
    // Teams share their clusters' capacity: their line is their share of it, and the
    // legend names the team alone (a capacity would be the same for every team).
    const label = summary.group_by === "team" ? group.key : `${group.key} · ${count.format(group.capacity_gpus)} GPUs`;
    data.push(group.points.map((p) => 100 * p.allocated_share));
    series.push({
      label,
      stroke,
      width: 2,
      value: (_u, v, _s, idx) => (v == null || idx == null ? "–" : `${v.toFixed(1)} % · ${gpus[idx].toFixed(1)} GPUs`),
    });
    if (group.points.some((p) => p.measured_util != null)) {
      data.push(group.points.map((p) => (p.measured_util == null ? null : 100 * p.measured_util)));
      series.push({
        label: `${group.key} busy`,
        stroke,
        width: 1.5,
        dash: [5, 4],
        value: (_u, v) => (v == null ? "–" : `${v.toFixed(1)} % busy`),
      });
    }
  });
  const options: uPlot.Options = {
    width: Math.max(320, holder.clientWidth),
    height: CHART_HEIGHT,
    series,
    scales: { y: { range: [0, 100] } },
    axes: [{}, { values: (_u, ticks) => ticks.map((t) => `${t} %`), size: 56 }],
    cursor: { drag: { x: true, y: false, setScale: true } },
    legend: { live: true },
    plugins: [tooltip()],
    hooks: {
      setScale: [
        (u, key) => {
          if (key !== "x") return;
          holder.dataset.xMin = String(u.scales.x.min);
          holder.dataset.xMax = String(u.scales.x.max);
        },
      ],
    },
  };
  plot = new uPlot(options, data as uPlot.AlignedData, holder);
  holder.dataset.xMin = String(times[0]);
  holder.dataset.xMax = String(times[times.length - 1]);
  if (kept.zoom) plot.setScale("x", kept.zoom);
  if (kept.cursor) plot.setCursor(kept.cursor);
}

// The values under the cursor, next to it: uPlot gives the index and positions, this only
// places a box.
function tooltip(): uPlot.Plugin {
  let box: HTMLDivElement;
  return {
    hooks: {
      init: (u) => {
        box = document.createElement("div");
        box.className = "chart-tooltip";
        box.hidden = true;
        u.over.appendChild(box);
      },
      setCursor: (u) => {
        const { idx, left, top } = u.cursor;
        if (idx == null || left == null || top == null || left < 0) {
          box.hidden = true;
          return;
        }
        const rows = [formatTime(new Date((u.data[0][idx] as number) * 1000))];
        u.series.forEach((s, i) => {
          const v = u.data[i][idx];
          if (i === 0 || !s.show || v == null) return;
          const text = typeof s.value === "function" ? s.value(u, v, i, idx) : String(v);
          rows.push(`${String(s.label)}: ${String(text)}`);
        });
        box.replaceChildren(...rows.map((row) => Object.assign(document.createElement("div"), { textContent: row })));
        box.hidden = false;
        const flip = left > u.over.clientWidth / 2;
        box.style.left = flip ? "" : `${left + 12}px`;
        box.style.right = flip ? `${u.over.clientWidth - left + 12}px` : "";
        box.style.top = `${Math.min(top, u.over.clientHeight - box.offsetHeight)}px`;
      },
    },
  };
}

// The chart is as wide as its panel, whatever the window does.
export function followWidth(): void {
  const holder = $("#util-chart");
  new ResizeObserver(() => {
    if (plot && holder.clientWidth > 0) plot.setSize({ width: holder.clientWidth, height: CHART_HEIGHT });
  }).observe(holder);
}
