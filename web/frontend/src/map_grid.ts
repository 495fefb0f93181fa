// The cluster map as an ARIA grid, for the keyboard: one tab stop in it (the roving
// tabindex: the last cell moved to has tabindex 0, every other cell -1), arrow keys move
// between GPU cells (left and right along a node's row, up and down between the rows
// shown), Home and End to the row's ends (with Ctrl: the first and last cell shown),
// Page Up and Page Down by PAGE_ROWS rows, and Enter or Space does what a click does.
//
// One keydown and one click listener on the grid, not one per cell: at 1,250 nodes the map
// has 10,000 cells, and redrawing it must not bind 10,000 listeners again.

const PAGE_ROWS = 10;

/** Where the tab stop is, by node and GPU index, so that a redraw keeps it. */
let stop: { node: string; index: number } | null = null;
/** The GPU index that up and down keep to across rows of fewer GPUs. */
let column = 0;

/**
 * Gives the grid its one tab stop: the remembered cell where it is drawn and shown, else
 * the first cell shown. Called after each drawn chunk and each filter change. Focus on the
 * old tab stop, or in the grid before a redraw (``hadFocus``), follows it: a redraw must not
 * drop a keyboard user's place to the page's start.
 */
export function placeTabStop(grid: HTMLElement, hadFocus = false): void {
  const remembered = stop && cellAt(grid, stop.node, stop.index);
  const target = remembered && !rowOf(remembered).hidden ? remembered : edgeCell(grid, "first");
  const current = grid.querySelector<HTMLElement>('.gpu[tabindex="0"]');
  const focused = hadFocus || (current !== null && document.activeElement === current);
  if (current !== target) {
    if (current) current.tabIndex = -1;
    if (target) target.tabIndex = 0;
  }
  if (focused && target && document.activeElement !== target) target.focus();
}

/** Wires the keys and clicks of the grid; ``open`` is what activating a cell does. */
export function wireGrid(grid: HTMLElement, open: (cell: HTMLElement) => void): void {
  grid.addEventListener("keydown", (event) => {
    const cell = cellOf(event.target);
    if (!cell) return;
    if (event.key === "Enter" || event.key === " ") {
      event.preventDefault(); // Space would scroll the page
      open(cell);
      return;
    }
    const next = moved(grid, cell, event);
    if (next === undefined) return; // not a key of the grid: let it through
    event.preventDefault();
    if (next) focusCell(next);
  });
  grid.addEventListener("click", (event) => {
    const cell = cellOf(event.target);
    if (!cell) return;
    column = Number(cell.dataset.index);
    focusCell(cell);
    open(cell);
  });
  // Tabbed into: up and down keep to the column of the cell the tab stop was on.
  grid.addEventListener("focusin", (event) => {
    const cell = cellOf(event.target);
    const from = event.relatedTarget;
    if (cell && !(from instanceof Node && grid.contains(from))) column = Number(cell.dataset.index);
  });
}

/** The cell a key moves to; null at an edge (no move), undefined for other keys. */
function moved(grid: HTMLElement, cell: HTMLElement, event: KeyboardEvent): HTMLElement | null | undefined {
  const row = cellsOf(rowOf(cell));
  switch (event.key) {
    case "ArrowLeft":
      return sideways(cell.previousElementSibling);
    case "ArrowRight":
      return sideways(cell.nextElementSibling);
    case "Home":
      return sideways(event.ctrlKey ? edgeCell(grid, "first") : row.firstElementChild);
    case "End":
      return sideways(event.ctrlKey ? edgeCell(grid, "last") : row.lastElementChild);
    case "ArrowUp":
      return vertically(cell, -1, 1);
    case "ArrowDown":
      return vertically(cell, 1, 1);
    case "PageUp":
      return vertically(cell, -1, PAGE_ROWS);
    case "PageDown":
      return vertically(cell, 1, PAGE_ROWS);
    default:
      return undefined;
  }
}

/** A horizontal move also sets the column that vertical moves keep to. */
function sideways(next: Element | null): HTMLElement | null {
  if (!(next instanceof HTMLElement)) return null;
  column = Number(next.dataset.index);
  return next;
}

/** Up to ``steps`` shown rows with GPUs away, at the kept column or the row's last cell. */
function vertically(cell: HTMLElement, direction: 1 | -1, steps: number): HTMLElement | null {
  let row: Element | null = rowOf(cell);
  let landed: HTMLElement | null = null;
  for (let left = steps; left > 0 && row; ) {
    row = direction > 0 ? row.nextElementSibling : row.previousElementSibling;
    if (row instanceof HTMLElement && !row.hidden && cellsOf(row).childElementCount) {
      landed = row;
      left -= 1;
    }
  }
  if (!landed) return null;
  const cells = cellsOf(landed);
  return (cells.children[Math.min(column, cells.childElementCount - 1)] as HTMLElement | undefined) ?? null;
}

function focusCell(cell: HTMLElement): void {
  const row = rowOf(cell);
  const previous = row.closest("[role=grid]")?.querySelector<HTMLElement>('.gpu[tabindex="0"]');
  if (previous && previous !== cell) previous.tabIndex = -1;
  cell.tabIndex = 0;
  stop = { node: row.dataset.node ?? "", index: Number(cell.dataset.index) };
  cell.focus();
}

/** The first cell of the first row shown, or the last cell of the last row shown. */
function edgeCell(grid: HTMLElement, end: "first" | "last"): HTMLElement | null {
  const rows = [...grid.querySelectorAll<HTMLElement>(".gpu-row")];
  if (end === "last") rows.reverse();
  for (const row of rows) {
    const cells = cellsOf(row);
    if (row.hidden || !cells.childElementCount) continue;
    return (end === "first" ? cells.firstElementChild : cells.lastElementChild) as HTMLElement;
  }
  return null;
}

function cellAt(grid: HTMLElement, node: string, index: number): HTMLElement | null {
  return grid.querySelector<HTMLElement>(`.gpu-row[data-node="${CSS.escape(node)}"] .gpu[data-index="${index}"]`);
}

function cellOf(target: EventTarget | null): HTMLElement | null {
  return target instanceof HTMLElement ? target.closest<HTMLElement>(".gpu") : null;
}

function rowOf(cell: HTMLElement): HTMLElement {
  return cell.closest<HTMLElement>(".gpu-row") as HTMLElement;
}

function cellsOf(row: HTMLElement): HTMLElement {
  return row.querySelector<HTMLElement>(".cells") as HTMLElement;
}
