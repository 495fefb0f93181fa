// Bundles the dashboard into ../static/dist (with source maps), as ES modules:
// - app.js (src/boot.ts) and app.css: the page's first script, a few hundred bytes; it
//   begins the first page's reads and imports main.js (the one module it names: it shares
//   no code with main.js);
// - main.js (src/main.ts): the overview and what every page shares (api.ts, dom.ts,
//   refresh.ts), fetched beside app.js (index.html preloads it);
// - chart-*.js: the overview's chart with uPlot, loaded once the overview's cards are drawn;
// - one file per other page (PAGES: map.js, queue.js, ...), loaded by main.js with import()
//   when the page is first shown; they import what they share with the overview from
//   main.js itself (one copy of its state: the session, the begun reads), and what they
//   share with each other from chunk-*.js. A fresh load of the overview parses none of them.
// Beside each .js and .css: a .br (Brotli, quality 11) and a .gz (gzip -9), which the
// server answers with where the browser accepts them (app/core/static.py), instead of
// compressing the file again on each request.
// Type checking is `tsc --noEmit` (npm run build runs it first); esbuild only strips types.
import { mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { brotliCompressSync, constants, gzipSync } from "node:zlib";
import { build } from "esbuild";

const outdir = "../static/dist";
// The files of an earlier build go: chunk names change with their contents. (A fresh
// checkout has no output folder yet.)
mkdirSync(outdir, { recursive: true });
for (const name of readdirSync(outdir, { withFileTypes: true })) {
  if (name.isFile() && /\.(js|css|map|br|gz)$/.test(name.name)) rmSync(`${outdir}/${name.name}`);
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

// The pages main.js loads by name (import("./queue") in main.ts is "./queue.js" beside it).
const PAGES = ["map", "queue", "job", "pages", "plan", "policy_history", "whatif", "federation", "forecasts"];
// The modules in main.js; a page's import of one is an import of main.js (which re-exports
// them), never a second copy.
const SHARED = ["api", "dom", "refresh"];
const IN_MAIN = [...SHARED, "overview", "main"];
const named = (names) => new RegExp(`^\\./(${names.join("|")})$`);

const pagesByName = {
  name: "pages-by-name",
  setup(build) {
    build.onResolve({ filter: named(PAGES) }, (args) =>
      args.kind === "dynamic-import"
        ? { path: `${args.path}.js`, external: true }
        : { errors: [{ text: `${args.path} is a page: main.js may only import() it` }] },
    );
  },
};
const mainByName = {
  name: "main-by-name",
  setup(build) {
    build.onResolve({ filter: named(IN_MAIN) }, (args) =>
      SHARED.includes(args.path.slice(2))
        ? { path: "./main.js", external: true }
        : { errors: [{ text: `a page imports ${args.path}, which is main.js's own` }] },
    );
  },
};
await build({ ...common, entryPoints: { main: "src/main.ts" }, splitting: true, format: "esm", plugins: [pagesByName] });
await build({
  ...common,
  entryPoints: Object.fromEntries(PAGES.map((page) => [page, `src/${page}.ts`])),
  splitting: true,
  format: "esm",
  plugins: [mainByName],
});

// The precompressed copies, written after their files (the server uses a copy only if it is
// not older than its file).
for (const name of readdirSync(outdir)) {
  if (!/\.(js|css)$/.test(name)) continue;
  const file = readFileSync(`${outdir}/${name}`);
  writeFileSync(`${outdir}/${name}.gz`, gzipSync(file, { level: 9 }));
  writeFileSync(
    `${outdir}/${name}.br`,
    brotliCompressSync(file, {
      params: { [constants.BROTLI_PARAM_QUALITY]: 11, [constants.BROTLI_PARAM_SIZE_HINT]: file.length },
    }),
  );
}
