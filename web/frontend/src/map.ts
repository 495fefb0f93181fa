// The cluster map (#nodes): every node of the chosen cluster as a row of GPU cells, each
// coloured by the team or the job holding it, with a legend; a cell's title says its job,
// team, and the utilization and memory measured on it. The moves of the cluster's latest
// open plan are drawn on it (the cells a move leaves with a dashed border, the cells it
// takes outlined solid) and listed beside the map ("from → to"), linking plan and job.
//
// One read per view (GET /nodes/map), whatever the number of nodes; the colour control
// redraws from that reply, the model and state filters only hide rows, and neither asks
// again. A reply for a cluster no longer chosen is dropped (Latest). Rows off screen are
// not laid out until scrolled to (`content-visibility: auto` in style.css), so 1,000
// nodes stay quick to draw and scroll.
//
// At 10,000 GPUs the cost of a draw is the browser parsing the cells' markup: a cell has
// no style attribute (an inline style is a stylesheet parsed per element, five times the
// rest of a cell's markup), but a class for its colour (c0, c1 …, rules in a constructed
// stylesheet) and one for its measured-busy band (u0 … u14, style.css). The
// first rows are painted before the rest are put in, a short chunk per task after that frame.
//
// The map is an ARIA grid (a row per node, a gridcell per GPU) that the keyboard moves
// through (map_grid.ts); activating a cell, by click, Enter or Space, opens the page of
// the job holding the GPU.
//
// While shown, the map reads its cluster again every refreshPeriodMs() (refresh.ts). A
// reply with the same nodes, jobs and moves changes nothing but the summary's time; a
// changed one is drawn whole at once (no chunks: the page keeps its height, so the scroll
// position stays), the keyboard's tab stop and focus kept (placeTabStop).

import { api, isAbort, Latest, Unauthorized } from "./api";
import { $, COLORS, esc, select } from "./dom";
import { when } from "./format";
import { jobLink } from "./links";
import { placeTabStop, wireGrid } from "./map_grid";
import { Poller, redraw } from "./refresh";
import type { ClusterMap, MapCells, MapJob, MapNode, PlannedMove } from "./types";

const request = new Latest();
// The reply drawn last: the filters and the colour toggle redraw from it.
let shown: ClusterMap | null = null;
// Its nodes by name, for the cell a click or key activates.
let shownNodes = new Map<string, MapNode>();
// Rows drawn with the reply; then, per task until every node is drawn, STEP_ROWS at a
// time for as long as CHUNK_MS allows (made, not yet parsed: about as long again), so that
// a task stays short on a loaded machine and the frames after the first rows come soon.
const FIRST_ROWS = 60;
const STEP_ROWS = 20;
const CHUNK_MS = 5;
// Which draw is the latest: an older one's remaining chunks stop.
let drawing = 0;
// The most legend entries drawn (colouring by job at 1,000 nodes means thousands of jobs).
const LEGEND_MAX = 40;
// The reply drawn last, less its time (measured_since moves with every read), made when a
// refresh first compares a reply with it (not on a first read: it costs a frame at 1,000
// nodes).
let shownFrom: string | null = null;
// The band classes' steps: a cell's dark band is its utilization × BAND_PX pixels high.
const BAND_PX = 14;
const poller = new Poller("nodes", () => load(true));

/** The chosen cluster's map (the router, a change of cluster). */
export async function showNodes(): Promise<void> {
  await load(false);
}

async function load(refreshing: boolean): Promise<void> {
  try {
    await read(refreshing);
  } finally {
    poller.schedule();
  }
}

