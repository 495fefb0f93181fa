// A field-by-field diff of two SLA policy specs (the history, an import's preview).
//
// A field is a path into the spec: a team or service is named by its `team` or `service`
// rather than its place in the list (teams[research].guaranteed_gpus), so reordering the
// teams changes nothing and a team added or removed shows as its fields added or removed.

import { esc } from "./dom";

// The lists whose entries are named by a field (app.policies.models.SlaPolicySpec).
const NAMED_BY: Record<string, string> = { teams: "team", services: "service" };

/** The rows of a diff table (Field, older, newer), one per field that differs. */
export function diffRows(changes: FieldChange[]): string {
  return changes
    .map(
      (c) => `<tr data-field="${esc(c.field)}" data-change="${c.change}" class="diff-${c.change}" title="${c.change}"><td><code>${esc(c.field)}</code></td>
      <td class="old">${c.old === undefined ? '<span class="hint">—</span>' : `<code>${esc(c.old)}</code>`}</td>
      <td class="new">${c.new === undefined ? '<span class="hint">—</span>' : `<code>${esc(c.new)}</code>`}</td></tr>`,
    )
    .join("");
}

export interface FieldChange {
  field: string;
  change: "added" | "removed" | "changed";
  old: string | undefined;
  new: string | undefined;
}

/** The fields that differ, in the newer version's order, then those only the older has. */
export function diff(older: Map<string, string>, newer: Map<string, string>): FieldChange[] {
  const changes: FieldChange[] = [];
  for (const [field, value] of newer) {
    const was = older.get(field);
    if (was === undefined) changes.push({ field, change: "added", old: undefined, new: value });
    else if (was !== value) changes.push({ field, change: "changed", old: was, new: value });
  }
  for (const [field, value] of older) {
    if (!newer.has(field)) changes.push({ field, change: "removed", old: value, new: undefined });
  }
  return changes;
}

export function specFields(spec: unknown): Map<string, string> {
  const fields = new Map<string, string>();
  if (spec && typeof spec === "object") {
    for (const [key, value] of Object.entries(spec)) flatten(value, key, key, fields);
  }
  return fields;
}

function flatten(value: unknown, path: string, key: string, into: Map<string, string>): void {
  const nameKey = NAMED_BY[key];
  if (Array.isArray(value) && nameKey && value.every((e) => e && typeof e === "object" && typeof e[nameKey] === "string")) {
    for (const entry of value as Record<string, unknown>[]) {
      const prefix = `${path}[${String(entry[nameKey])}]`;
      const rest = Object.entries(entry).filter(([k]) => k !== nameKey);
      // An entry of nothing but its name is still there.
      if (!rest.length) into.set(prefix, "{}");
      for (const [k, v] of rest) flatten(v, `${prefix}.${k}`, k, into);
    }
  } else if (value && typeof value === "object" && !Array.isArray(value) && Object.keys(value).length) {
    for (const [k, v] of Object.entries(value)) flatten(v, `${path}.${k}`, k, into);
  } else {
    // Scalars, lists of scalars and empty containers are compared whole.
    into.set(path, JSON.stringify(value));
  }
}
