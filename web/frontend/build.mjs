// Bundles the dashboard into ../static/dist (with source maps), as ES modules:
// - app.js (src/boot.ts) and app.css: the page's first script, a few hundred bytes; it
//   begins the first page's reads and imports main.js (the one module it names: it shares
//   no code with main.js);
// - main.js (src/main.ts): the dashboard, fetched beside app.js (index.html preloads it);
// - chart-*.js: the overview's chart with uPlot, loaded once the overview's cards are drawn;
//   chunk-*.js: code main.js and the chart share.
// Type checking is `tsc --noEmit` (npm run build runs it first); esbuild only strips types.
import { mkdirSync, readdirSync, rmSync } from "node:fs";
import { build } from "esbuild";

const outdir = "../static/dist";
// The files of an earlier build go: chunk names change with their contents. (A fresh
// checkout has no output folder yet.)
mkdirSync(outdir, { recursive: true });
for (const name of readdirSync(outdir, { withFileTypes: true })) {
  if (name.isFile() && /\.(js|css|map)$/.test(name.name)) rmSync(`${outdir}/${name.name}`);
}

const common = {
  outdir,
  bundle: true,
  minify: true,
  sourcemap: true,
  target: ["chrome109", "firefox115", "safari16"],
  logLevel: "warning",
};
// app.js on its own, a classic (deferred) script: it shares no code with main.js, so it has
// no module of its own to fetch before it runs, and it loads main.js with import().
await build({ ...common, entryPoints: { app: "src/boot.ts" }, format: "iife" });
await build({ ...common, entryPoints: { main: "src/main.ts" }, splitting: true, format: "esm" });