async function read(refreshing: boolean): Promise<void> {
  const cluster = select("#node-cluster").value;
  const { signal, current } = request.begin();
  const view = $("#gpu-map");
  if (!cluster) {
    shown = null;
    shownFrom = null;
    shownNodes = new Map();
    view.innerHTML = "<p>No clusters.</p>";
    return;
  }
  if (!refreshing) $("#map-error").hidden = true;
  let map: ClusterMap;
  try {
    map = await api<ClusterMap>(`/nodes/map?cluster=${encodeURIComponent(cluster)}`, { signal });
  } catch (failure) {
    if (current() && !isAbort(failure) && !(failure instanceof Unauthorized)) {
      // A failed refresh keeps the map shown, under the error; the next one may succeed.
      $("#map-error").hidden = false;
      $("#map-error").textContent = `Could not load the map of ${cluster}: ${(failure as Error).message}`;
    }
    return;
  }
  if (!current()) return;
  $("#map-error").hidden = true;
  const from = refreshing ? comparable(map) : null;
  const same = from !== null && shown !== null && from === (shownFrom ?? comparable(shown));
  shown = map;
  shownFrom = from;
  if (same) {
    summarise(map, select("#map-model").value, select("#map-state").value);
    return;
  }
  shownNodes = new Map(map.nodes.map((node) => [node.name, node]));
  fillModels(map);
  drawMap(refreshing);
}

/** A reply as the refresh compares it: everything but its time. */
function comparable(map: ClusterMap): string {
  return JSON.stringify({ ...map, measured_since: null });
}

/**
 * Draws the last reply in the current colouring: the first rows at once, the rest a chunk
 * per task once they are painted, so the first screen shows before 1,000 rows are parsed;
 * ``whole`` (a refresh), every row at once. A newer draw (another reply, another
 * colouring) stops an older one's chunks. Rows the filters leave out are drawn hidden.
 */
export function drawMap(whole = false): void {
  const map = shown;
  if (!map) return;
  const mine = ++drawing;
  const by = select("#map-colour").value === "job" ? "job" : "team";
  const colour = colours(map, by);
  writeColourRules(colour.size);
  const marks = marked(map.moves);
  const view = $("#gpu-map");
  // Each chunk reads the filters: one changed while chunks are still to come hides theirs.
  const rows = (from: number, to: number): string => {
    const left = leftOut(select("#map-model").value, select("#map-state").value);
    return map.nodes
      .slice(from, to)
      .map((node, i) => row(map, node, from + i, colour, marks, by, left(node.gpu_model ?? "", node.state)))
      .join("");
  };
  // Focus in the grid goes back to its cell once the new rows are in (placeTabStop).
  const hadFocus = view.contains(document.activeElement);
  view.dataset.cluster = map.cluster;
  view.dataset.colourBy = by;
  view.dataset.drawn = "partly";
  view.setAttribute("aria-label", `GPUs of ${map.cluster}: a row per node, a cell per GPU`);
  view.setAttribute("aria-rowcount", String(map.nodes.length));
  const first = whole ? map.nodes.length : FIRST_ROWS;
  const scrolled = { page: window.scrollY, grid: view.scrollTop };
  view.innerHTML = rows(0, first);
  redraw($("#map-legend"), legend(map, by, colour));
  redraw($("#map-moves"), movesList(map));
  summarise(map, select("#map-model").value, select("#map-state").value);
  placeTabStop(view, hadFocus);
  if (whole) {
    view.scrollTop = scrolled.grid;
    window.scrollTo({ top: scrolled.page, behavior: "instant" });
  }
  let next = first;
  const more = (): void => {
    if (mine !== drawing) return;
    if (next < map.nodes.length) {
      const until = performance.now() + CHUNK_MS;
      let html = "";
      do {
        html += rows(next, next + STEP_ROWS);
        next += STEP_ROWS;
      } while (next < map.nodes.length && performance.now() < until);
      view.insertAdjacentHTML("beforeend", html);
      // The tab stop may be remembered on a row just put in (a redraw of another colouring).
      placeTabStop(view);
      window.setTimeout(more, 0);
    } else {
      view.dataset.drawn = "all";
    }
  };
  afterPaint(more);
}

/** Runs ``next`` in a task after the next frame is painted (at once in a hidden tab, which
 * paints no frames). */
