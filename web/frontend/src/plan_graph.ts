// The plan page's dependency graph: one node per action, in columns by the stage plan.ts
// computes, an arrow from each prerequisite to the action that waits on it. Inline SVG
// drawn from a string like the rest of the page (no graph library: the layout is a grid
// of stages, which needs none). Each node's tooltip is its saga's steps and their timing;
// clicking it (or Enter on it) scrolls to the action's card in the list below, which stays
// the text alternative.

import { esc } from "./dom";
import { between, when } from "./format";
import type { ActionDetail, PlanStep } from "./types";

// Beyond this many actions the graph is omitted. Not for speed: Chromium lays out the SVG
// of 500 actions in about 25 ms (README, "Plan graph"); but 500 in columns of ten is 11,000
// px wide, scrolled rather than read. At 200 it is 4,500 px, and the list says the rest.
export const GRAPH_MAX = 200;
// A stage with more actions than this wraps into further columns, so that the graph stays
// a screen tall however wide a stage is.
const ROWS = 10;
const NODE_W = 168;
const NODE_H = 38;
const ROW_H = 48;
const COLUMN_W = 208;
const STAGE_GAP = 40;
const PAD = 8;
// The states plan.ts marks failed on a card (an action that failed or undoes what it did).
const FAILED = new Set(["failed", "compensating", "compensated"]);

// The action whose card was last picked from the graph: a redraw (the data changed)
// marks it again.
let picked: number | null = null;

interface Spot {
  x: number;
  y: number;
}

/** Each action's place: its stage's columns, in the order of its prerequisites' rows (a
 * barycentre, which uncrosses most arrows), then by id. */
function layout(actions: ActionDetail[], stage: Map<number, number>): { at: Map<number, Spot>; width: number; height: number } {
  const last = Math.max(...stage.values());
  const at = new Map<number, Spot>();
  const row = new Map<number, number>();
  let x = PAD;
  let tallest = 0;
  for (let k = 1; k <= last; k++) {
    const centre = (a: ActionDetail): number => {
      const rows = a.depends_on.map((d) => row.get(d)).filter((r): r is number => r !== undefined);
      return rows.length ? rows.reduce((sum, r) => sum + r, 0) / rows.length : 0;
    };
    const group = actions.filter((a) => stage.get(a.id) === k).sort((a, b) => centre(a) - centre(b) || a.id - b.id);
    group.forEach((a, i) => {
      const column = Math.floor(i / ROWS);
      row.set(a.id, i % ROWS);
      at.set(a.id, { x: x + column * COLUMN_W, y: PAD + (i % ROWS) * ROW_H });
    });
    tallest = Math.max(tallest, Math.min(group.length, ROWS));
    x += Math.max(1, Math.ceil(group.length / ROWS)) * COLUMN_W + STAGE_GAP;
  }
  return { at, width: x - STAGE_GAP - (COLUMN_W - NODE_W) + PAD, height: PAD * 2 + (tallest - 1) * ROW_H + NODE_H };
}

/** The tooltip: the action, then each saga step with when it was sent and how long it took. */
function timing(a: ActionDetail, steps: PlanStep[]): string {
  const lines = [`#${a.id} ${a.kind}${a.job_external_id ? ` ${a.job_external_id}` : ""}: ${a.state}`];
  if (a.decided_at) lines.push(`decided ${when(a.decided_at)}${a.finished_at ? `, took ${between(a.decided_at, a.finished_at)}` : ""}`);
  for (const s of steps) {
    const name = s.phase === "forward" ? s.name : `${s.phase} ${s.name}`;
    lines.push(`${s.seq}. ${name}: ${s.state}, sent ${when(s.sent_at)}, took ${between(s.sent_at, s.finished_at)}`);
  }
  if (!steps.length) lines.push("no saga step has run");
  if (a.error) lines.push(`error: ${a.error}`);
  return lines.join("\n");
}

/** An arrow's path. Between neighbouring columns, one curve; one that passes other
 * columns runs along the gap above the higher of its two rows, so that it never hides
 * behind (and seems to pass through) a node it does not touch. */
function route(x1: number, y1: number, x2: number, y2: number, top: number): string {
  if (x2 - x1 <= COLUMN_W - NODE_W + STAGE_GAP) {
    const bend = Math.max(20, (x2 - x1) / 2);
    return `M${x1} ${y1} C${x1 + bend} ${y1} ${x2 - bend} ${y2} ${x2} ${y2}`;
  }
  const lane = top - (ROW_H - NODE_H) / 2;
  return `M${x1} ${y1} C${x1 + 16} ${y1} ${x1 + 16} ${lane} ${x1 + 32} ${lane} L${x2 - 32} ${lane} C${x2 - 16} ${lane} ${x2 - 16} ${y2} ${x2} ${y2}`;
}

/** Text that fits a node: SVG does not clip or wrap, so cut it. */
function fit(text: string, chars: number): string {
  return text.length > chars ? `${text.slice(0, chars - 1)}…` : text;
}

