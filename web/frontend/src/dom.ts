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

export const count = new Intl.NumberFormat("en");