function afterPaint(next: () => void): void {
  if (document.visibilityState === "hidden") window.setTimeout(next, 0);
  else requestAnimationFrame(() => window.setTimeout(next, 0));
}

// The colour classes' rules: one per colour of the palette and the hues after it, written
// when a draw needs more than there are. A constructed stylesheet: the page's
// Content-Security-Policy (style-src 'self') refuses a <style> element's text.
const colourSheet = new CSSStyleSheet();
document.adoptedStyleSheets = [...document.adoptedStyleSheets, colourSheet];
let colourRules = 0;

function writeColourRules(needed: number): void {
  if (needed <= colourRules) return;
  const rules: string[] = [];
  for (let i = 0; i < needed; i++) rules.push(`#gpu-map .gpu.c${i}{background:${tint(i)}}`);
  colourSheet.replaceSync(rules.join("\n"));
  colourRules = needed;
}

/** Hides the rows the model and state filters leave out; the rows are not drawn again. */
export function filterMap(): void {
  const map = shown;
  if (!map) return;
  const model = select("#map-model").value;
  const state = select("#map-state").value;
  const left = leftOut(model, state);
  for (const row of document.querySelectorAll<HTMLElement>("#gpu-map .gpu-row")) {
    row.hidden = left(row.dataset.model ?? "", row.dataset.state ?? "");
  }
  placeTabStop($("#gpu-map"));
  summarise(map, model, state);
}

/** Whether the model and state filters leave a node of this model and state out. */
function leftOut(model: string, state: string): (m: string, s: string) => boolean {
  return (m, s) => Boolean((model && m !== model) || (state && s !== state));
}

function summarise(map: ClusterMap, model: string, state: string): void {
  const left = leftOut(model, state);
  const showing = map.nodes.filter((n) => !left(n.gpu_model ?? "", n.state)).length;
  const gpus = map.nodes.reduce((n, node) => n + node.holders.length, 0);
  const held = map.nodes.reduce((n, node) => n + node.holders.filter((h) => h != null).length, 0);
  const text =
    `${showing} of ${map.nodes.length} nodes shown · ${held} of ${gpus} GPUs held · ` +
    `measured since ${when(map.measured_since)}`;
  if ($("#map-summary").textContent !== text) $("#map-summary").textContent = text;
}

/** Wires the controls that redraw without a new read. */
export function wireMap(): void {
  select("#map-colour").addEventListener("change", () => drawMap());
  for (const id of ["#map-model", "#map-state"]) select(id).addEventListener("change", filterMap);
  wireGrid($("#gpu-map"), openCell);
}

/** A held GPU's cell opens its job's page; a free GPU's has nothing to open. */
function openCell(cell: HTMLElement): void {
  const node = shownNodes.get(cell.closest<HTMLElement>(".gpu-row")?.dataset.node ?? "");
  const holder = node?.holders[Number(cell.dataset.index)];
  if (!shown || holder == null) return;
  location.hash = `#job&id=${shown.jobs[holder].id}`;
}

function fillModels(map: ClusterMap): void {
  const chooser = select("#map-model");
  const chosen = chooser.value;
  const models = [...new Set(map.nodes.map((n) => n.gpu_model ?? ""))].sort();
  // The same models leave the list alone (a refresh must not close it while open).
  redraw(
    chooser,
    '<option value="">all models</option>' +
      models.map((m) => `<option value="${esc(m)}">${esc(m || "no GPU model")}</option>`).join(""),
  );
  // A model the new cluster lacks would hide every row: show all instead.
  chooser.value = models.includes(chosen) ? chosen : "";
}

/** A colour per team or per job, in the order they first hold a GPU of the map: its
 * number (the cell's class c<number>, the colour tint(number)). */
function colours(map: ClusterMap, by: "team" | "job"): Map<string, number> {
  const keys = new Map<string, number>();
  for (const node of map.nodes) {
    for (const holder of node.holders) {
      if (holder == null) continue;
      const key = keyOf(map.jobs[holder], by);
      if (!keys.has(key)) keys.set(key, keys.size);
    }
  }
  return keys;
}

