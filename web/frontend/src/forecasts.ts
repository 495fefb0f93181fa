// Forecast accuracy (GET /forecast-accuracy): how good the shaping cycle's live forecasts
// were over a window, each beside the naive forecast it replaced. Per elastic service, the
// next-hour demand forecast's error, bias and coverage of the SLA quantile; per cluster,
// block-job run-time predictions against the team's median run time.
//
// The selection (cluster, window) lives in the address (#forecasts&cluster=…&window_h=…),
// so a link opens the same view. A value there that the page does not offer is ignored:
// the window sent is always one of WINDOWS, which the API accepts (1 h … 30 days).

import { api, isAbort, Latest, Unauthorized } from "./api";
import { $, count, esc, select } from "./dom";
import type { Cluster, DurationAccuracy, ForecastAccuracy, Job, LeadAccuracy, Page, ServiceAccuracy } from "./types";

// Hours; the longest is what the server keeps (app.forecasts.service.MAX_WINDOW_H).
const WINDOWS: [number, string][] = [
  [24, "24 h"],
  [168, "7 d"],
  [720, "30 d"],
];
// Below these a figure is shown but not judged: a few hours or jobs say little.
export const MIN_HOURS = 12;
export const MIN_JOBS = 5;
// A naive error this small is none (app.forecasts.service.EXACT): no skill is given.
const EXACT = 1e-9;

const request = new Latest();

export function fillForecastClusters(clusters: Cluster[]): void {
  const chooser = select("#forecast-cluster");
  const chosen = chooser.value;
  chooser.innerHTML =
    '<option value="">all clusters</option>' + clusters.map((c) => `<option value="${esc(c.name)}">${esc(c.name)}</option>`).join("");
  chooser.value = clusters.some((c) => c.name === chosen) ? chosen : "";
}

/** Once, at start: the window choices, and a change of selection redraws the view. */
export function wireForecasts(): void {
  select("#forecast-window").innerHTML = WINDOWS.map(([hours, label]) => `<option value="${hours}">${esc(label)}</option>`).join("");
  for (const id of ["#forecast-cluster", "#forecast-window"]) {
    select(id).addEventListener("change", () => {
      history.replaceState(null, "", `#forecasts&${query(select("#forecast-cluster").value, Number(select("#forecast-window").value))}`);
      showForecasts().catch((error: unknown) => {
        if (!isAbort(error) && !(error instanceof Unauthorized)) console.error(error);
      });
    });
  }
}

function query(cluster: string, windowH: number): URLSearchParams {
  const params = new URLSearchParams();
  if (cluster) params.set("cluster", cluster);
  params.set("window_h", String(windowH));
  return params;
}

/** The address's selection where the page offers it; the selects' own otherwise. */
function selection(): { cluster: string; windowH: number } {
  const asked = new URLSearchParams(location.hash.slice(1));
  const clusterChooser = select("#forecast-cluster");
  const windowChooser = select("#forecast-window");
  const cluster = asked.get("cluster");
  if (cluster !== null && [...clusterChooser.options].some((o) => o.value === cluster)) clusterChooser.value = cluster;
  const windowH = asked.get("window_h");
  if (windowH !== null && WINDOWS.some(([hours]) => String(hours) === windowH)) windowChooser.value = windowH;
  const chosen = Number(windowChooser.value);
  return { cluster: clusterChooser.value, windowH: WINDOWS.some(([hours]) => hours === chosen) ? chosen : WINDOWS[0][0] };
}

