// Small DOM helpers. Every value put into markup goes through esc().

export function $<T extends HTMLElement = HTMLElement>(selector: string): T {
  const found = document.querySelector<T>(selector);
  if (!found) throw new Error(`no element ${selector}`);
  return found;
}

export function select(selector: string): HTMLSelectElement {
  return $<HTMLSelectElement>(selector);
}

const ENTITIES: Record<string, string> = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };

export function esc(value: unknown): string {
  return String(value ?? "").replace(/[&<>"']/g, (c) => ENTITIES[c] ?? c);
}

export const COLORS = ["#2f6fdf", "#d0542f", "#2a9d5b", "#8b4fd8", "#c08a00", "#0e8fa3", "#b53b7a", "#5a6b82"];

// Intl's "en" numbers, made on first use: making the first Intl formatter of a page loads
// its locale data (20–30 ms in Chromium), which the overview's fresh load must not wait for
// (its cards group whole numbers with grouped(); main.ts makes this one in idle time).
let numbers: Intl.NumberFormat | null = null;
export const count = {
  format: (value: number): string => (numbers ??= new Intl.NumberFormat("en")).format(value),
};

/** A whole number grouped by thousands as count.format writes it ("-1,234,567"); any other
 * number (and -0, which String() writes "0") through count.format. */
export function grouped(value: number): string {
  if (!Number.isSafeInteger(value) || Object.is(value, -0)) return count.format(value);
  return String(value).replace(/\B(?=(\d{3})+$)/g, ",");
}
