// Live pages: a page that reads its data again while it is shown (the overview, the queue,
// the cluster map), every refreshPeriodMs(). A read is skipped while the tab is hidden
// (document.visibilityState) and made at once when the tab is shown again; a page no
// longer shown reads nothing more until it is shown again (its show function, called by
// the router, schedules the next read). Stale replies are the pages' Latest's to drop.
//
// A read that brings what is drawn already changes nothing in the DOM (redraw): focus, a
// selection, an open list or tooltip and the scroll position survive it.

import { isAbort, session, Unauthorized } from "./api";

export const REFRESH_MS = 15_000;
// The period's bounds when the address asks for another (the tests ask for a short one).
const FASTEST_MS = 100;
const SLOWEST_MS = 3_600_000;

/** The period: REFRESH_MS, or ?refresh_ms=N in the address the page was loaded from
 * (read once, here: signing in rewrites the address). */
function periodAsked(): number {
  const asked = Number(new URLSearchParams(location.search).get("refresh_ms"));
  return Number.isInteger(asked) && asked >= FASTEST_MS && asked <= SLOWEST_MS ? asked : REFRESH_MS;
}

const PERIOD_MS = periodAsked();

export function refreshPeriodMs(): number {
  return PERIOD_MS;
}

/**
 * One per live page. ``read`` draws the page again (the page's show function); it calls
 * schedule() when done, whether it drew or failed, so one timer at most is pending.
 */
export class Poller {
  private timer: number | undefined;
  // The period ended while the tab was hidden: read when it is shown.
  private due = false;

  constructor(
    private readonly view: string,
    private readonly read: () => Promise<void>,
  ) {
    document.addEventListener("visibilitychange", () => {
      if (this.due && document.visibilityState === "visible") this.tick();
    });
  }

  /** The next read, one period from now (a read in between starts the wait again). */
  schedule(): void {
    window.clearTimeout(this.timer);
    this.due = false;
    this.timer = window.setTimeout(() => this.tick(), refreshPeriodMs());
  }

  private tick(): void {
    this.due = false;
    // Left the page, or signed out: stop until the router shows the page again.
    if (document.getElementById(this.view)?.hidden !== false || !session.token) return;
    if (document.visibilityState !== "visible") {
      this.due = true;
      return;
    }
    this.read().catch((error: unknown) => {
      if (!isAbort(error) && !(error instanceof Unauthorized)) console.error(error);
    });
  }
}

// The markup each element was last given by redraw(), and the nodes it made (the ends are
// enough to tell that someone else has rewritten the element since).
const drawn = new WeakMap<Element, { html: string; first: Node | null; last: Node | null }>();

/** Gives ``element`` this markup unless it has it already; true when it was written. */
export function redraw(element: Element, html: string): boolean {
  const was = drawn.get(element);
  if (was && was.html === html && was.first === element.firstChild && was.last === element.lastChild) return false;
  element.innerHTML = html;
  drawn.set(element, { html, first: element.firstChild, last: element.lastChild });
  return true;
}
