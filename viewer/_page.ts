// The viewer page: one HTML document with inline CSS and script, no
// third-party assets. The data rides in a JSON script block whose "<" are
// escaped, and a Content-Security-Policy allows only this page's own script
// (by hash), so that nothing injected could run even if escaping failed.

import { CLIENT_JS } from "./_client.ts";

const CSS = `
:root { color-scheme: light dark; --fg: #1b1f24; --bg: #fff; --muted: #5c6670; --line: #d8dee4;
  --add: #e6ffec; --add-fg: #116329; --del: #ffebe9; --del-fg: #82071e; --hunk: #ddf4ff; --accent: #0550ae; }
@media (prefers-color-scheme: dark) { :root { --fg: #e6edf3; --bg: #0d1117; --muted: #9198a1; --line: #30363d;
  --add: #12261e; --add-fg: #7ee787; --del: #25171c; --del-fg: #ffa198; --hunk: #121d2f; --accent: #79c0ff; } }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, sans-serif; color: var(--fg); background: var(--bg); }
header { display: flex; gap: 2rem; align-items: baseline; padding: .5rem 1rem; border-bottom: 1px solid var(--line); }
header h1 { font-size: 1.1rem; margin: 0; }
header ul { list-style: none; display: flex; gap: 1rem; margin: 0; padding: 0; flex-wrap: wrap; }
a { color: var(--accent); }
a[aria-current=page] { font-weight: 600; text-decoration: none; }
main { padding: 0 1rem 2rem; }
h2 { font-size: 1.05rem; margin: 1rem 0 .5rem; }
h3 { font-size: .95rem; margin: .25rem 0; }
h3 time { color: var(--muted); font-weight: normal; font-size: .85em; }
dl.summary { display: grid; grid-template-columns: max-content 1fr; gap: .15rem 1rem; margin: 0; }
dl.summary dt { color: var(--muted); }
dl.summary dd { margin: 0; font-variant-numeric: tabular-nums; }
.tools { margin: .5rem 0; }
input, select, button { font: inherit; color: inherit; }
input[type=search] { width: 22rem; max-width: 100%; padding: .2rem .4rem; }
.scroller { height: 70vh; overflow: auto; border: 1px solid var(--line); }
.scroller:focus { outline: 2px solid var(--accent); }
table { border-collapse: collapse; width: 100%; }
#rollouts { table-layout: fixed; }
caption { text-align: left; color: var(--muted); padding: .25rem .5rem; }
th, td { text-align: left; padding: 0 .5rem; border-bottom: 1px solid var(--line); }
#rollouts td { height: 30px; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
#rollouts thead th { position: sticky; top: 0; background: var(--bg); z-index: 1; height: 32px; }
#rollouts th:nth-child(1) { width: 18%; } #rollouts th:nth-child(2) { width: 18%; }
#rollouts th:nth-child(3) { width: 12%; } #rollouts th:nth-child(4) { width: 7%; }
#rollouts th:nth-child(5) { width: 12%; } #rollouts th:nth-child(6) { width: 8%; }
th button { all: unset; cursor: pointer; font-weight: 600; }
th button:focus-visible { outline: 2px solid var(--accent); }
tr.spacer td, tr.spacer { border: 0; padding: 0; }
.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.pass .reward { color: var(--add-fg); } tr.zero .reward, tr.failed .reward { color: var(--del-fg); }
tr.failed .status, .error { color: var(--del-fg); }
tr.up .delta { color: var(--add-fg); font-weight: 600; } tr.down .delta { color: var(--del-fg); font-weight: 600; }
ol.steps { padding-left: 1.5rem; }
ol.steps > li { margin: .5rem 0 1rem; }
pre { margin: .25rem 0; padding: .5rem; background: color-mix(in srgb, var(--line) 25%, transparent);
  overflow: auto; max-height: 30rem; white-space: pre-wrap; word-break: break-word; }
pre.diff { padding: 0; white-space: pre; }
.line { display: block; padding: 0 .5rem; }
.line.add { background: var(--add); color: var(--add-fg); }
.line.del { background: var(--del); color: var(--del-fg); }
.line.hunk { background: var(--hunk); color: var(--muted); }
.line.meta { color: var(--muted); font-weight: 600; }
details.file { margin: .25rem 0; border: 1px solid var(--line); }
details.file summary { padding: .2rem .5rem; cursor: pointer; }
.badge { font-size: .8em; color: var(--muted); border: 1px solid var(--line); border-radius: 1em; padding: 0 .5em; }
.muted { color: var(--muted); }
table.subscores { width: auto; margin: .25rem 0; }
dl.info dt { font-weight: 600; }
dl.info dd { margin: 0 0 .25rem 1rem; }
`;

/** `&`, `<`, `>`, `"` and `'` as entities: for text and attribute values. */
export function escapeHtml(text: string): string {
  return text.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

/** JSON that is safe inside a `<script>` block: no `<` at all. */
export function scriptJson(value: unknown): string {
  return JSON.stringify(value).replace(/</g, "\\u003c").replace(/\u2028/g, "\\u2028")
    .replace(/\u2029/g, "\\u2029");
}

let scriptHash: Promise<string> | null = null;

function hashOfScript(): Promise<string> {
  scriptHash ??= crypto.subtle.digest("SHA-256", new TextEncoder().encode(CLIENT_JS)).then(
    (digest) => new Uint8Array(digest).toBase64(),
  );
  return scriptHash;
}

/** What the page starts with. */
export interface PageData {
  /** Files, each with its rows (and, for a static report, its records). */
  files: { name: string; rows?: unknown[]; records?: unknown[]; generation?: number }[];
  /** The names of the fields of each row array. */
  fields: readonly string[];
  /** Whether the page polls the server for new rows. */
  live: boolean;
  /** Poll interval in ms. */
  pollInterval?: number;
  /** The live viewer's token, sent with the page's requests. */
  token?: string;
}

/** The whole page. */
export async function renderPage(title: string, data: PageData): Promise<string> {
  const hash = await hashOfScript();
  const connect = data.live ? "'self'" : "'none'";
  return `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'sha256-${hash}'; style-src 'unsafe-inline'; connect-src ${connect}; img-src data:">
<title>${escapeHtml(title)}</title>
<style>${CSS}</style>
</head>
<body>
<header><h1>${
    escapeHtml(title)
  }</h1><nav aria-label="Results files"><ul id="files"></ul></nav></header>
<main id="main"><p>Loading…</p></main>
<noscript><p>This page needs JavaScript to show the results.</p></noscript>
<script type="application/json" id="hud-data">${scriptJson(data)}</script>
<script>${CLIENT_JS}</script>
</body>
</html>
`;
}
