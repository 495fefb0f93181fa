// Bundles the dashboard into ../static/dist (app.js + app.css, with source maps).
// Type checking is `tsc --noEmit` (npm run build runs it first); esbuild only strips types.
import { build } from "esbuild";

await build({
  entryPoints: { app: "src/main.ts" },
  outdir: "../static/dist",
  bundle: true,
  minify: true,
  sourcemap: true,
  format: "iife",
  target: ["chrome109", "firefox115", "safari16"],
  logLevel: "warning",
});
