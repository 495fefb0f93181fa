// The REST API client. The token lives in sessionStorage only (see main.ts).

export class Unauthorized extends Error {}

interface ErrorBody {
  error?: { message: string; field?: string };
}

export const session = {
  token: null as string | null,
  // The token's scopes (GET /whoami), for what a page offers; the API decides.
  scopes: [] as string[],
  onUnauthorized: (_message: string): void => {},
};

export async function api<T>(path: string, init: RequestInit = {}): Promise<T> {
  const response = await fetch(`/api/v1${path}`, {
    ...init,
    headers: {
      Authorization: `Bearer ${session.token ?? ""}`,
      "Content-Type": "application/json",
      ...(init.headers ?? {}),
    },
  });
  if (response.status === 401) {
    session.onUnauthorized("The token was refused (missing, expired or revoked).");
    throw new Unauthorized("unauthorized");
  }
  const body: unknown = response.status === 204 ? null : await response.json();
  if (!response.ok) {
    const error = (body as ErrorBody | null)?.error ?? { message: response.statusText };
    throw new Error(error.field ? `${error.field}: ${error.message}` : error.message);
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