/** The graph's markup, or a line saying why there is none; "" for a plan with no action. */
export function graphView(actions: ActionDetail[], stage: Map<number, number>, stepsOf: Map<number, PlanStep[]>): string {
  if (!actions.length) return "";
  if (actions.length > GRAPH_MAX) {
    return `<p class="hint" id="plan-graph" data-omitted="${actions.length}">Graph omitted: ${actions.length} actions (it is drawn up to ${GRAPH_MAX}); see the stages below.</p>`;
  }
  const { at, width, height } = layout(actions, stage);
  const edges: string[] = [];
  for (const a of actions) {
    const to = at.get(a.id);
    for (const d of a.depends_on) {
      const from = at.get(d);
      // A prerequisite outside the actions read (another plan's, or past the page) has no node.
      if (!from || !to) continue;
      const x1 = from.x + NODE_W;
      const y1 = from.y + NODE_H / 2;
      const x2 = to.x - 2;
      const y2 = to.y + NODE_H / 2;
      edges.push(`<path class="graph-edge" data-from="${d}" data-to="${a.id}" d="${route(x1, y1, x2, y2, Math.min(from.y, to.y))}" marker-end="url(#plan-graph-arrow)"/>`);
    }
  }
  // In the document (and so the tab order) by column, then down it.
  const placed = [...actions].sort((a, b) => (at.get(a.id) as Spot).x - (at.get(b.id) as Spot).x || (at.get(a.id) as Spot).y - (at.get(b.id) as Spot).y);
  const nodes = placed.map((a) => {
    const { x, y } = at.get(a.id) as Spot;
    const label = `#${a.id} ${a.kind}${a.job_external_id ? ` ${a.job_external_id}` : ""}, ${a.state}, stage ${stage.get(a.id)}`;
    return `<g class="graph-node state-${esc(a.state)}${FAILED.has(a.state) ? " failed" : ""}" data-action="${a.id}" data-state="${esc(a.state)}" transform="translate(${x} ${y})" tabindex="0" role="button" aria-label="${esc(label)}: show its card">
      <title>${esc(timing(a, stepsOf.get(a.id) ?? []))}</title>
      <rect width="${NODE_W}" height="${NODE_H}" rx="5"/>
      <text x="8" y="15" class="graph-kind">#${a.id} ${esc(fit(a.kind, 14))}</text>
      <text x="8" y="31" class="graph-job">${esc(fit(`${a.job_external_id ?? "—"} · ${a.state}`, 26))}</text></g>`;
  });
  const stages = Math.max(...stage.values());
  const summary = `Dependency graph: ${actions.length} action${actions.length === 1 ? "" : "s"} in ${stages} stage${stages === 1 ? "" : "s"}, ${edges.length} dependenc${edges.length === 1 ? "y" : "ies"}`;
  return `<div class="plan-graph" id="plan-graph"><svg width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" role="group" aria-label="${esc(summary)}; each node shows its action's card">
    <defs><marker id="plan-graph-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto"><path d="M0 0 L10 5 L0 10 z"/></marker></defs>
    ${edges.join("")}${nodes.join("")}</svg></div>
    <p class="hint">${esc(summary)}. Hover a node for its saga's steps and their timing; click it for its card below.</p>`;
}

/** Scrolls to the action's card and marks it, and its node, as the one picked. */
function pick(id: number): void {
  picked = id;
  for (const marked of document.querySelectorAll("#plan .picked")) marked.classList.remove("picked");
  document.querySelector(`#plan-graph .graph-node[data-action="${id}"]`)?.classList.add("picked");
  const card = document.querySelector<HTMLElement>(`#plan-actions .plan-action[data-action="${id}"]`);
  if (!card) return;
  card.classList.add("picked");
  card.scrollIntoView({ block: "center" });
}

/** Clicks and Enter/Space on a node; wired once on the plan page's view (plan.ts). */
export function wireGraph(view: HTMLElement): void {
  const node = (target: EventTarget | null): number | null => {
    const g = target instanceof Element ? target.closest<SVGGElement>("#plan-graph .graph-node") : null;
    return g ? Number(g.dataset.action) : null;
  };
  view.addEventListener("click", (event) => {
    const id = node(event.target);
    if (id !== null) pick(id);
  });
  view.addEventListener("keydown", (event) => {
    if (event.key !== "Enter" && event.key !== " ") return;
    const id = node(event.target);
    if (id === null) return;
    event.preventDefault();
    pick(id);
  });
}

/** After a redraw: marks the node and card picked before it again, without scrolling. */
export function markPicked(): void {
  if (picked === null) return;
  document.querySelector(`#plan-graph .graph-node[data-action="${picked}"]`)?.classList.add("picked");
  document.querySelector(`#plan-actions .plan-action[data-action="${picked}"]`)?.classList.add("picked");
}

/** A new plan shown forgets the pick of the last one. */
export function forgetPick(): void {
  picked = null;
}
