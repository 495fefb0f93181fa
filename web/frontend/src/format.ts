// Figures and times as people read them: "1,061.5", "gap 0.0 %", "2 Dec 2026, 12:30:00 UTC"
// rather than 1061.4861111111113, 1.59e-16 and raw ISO. Every page that shows a plan's
// figures formats them here, so the same figure reads the same everywhere.

// Made at first use: a page that shows no time (the overview) makes none.
let time: Intl.DateTimeFormat | null = null;

function timeFormat(): Intl.DateTimeFormat {
  time ??= new Intl.DateTimeFormat("en-GB", {
    day: "numeric",
    month: "short",
    year: "numeric",
    hour: "2-digit",
    minute: "2-digit",
    second: "2-digit",
    hour12: false,
    timeZone: "UTC",
  });
  return time;
}

/** A number with thousands separators and one decimal (two under 100); "–" for none. */
export function figure(value: number | null | undefined): string {
  if (value == null || !Number.isFinite(value)) return "–";
  const digits = Math.abs(value) >= 100 ? 1 : 2;
  const scale = 10 ** digits;
  // + 0: a value that rounds to zero from below reads "0", not "-0".
  const rounded = Math.round(value * scale) / scale + 0;
  return rounded.toLocaleString("en", { minimumFractionDigits: digits === 1 ? 1 : 0, maximumFractionDigits: digits });
}

/** A solver's relative gap (a fraction) in per cent, one decimal: 1.59e-16 is "0.0 %". */
export function gapPercent(gap: number | null | undefined): string {
  if (gap == null || !Number.isFinite(gap)) return "–";
  return `${(Math.round(Math.max(0, gap) * 1000) / 10).toFixed(1)} %`;
}

/** Seconds of solving: "0.21 s", "12.3 s", "2 min". */
export function solveTime(seconds: number): string {
  if (seconds < 10) return `${seconds.toFixed(2)} s`;
  if (seconds < 60) return `${seconds.toFixed(1)} s`;
  return duration(seconds);
}

/** An instant in UTC, to the second: "2 Dec 2026, 12:30:00 UTC"; "—" for none. */
export function when(iso: string | null | undefined): string {
  return iso ? `${timeFormat().format(new Date(iso))} UTC` : "—";
}

/** How long before `now` (this browser's clock): "5 min ago", "just now". */
export function ago(iso: string, now: number = Date.now()): string {
  const seconds = (now - Date.parse(iso)) / 1000;
  return seconds < 5 ? "just now" : `${duration(seconds)} ago`;
}

/** Between two instants: "40 ms", "1.5 s", "3 min"; "—" until both are known. */
export function between(start: string | null | undefined, end: string | null | undefined): string {
  if (!start || !end) return "—";
  const seconds = Math.max(0, (Date.parse(end) - Date.parse(start)) / 1000);
  if (seconds < 1) return `${Math.round(seconds * 1000)} ms`;
  return seconds < 60 ? `${seconds.toFixed(1)} s` : duration(seconds);
}

/** A wait for people: seconds under a minute, minutes under an hour, hours and minutes
 * under two days, then days and hours. */
export function duration(seconds: number): string {
  const s = Math.max(0, Math.floor(seconds));
  if (s < 60) return `${s} s`;
  const minutes = Math.floor(s / 60);
  if (minutes < 60) return `${minutes} min`;
  const hours = Math.floor(minutes / 60);
  if (hours < 48) return `${hours} h ${String(minutes % 60).padStart(2, "0")} min`;
  return `${Math.floor(hours / 24)} d ${hours % 24} h`;
}
