// The REST API client. The token lives in sessionStorage only (see main.ts).

import type { Begun } from "./boot";

export class Unauthorized extends Error {}

/** A refusal with its status and, where the API names one, the field at fault. */
export class ApiError extends Error {
  readonly status: number;
  readonly field: string | null;

  constructor(message: string, status: number, field: string | null) {
    super(message);
    this.status = status;
    this.field = field;
  }
}

interface ErrorBody {
  error?: { message: string; field?: string };
}

export const session = {
  token: null as string | null,
  // The token's scopes (GET /whoami), for what a page offers; the API decides.
  scopes: [] as string[],
  onUnauthorized: (_message: string): void => {},
};

// Scopes nest (viewer ⊂ operator ⊂ admin, app.core.security); the API decides, this only
// spares a page the controls that can only be refused.
const RANK: Record<string, number> = { viewer: 1, operator: 2, admin: 3 };

export function hasScope(scope: "viewer" | "operator" | "admin"): boolean {
  return session.scopes.some((s) => (RANK[s] ?? 0) >= RANK[scope]);
}

// Reads app.js began before this code was loaded (boot.ts), with the token they were
// made with: the first GET of the same path with the same token takes its read.
const begun = new Map<string, Begun>();
let begunWith: string | null = null;

export function adoptReads(token: string | null, reads: Record<string, Begun>): void {
  begunWith = token;
  for (const [path, read] of Object.entries(reads)) begun.set(path, read);
}

/** Forgets the reads begun and not taken (signing out: they were made with its token). */
export function dropReads(): void {
  for (const read of begun.values()) read.controller.abort();
  begun.clear();
}

function begunRead(path: string, init: RequestInit): Promise<Response> | null {
  const read = begun.get(path);
  if (!read || (init.method ?? "GET") !== "GET" || init.body != null || init.headers != null) return null;
  begun.delete(path);
  if (begunWith !== session.token) {
    read.controller.abort();
    return null;
  }
  // The taker's cancellation (Latest) reaches the read.
  const { signal } = init;
  if (signal?.aborted) read.controller.abort();
  signal?.addEventListener("abort", () => read.controller.abort(), { once: true });
  return read.response;
}

export async function api<T>(path: string, init: RequestInit = {}): Promise<T> {
  const response = await (begunRead(path, init) ??
    fetch(`/api/v1${path}`, {
      ...init,
      headers: {
        Authorization: `Bearer ${session.token ?? ""}`,
        // A form (a file upload) says its own type, with its boundary.
        ...(init.body instanceof FormData ? {} : { "Content-Type": "application/json" }),
        ...(init.headers ?? {}),
      },
    }));
  if (response.status === 401) {
    session.onUnauthorized("The token was refused (missing, expired or revoked).");
    throw new Unauthorized("unauthorized");
  }
  const body: unknown = response.status === 204 ? null : await response.json();
  if (!response.ok) {
    const error = (body as ErrorBody | null)?.error ?? { message: response.statusText };
    // A validation error's message names its field already ("labels: …").
    const named = !error.field || error.message.startsWith(`${error.field}:`);
    throw new ApiError(named ? error.message : `${error.field}: ${error.message}`, response.status, error.field ?? null);
  }
  return body as T;
}

/**
 * One per view or selection: begin() cancels the request still in flight for an older
 * selection, and current() tells a reply that arrived anyway (or whose rendering awaits
 * something else) that a newer selection has been made, so it must not be drawn.
 */
export class Latest {
  private controller: AbortController | null = null;
  private sequence = 0;

  begin(): { signal: AbortSignal; current: () => boolean } {
    this.controller?.abort();
    const controller = new AbortController();
    this.controller = controller;
    const mine = ++this.sequence;
    return { signal: controller.signal, current: () => mine === this.sequence };
  }
}

export function isAbort(error: unknown): boolean {
  return error instanceof DOMException && error.name === "AbortError";
}