function keyOf(job: MapJob, by: "team" | "job"): string {
  return by === "team" ? job.team : job.external_id;
}

/** The palette first, then hues a golden angle apart so that neighbours differ. */
function tint(i: number): string {
  return i < COLORS.length ? COLORS[i] : `hsl(${Math.round((i * 137.508) % 360)} 55% 48%)`;
}

type Marks = Map<string, { from: number[]; to: number[] }>;

/** Which moves leave and take each GPU, by "node/index". */
function marked(moves: PlannedMove[]): Marks {
  const marks: Marks = new Map();
  const add = (cells: MapCells[], side: "from" | "to", action: number): void => {
    for (const c of cells) {
      for (const i of c.gpu_indices) {
        const key = `${c.node}/${i}`;
        const mark = marks.get(key) ?? { from: [], to: [] };
        mark[side].push(action);
        marks.set(key, mark);
      }
    }
  };
  for (const move of moves) {
    add(move.source, "from", move.action_id);
    if (move.target_cluster == null) add(move.target, "to", move.action_id);
  }
  return marks;
}

function row(
  map: ClusterMap,
  node: MapNode,
  position: number,
  colour: Map<string, number>,
  marks: Marks,
  by: "team" | "job",
  hidden: boolean,
): string {
  const cells = node.holders.map((_, i) => cell(map, node, i, colour, marks, by)).join("");
  const held = node.holders.filter((h) => h != null).length;
  const utils = node.util.filter((u): u is number => u != null);
  const busy = utils.length ? ` · ${percent(utils.reduce((a, b) => a + b, 0) / utils.length)} busy` : "";
  const hint = `${esc(node.gpu_model || "no GPU")} · ${held}/${node.holders.length} · ${esc(node.state)}${busy}`;
  // Screen readers hear the hint in the row header's name, in words; the hint itself is
  // hidden from them, as it would be read as a stray cell of the row.
  const said = `${esc(node.name)} · ${esc(node.gpu_model || "no GPU")} · ${held} of ${node.holders.length} GPUs held · ${esc(node.state)}${busy}`;
  return `<div class="gpu-row ${esc(node.state)}" role="row" aria-rowindex="${position + 1}" data-node="${esc(node.name)}" data-model="${esc(node.gpu_model ?? "")}" data-state="${esc(node.state)}"${hidden ? " hidden" : ""}>
    <span class="name" role="rowheader" aria-label="${said}">${esc(node.name)}</span><span class="cells" role="none">${cells}</span>
    <span class="hint" aria-hidden="true">${hint}</span></div>`;
}

