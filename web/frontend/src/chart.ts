// The overview's utilization chart, drawn by uPlot, which keeps 100k points interactive:
// its cursor gives the tooltip and legend values, a drag on the plot zooms, a double click
// zooms back out. A file of its own (with uPlot, half the dashboard's code), loaded by
// overview.ts once the figures and cards are drawn: a fresh load does not wait for it. It
// imports none of the dashboard's modules (one shared with main.js would be another file
// for main.js to fetch before it runs).

import uPlot from "uplot";
import type { UtilizationSummary } from "./types";

const CHART_HEIGHT = 300;
const formatTime = uPlot.fmtDate("{YYYY}-{MM}-{DD} {HH}:{mm}");

let plot: uPlot | null = null;

/** Whether a chart is drawn. */
export function drawn(): boolean {
  return plot !== null;
}

/** Takes the chart away (its holder then says why). */
export function drop(): void {
  plot?.destroy();
  plot = null;
}

/** As wide as its panel. */
export function fit(width: number): void {
  plot?.setSize({ width, height: CHART_HEIGHT });
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

/** Draws the chart anew in ``holder`` from ``summary``, a group's lines in the next of
 * ``colors`` (``refreshing``: the same selection read again, so a zoom into it and the
 * cursor are kept). */
export function draw(
  holder: HTMLElement,
  summary: UtilizationSummary,
  refreshing: boolean,
  colors: readonly string[],
): void {
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
    const stroke = colors[k % colors.length];
    const gpus = group.points.map((p) => p.allocated_gpus);
    // Teams share their clusters' capacity: their line is their share of it, and the
    // legend names the team alone (a capacity would be the same for every team).
    const label = summary.group_by === "team" ? group.key : `${group.key} · ${group.capacity_gpus.toLocaleString("en")} GPUs`;
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
