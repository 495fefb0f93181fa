// Links between pages, in one place so that every page that names a job links it the same
// way (the job page reads #job&id=N).

import { esc } from "./dom";

/** A job's name linked to its page; the bare name when the job's id is unknown. */
export function jobLink(id: number | null | undefined, text: string): string {
  return id == null ? esc(text) : `<a href="#job&id=${id}" data-job-link="${id}">${esc(text)}</a>`;
}