function cell(
  map: ClusterMap,
  node: MapNode,
  index: number,
  colour: Map<string, number>,
  marks: Marks,
  by: "team" | "job",
): string {
  const holder = node.holders[index];
  const job = holder == null ? null : map.jobs[holder];
  const util = node.util[index];
  const memory = node.mem_used_gib[index];
  const mark = marks.size ? marks.get(`${node.name}/${index}`) : undefined;
  const classes = ["gpu"];
  if (job) classes.push("busy", `c${colour.get(keyOf(job, by))}`);
  // The measured busy fraction as a dark band rising from the cell's foot (style.css).
  // Clamped: a reading above 1 (or below 0) is drawn at the band's ends, not as a class
  // with no rule.
  if (util != null) classes.push(`u${Math.min(BAND_PX, Math.max(0, Math.round(util * BAND_PX)))}`);
  if (mark?.from.length) classes.push("move-from");
  if (mark?.to.length) classes.push("move-to");
  const said = [`${node.name} GPU ${index}`, job ? `job ${job.external_id} · team ${job.team}` : "free"];
  said.push(util == null ? "utilization not measured" : `utilization ${percent(util)}`);
  if (memory != null) {
    const total = node.gpu_memory_gib == null ? "" : ` of ${node.gpu_memory_gib} GiB`;
    said.push(`memory ${memory.toFixed(1)} GiB${total}`);
  }
  if (mark?.from.length) said.push(`planned to leave (action ${mark.from.map((a) => `#${a}`).join(", ")})`);
  if (mark?.to.length) said.push(`planned to take (action ${mark.to.map((a) => `#${a}`).join(", ")})`);
  const data = [
    `data-index="${index}"`,
    job ? `data-job="${esc(job.external_id)}" data-team="${esc(job.team)}"` : "",
    util == null ? "" : `data-util="${util}"`,
    mark?.from.length ? `data-move-from="${mark.from.join(" ")}"` : "",
    mark?.to.length ? `data-move-to="${mark.to.join(" ")}"` : "",
  ]
    .filter(Boolean)
    .join(" ");
  // Its name is the title (no text inside); tabindex -1: focusable, but one tab stop in all.
  return `<span class="${classes.join(" ")}" role="gridcell" tabindex="-1" ${data} title="${esc(said.join(" · "))}"></span>`;
}

function legend(map: ClusterMap, by: "team" | "job", colour: Map<string, number>): string {
  const held = new Map<string, number>();
  for (const node of map.nodes) {
    for (const holder of node.holders) {
      if (holder == null) continue;
      const key = keyOf(map.jobs[holder], by);
      held.set(key, (held.get(key) ?? 0) + 1);
    }
  }
  const entries = [...colour].slice(0, LEGEND_MAX).map(
    ([key, number]) =>
      `<li data-key="${esc(key)}"><span class="swatch" style="background:${tint(number)}"></span>${esc(key)} <span class="hint">${held.get(key) ?? 0} GPUs</span></li>`,
  );
  const more = colour.size > LEGEND_MAX ? `<li class="hint">… and ${colour.size - LEGEND_MAX} more ${by}s</li>` : "";
  return `<ul class="legend" aria-label="Legend, by ${by}">${entries.join("")}${more}
    <li><span class="swatch free"></span>free</li>
    <li><span class="swatch move-from"></span>a planned move leaves</li>
    <li><span class="swatch move-to"></span>a planned move takes</li>
    <li><span class="swatch measured"></span>dark band: measured utilization</li></ul>`;
}

function movesList(map: ClusterMap): string {
  if (!map.plan) return '<h3>Planned moves</h3><p class="hint">No open plan (proposed or approved) for this cluster.</p>';
  const plan = `<a href="#plan&id=${map.plan.id}" data-plan-link="${map.plan.id}">plan #${map.plan.id}</a>`;
  const items = map.moves.map((move) => {
    const to = move.target_cluster ? `${esc(move.target_cluster)}: ${places(move.target)}` : places(move.target);
    return `<li data-action="${move.action_id}" data-kind="${esc(move.kind)}">
      <span class="kind">${esc(move.kind)}</span> ${jobLink(move.job_id, move.job ?? "?")}
      <span class="from-to">${places(move.source) || "queue"} → ${to || "off"}</span>
      <span class="hint">${esc(move.state)} · <a href="#plan&id=${map.plan?.id}" data-plan-link="${map.plan?.id}">action #${move.action_id}</a></span></li>`;
  });
  return `<h3>Planned moves</h3>
    <p class="hint">${plan}, ${esc(map.plan.state)}, made ${esc(when(map.plan.created_at))}</p>
    ${items.length ? `<ol id="map-move-list">${items.join("")}</ol>` : '<p class="hint">Nothing of it is left to move here: its moves have ended.</p>'}`;
}

/** "a[0,1], b[4]"; a count where the GPUs are not pinned ("b ×2"). */
function places(cells: MapCells[]): string {
  return cells
    .map((c) => (c.exact && c.gpu_indices.length ? `${esc(c.node)}[${c.gpu_indices.join(",")}]` : `${esc(c.node)} ×${c.gpus}`))
    .join(", ");
}

function percent(fraction: number): string {
  return `${Math.round(fraction * 100)} %`;
}