export async function showForecasts(): Promise<void> {
  const { cluster, windowH } = selection();
  const { signal, current } = request.begin();
  const error = $("#forecast-error");
  let summary: ForecastAccuracy;
  let elastic: number | null = null;
  try {
    summary = await api<ForecastAccuracy>(`/forecast-accuracy?${query(cluster, windowH)}`, { signal });
    if (!summary.services.length) {
      // Why nothing was scored: no service to forecast, or none scored yet. Only the total
      // counts; sorted by team, which no index orders, the database picks the elastic jobs
      // out of ix_jobs_state_demand (which holds the shape) instead of walking the default
      // order's index through every job's row for one (100,000 jobs, none elastic: 145 →
      // 13 ms of SQLite's CPU; tests/app/test_queue_index.py).
      const inCluster = cluster ? `&cluster=${encodeURIComponent(cluster)}` : "";
      elastic = (await api<Page<Job>>(`/jobs?shape=elastic&limit=1&sort=team${inCluster}`, { signal })).total;
    }
  } catch (failure) {
    if (current() && !isAbort(failure) && !(failure instanceof Unauthorized)) {
      error.textContent = `Could not load forecast accuracy: ${(failure as Error).message}`;
      error.hidden = false;
      $("#forecast-services").innerHTML = "";
      $("#forecast-durations").innerHTML = "";
      $("#forecast-leads").innerHTML = "";
      $("#forecast-span").textContent = "";
    }
    return;
  }
  if (!current()) return;
  error.hidden = true;
  error.textContent = "";
  const view = $("#forecasts");
  view.dataset.cluster = cluster;
  view.dataset.windowH = String(summary.window_h);
  const where = cluster ? esc(cluster) : "any cluster";
  const span = WINDOWS.find(([hours]) => hours === summary.window_h)?.[1] ?? `${summary.window_h} h`;
  $("#forecast-span").textContent = `Hours that ended and jobs that finished from ${when(summary.since)} to ${when(summary.until)} UTC (${span}).`;
  const unjudged = summary.services.filter((s) => s.hours_scored < MIN_HOURS).length;
  $("#forecast-services").innerHTML = summary.services.length
    ? servicesTable(summary.services, !cluster) +
      (unjudged
        ? `<p class="hint" data-note="too-few">${count.format(unjudged)} of ${count.format(summary.services.length)} ${summary.services.length === 1 ? "service has" : "services have"} fewer than ${MIN_HOURS} hours scored yet: ${unjudged === 1 ? "its" : "their"} figures are shown, not judged.</p>`
        : "")
    : `<p class="empty hint" data-empty="${elastic ? "none-scored" : "no-services"}">${
        elastic
          ? `No service forecast scored in the last ${span} in ${where} yet: each cycle records every elastic service's forecast of the next hour once an hour and scores it when that hour has ended (5 minutes after), so the first score comes about an hour after the first forecast. A service is judged against the naive forecast from ${MIN_HOURS} scored hours on.`
          : `No elastic services in ${where}: only a service's demand is forecast (block jobs' run times are below).`
      }</p>`;
  const leads = summary.by_lead.filter((l) => l.service !== null);
  $("#forecast-leads").innerHTML = leads.length
    ? leadsTable(leads, !cluster)
    : `<p class="empty hint" data-empty="none-scored">No forecast scored in the last ${span} in ${where} at any lead time.</p>`;
  $("#forecast-durations").innerHTML = summary.durations.length
    ? durationsTable(summary.durations)
    : `<p class="empty hint" data-empty="none-scored">No block job with a run-time prediction finished in the last ${span} in ${where}: a prediction is scored when its job finishes (failed and cancelled jobs are left out).</p>`;
}

const when = (iso: string): string => iso.slice(0, 16).replace("T", " ");

// Fixed decimals (the CLI report's); the API's exact value is in data-value.
const fixed = (v: number, digits: number): string => v.toFixed(digits);
const percent = (v: number | null): string => (v == null ? "–" : `${(100 * v).toFixed(1)} %`);

/** A sign on what is not zero at the digits shown; a typographic minus. */
function signed(v: number, digits: number): string {
  const magnitude = Math.abs(v).toFixed(digits);
  if (Number(magnitude) === 0) return magnitude;
  return `${v > 0 ? "+" : "−"}${magnitude}`;
}

function figure(name: string, value: number | null, text: string): string {
  return `<span data-figure="${name}" data-value="${value == null ? "" : esc(value)}">${esc(text)}</span>`;
}

type Verdict = "better" | "worse" | "even" | "too-few";

const VERDICT_TEXT: Record<Verdict, string> = {
  better: "▲ better than naive",
  worse: "▼ worse than naive",
  even: "= as naive",
  "too-few": "too few to judge",
};

/** The model against naive, from the skill (1 − MAE / naive MAE) as shown. */
function verdict(skill: number | null, mae: number, scored: number, minimum: number): Verdict {
  if (scored < minimum) return "too-few";
  if (skill == null) return mae > EXACT ? "worse" : "even";
  const shown = Number((100 * skill).toFixed(1));
  return shown > 0 ? "better" : shown < 0 ? "worse" : "even";
}

function skillCell(skill: number | null, mae: number, scored: number, minimum: number, unit: string): string {
  const judged = verdict(skill, mae, scored, minimum);
  const title =
    judged === "too-few"
      ? `fewer than ${minimum} ${unit} scored`
      : skill == null
        ? "the naive forecast was exact: no ratio to it"
        : "1 − MAE / naive MAE: above 0 the model beats naive";
  const value = skill == null ? "–" : `${signed(100 * skill, 1)} %`;
  return `<td class="skill" title="${esc(title)}">${figure("skill", skill, value)} <span class="verdict ${judged}" data-verdict="${judged}">${esc(VERDICT_TEXT[judged])}</span></td>`;
}

function servicesTable(services: ServiceAccuracy[], withCluster: boolean): string {
  const rows = services
    .map((s) => {
      const methods = Object.entries(s.methods)
        .sort(([a], [b]) => a.localeCompare(b))
        .map(([method, hours]) => `${esc(method)} ${count.format(hours)}`)
        .join(", ");
      const covered = s.coverage >= s.target_quantile ? "met" : "under";
      return `<tr data-cluster="${esc(s.cluster)}" data-service="${esc(s.service)}">
        ${withCluster ? `<td>${esc(s.cluster)}</td>` : ""}<td>${esc(s.service)}</td>
        <td>${figure("hours_scored", s.hours_scored, count.format(s.hours_scored))}</td>
        <td>${figure("mae_replicas", s.mae_replicas, fixed(s.mae_replicas, 2))}</td>
        <td>${figure("naive_mae_replicas", s.naive_mae_replicas, fixed(s.naive_mae_replicas, 2))}</td>
        ${skillCell(s.skill, s.mae_replicas, s.hours_scored, MIN_HOURS, "hours")}
        <td title="${s.bias_replicas > 0 ? "over-forecast" : s.bias_replicas < 0 ? "under-forecast" : ""}">${figure("bias_replicas", s.bias_replicas, signed(s.bias_replicas, 2))}</td>
        <td class="coverage ${covered}" data-coverage="${covered}" title="${covered === "met" ? "demand stayed at or under the reserved quantile as often as asked" : "demand went over the reserved quantile more often than the target allows"}">${figure("coverage", s.coverage, percent(s.coverage))} of ${figure("target_quantile", s.target_quantile, percent(s.target_quantile))} <span class="verdict">${covered === "met" ? "✓ meets target" : "▼ below target"}</span></td>
        <td data-figure="methods">${methods}</td></tr>`;
    })
    .join("");
  return `<table><thead><tr>${withCluster ? "<th>Cluster</th>" : ""}<th>Service</th><th>Hours scored</th><th>MAE (replicas)</th><th>Naive MAE</th><th>Skill</th><th>Bias</th><th>Coverage of target</th><th>Methods (hours)</th></tr></thead><tbody>${rows}</tbody></table>`;
}

function durationsTable(durations: DurationAccuracy[]): string {
  const rows = durations
    .map((d) => {
      const skill = d.naive_mae_hours > EXACT ? 1 - d.mae_hours / d.naive_mae_hours : null;
      return `<tr data-cluster="${esc(d.cluster)}">
        <td>${esc(d.cluster)}</td>
        <td>${figure("jobs_scored", d.jobs_scored, count.format(d.jobs_scored))}</td>
        <td>${figure("mae_hours", d.mae_hours, fixed(d.mae_hours, 2))}</td>
        <td>${figure("naive_mae_hours", d.naive_mae_hours, fixed(d.naive_mae_hours, 2))}</td>
        ${skillCell(skill, d.mae_hours, d.jobs_scored, MIN_JOBS, "jobs")}
        <td>${figure("bias_hours", d.bias_hours, signed(d.bias_hours, 2))}</td>
        <td>${figure("median_abs_pct_error", d.median_abs_pct_error, percent(d.median_abs_pct_error))}</td>
        <td>${figure("naive_median_abs_pct_error", d.naive_median_abs_pct_error, percent(d.naive_median_abs_pct_error))}</td>
        <td>${figure("median_ratio", d.median_ratio, d.median_ratio == null ? "–" : fixed(d.median_ratio, 2))}</td></tr>`;
    })
    .join("");
  return `<table><thead><tr><th>Cluster</th><th>Jobs scored</th><th>MAE (h)</th><th>Naive MAE (h)</th><th>Skill</th><th>Bias (h)</th><th>Median |% error|</th><th>Naive median |% error|</th><th>Median predicted / actual</th></tr></thead><tbody>${rows}</tbody></table>`;
}

/** Per service, each lead time's MAE beside naive's and the skill: how the error grows the
 * further ahead the solver looks (its look-ahead plans on every one of these hours). */
function leadsTable(leads: LeadAccuracy[], withCluster: boolean): string {
  const hours = [...new Set(leads.map((l) => l.lead_h))].sort((a, b) => a - b);
  const services = new Map<string, LeadAccuracy[]>();
  for (const lead of leads) {
    const key = `${lead.cluster}\u0000${lead.service ?? ""}`;
    services.set(key, [...(services.get(key) ?? []), lead]);
  }
  const rows = [...services.values()]
    .map((byLead) => {
      const { cluster, service } = byLead[0];
      const cells = hours
        .map((h) => {
          const l = byLead.find((each) => each.lead_h === h);
          if (!l) return `<td data-lead="${h}">–</td>`;
          const judged = verdict(l.skill, l.mae_replicas, l.hours_scored, MIN_HOURS);
          const skill = l.skill == null ? "–" : `${signed(100 * l.skill, 1)} %`;
          return `<td data-lead="${h}" title="${esc(`${count.format(l.hours_scored)} hours scored; bias ${signed(l.bias_replicas, 2)}; coverage ${percent(l.coverage)} of ${percent(l.target_quantile)}`)}">${figure("mae_replicas", l.mae_replicas, fixed(l.mae_replicas, 2))} / ${figure("naive_mae_replicas", l.naive_mae_replicas, fixed(l.naive_mae_replicas, 2))} <span class="verdict ${judged}" data-verdict="${judged}">${figure("skill", l.skill, skill)}</span></td>`;
        })
        .join("");
      return `<tr data-cluster="${esc(cluster)}" data-service="${esc(service ?? "")}">${withCluster ? `<td>${esc(cluster)}</td>` : ""}<td>${esc(service ?? "")}</td>${cells}</tr>`;
    })
    .join("");
  const heads = hours.map((h) => `<th data-lead="${h}">${h} h ahead</th>`).join("");
  return `<table><thead><tr>${withCluster ? "<th>Cluster</th>" : ""}<th>Service</th>${heads}</tr></thead><tbody>${rows}</tbody></table>`;
}
