// The viewer page: one HTML document with inline CSS and script, no
// third-party assets. The data rides in a JSON script block whose "<" are
// escaped, and a Content-Security-Policy allows only this page's own script
// (by hash), so that nothing injected could run even if escaping failed.

import { CLIENT_JS } from "./_client.ts";

const CSS = `
:root { color-scheme: light dark; --fg: #1b1f24; --bg: #fff; --muted: #5c6670; --line: #d8dee4; --soft: #f6f8fa;
  --add: #e6ffec; --add-fg: #116329; --del: #ffebe9; --del-fg: #82071e; --hunk: #ddf4ff; --accent: #0550ae;
  --pass: #2da44e; --partial: #bf8700; --zero: #cf222e; --err: #8c959f;
  --user: #0969da; --assistant: #1a7f37; --system: #8250df; --tool: #9a6700; }
@media (prefers-color-scheme: dark) { :root { --fg: #e6edf3; --bg: #0d1117; --muted: #9198a1; --line: #30363d; --soft: #161b22;
  --add: #12261e; --add-fg: #7ee787; --del: #25171c; --del-fg: #ffa198; --hunk: #121d2f; --accent: #79c0ff;
  --pass: #3fb950; --partial: #d29922; --zero: #f85149; --err: #6e7681;
  --user: #58a6ff; --assistant: #3fb950; --system: #bc8cff; --tool: #d29922; } }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, sans-serif; color: var(--fg); background: var(--bg); }
header { display: flex; gap: 2rem; align-items: baseline; padding: .5rem 1rem; border-bottom: 1px solid var(--line); }
header h1 { font-size: 1.1rem; margin: 0; }
header ul { list-style: none; display: flex; gap: 1rem; margin: 0; padding: 0; flex-wrap: wrap; }
a { color: var(--accent); }
a[aria-current=page] { font-weight: 600; text-decoration: none; }
main { padding: 0 1rem 2rem; max-width: 90rem; }
h2 { font-size: 1.05rem; margin: 1rem 0 .5rem; }
h3 { font-size: .95rem; margin: 1.25rem 0 .4rem; }
h4 { font-size: .9rem; margin: .75rem 0 .25rem; }
.muted { color: var(--muted); } .small { font-size: .85em; }
dl.summary { display: grid; grid-template-columns: max-content 1fr; gap: .15rem 1rem; margin: 0; }
dl.summary dt { color: var(--muted); }
dl.summary dd { margin: 0; font-variant-numeric: tabular-nums; }
.tools { margin: .5rem 0; }
input, select, button { font: inherit; color: inherit; }
input[type=search] { width: 22rem; max-width: 100%; padding: .2rem .4rem; }
label.toggle { margin-left: 1rem; color: var(--muted); }
.scroller { height: 70vh; overflow: auto; border: 1px solid var(--line); }
.scroller:focus { outline: 2px solid var(--accent); }
table { border-collapse: collapse; width: 100%; }
#rollouts { table-layout: fixed; }
caption { text-align: left; color: var(--muted); padding: .25rem .5rem; }
th, td { text-align: left; padding: 0 .5rem; border-bottom: 1px solid var(--line); }
th.num { text-align: right; }
#rollouts td { height: 30px; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
#rollouts thead th { position: sticky; top: 0; background: var(--bg); z-index: 1; height: 32px; }
th button { all: unset; cursor: pointer; font-weight: 600; }
th button:focus-visible { outline: 2px solid var(--accent); }
tr.spacer td, tr.spacer { border: 0; padding: 0; }
tr.old td { color: var(--muted); font-style: italic; }
.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.pass .reward { color: var(--add-fg); } tr.zero .reward, tr.failed .reward { color: var(--del-fg); }
tr.failed .status, .error { color: var(--del-fg); }
tr.up .delta { color: var(--add-fg); font-weight: 600; } tr.down .delta { color: var(--del-fg); font-weight: 600; }
table.tasks { margin-bottom: .5rem; } table.tasks td, table.tasks th { padding: .15rem .5rem; }
.plots { display: grid; grid-template-columns: repeat(auto-fill, minmax(15rem, 19rem)); gap: .75rem 1.5rem; margin: .75rem 0; }
.plot-slot { height: 12rem; }
figure.plot { margin: 0; } figure.plot.wide { grid-column: span 1; }
figure figcaption { font-weight: 600; font-size: .9rem; }
svg.plot { width: 100%; height: auto; max-height: 22rem; display: block; }
svg .grid { stroke: var(--line); stroke-width: 1; } svg .axis { stroke: var(--muted); stroke-width: 1; }
svg .tick { fill: var(--muted); font-size: 9px; } svg .label { fill: var(--muted); font-size: 10px; }
svg .bar { fill: var(--accent); } svg .bar.pass { fill: var(--pass); } svg .bar.partial { fill: var(--partial); }
svg .bar.zero { fill: var(--zero); } svg .bar.err { fill: var(--err); } svg .track { fill: var(--line); }
svg .line { fill: none; stroke: var(--accent); stroke-width: 2; } svg .dot { fill: var(--accent); }
svg .area { fill: color-mix(in srgb, var(--accent) 35%, transparent); stroke: var(--accent); stroke-width: 1; }
svg .whisker { stroke: var(--fg); stroke-width: 1; }
svg.meter { vertical-align: middle; }
svg.timeline { width: 100%; height: 44px; display: block; border: 1px solid var(--line); }
svg.timeline.short { height: 22px; }
svg .phase-start { fill: color-mix(in srgb, var(--system) 40%, transparent); }
svg .phase-agent { fill: color-mix(in srgb, var(--assistant) 35%, transparent); }
svg .phase-grading { fill: color-mix(in srgb, var(--tool) 45%, transparent); }
svg .span-model { fill: var(--assistant); } svg .span-tool { fill: var(--tool); }
.legends { display: flex; gap: 1rem; flex-wrap: wrap; font-size: .85em; color: var(--muted); margin: .25rem 0; }
.legend::before { content: ""; display: inline-block; width: .7em; height: .7em; margin-right: .3em; vertical-align: baseline; }
.legend-start::before { background: var(--system); } .legend-agent::before { background: var(--assistant); }
.legend-grading::before { background: var(--tool); } .legend-model::before { background: var(--assistant); }
.legend-tool::before { background: var(--tool); }
ol.conversation { list-style: none; padding: 0; margin: 0; }
li.msg { margin: .5rem 0; padding: .35rem .75rem .5rem; border-left: 3px solid var(--line); background: var(--soft); border-radius: 0 6px 6px 0; }
li.msg-user { border-left-color: var(--user); } li.msg-assistant { border-left-color: var(--assistant); }
li.msg-system { border-left-color: var(--system); } li.msg-tool { border-left-color: var(--tool); }
li.msg-answer { border-left-color: var(--pass); } li.msg-agent { border-left-color: var(--tool); }
li.msg-refusal { border-left-color: var(--zero); }
.msg-head { display: flex; gap: .5rem; align-items: baseline; font-size: .85em; }
.msg-head time, li.event time { margin-left: auto; color: var(--muted); font-variant-numeric: tabular-nums; font-size: .85em; }
.role { font-weight: 600; text-transform: uppercase; letter-spacing: .04em; font-size: .8em; }
li.event { display: flex; gap: .25rem; align-items: baseline; margin: .25rem 0; padding: 0 .75rem; font-size: .9em; color: var(--muted); }
li.event.error { color: var(--del-fg); } li.event.grade { color: var(--fg); }
div.text { white-space: pre-wrap; word-break: break-word; margin: .2rem 0; }
pre { margin: .25rem 0; padding: .5rem; background: color-mix(in srgb, var(--line) 25%, transparent);
  overflow: auto; max-height: 30rem; white-space: pre-wrap; word-break: break-word; border-radius: 4px; }
pre.text { background: transparent; padding: .1rem 0; font: inherit; }
pre.code { background: #0d1117; color: #e6edf3; font-size: .9em; }
pre.args { font-size: .85em; }
div.call { margin: .35rem 0; border: 1px solid var(--line); border-radius: 6px; padding: .25rem .5rem; background: var(--bg); }
.call-head { font-size: .85em; } .tool-name { font-family: ui-monospace, monospace; font-weight: 600; color: var(--tool); }
figure.shot { position: relative; display: inline-block; margin: .35rem 0 0; max-width: 100%; }
figure.shot img { display: block; max-width: 100%; border: 1px solid var(--line); }
figure.shot .mark { position: absolute; width: 18px; height: 18px; margin: -12px 0 0 -12px; border: 3px solid #e4002b; border-radius: 50%; box-shadow: 0 0 0 2px #fff; pointer-events: none; }
figure.shot .mark.from { border-style: dashed; }
details.result { margin: .25rem 0 0; } details.result > summary { cursor: pointer; font-size: .85em; }
details.result.failed > summary { color: var(--del-fg); }
details.result pre { background: color-mix(in srgb, var(--line) 20%, transparent); padding: .35rem .5rem; font-family: ui-monospace, monospace; font-size: .85em; }
details.long > summary, details.json > summary, details.raw > summary, details.setup > summary { cursor: pointer; color: var(--muted); }
div.arg .text { white-space: pre-wrap; }
p.kv { margin: .15rem 0; color: var(--muted); font-size: .9em; }
pre.diff { padding: 0; white-space: pre; font-family: ui-monospace, monospace; font-size: .85em; }
.line { display: block; padding: 0 .5rem; }
.line.add { background: var(--add); color: var(--add-fg); }
.line.del { background: var(--del); color: var(--del-fg); }
.line.hunk { background: var(--hunk); color: var(--muted); }
.line.meta { color: var(--muted); font-weight: 600; }
details.file { margin: .25rem 0; border: 1px solid var(--line); border-radius: 4px; }
details.file summary { padding: .2rem .5rem; cursor: pointer; }
details.setup { margin: .5rem 0; }
.adds { color: var(--add-fg); font-size: .85em; } .dels { color: var(--del-fg); font-size: .85em; }
.badge { font-size: .8em; color: var(--muted); border: 1px solid var(--line); border-radius: 1em; padding: 0 .5em; }
p.score-line { font-size: 1.1rem; margin: .25rem 0; } strong.score { font-size: 1.4rem; }
table.subscores { width: auto; margin: .25rem 0; } table.subscores td, table.subscores th { padding: .1rem .5rem; }
ul.breakdown { margin: .25rem 0; padding-left: 1.25rem; }
p.history { background: var(--soft); padding: .35rem .75rem; border-radius: 6px; }
`;

/** `&`, `<`, `>`, `"` and `'` as entities: for text and attribute values. */
function escapeHtml(text: string): string {
  return text.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

/** JSON that is safe inside a `<script>` block: no `<` at all. */
function scriptJson(value: unknown): string {
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
  files: {
    name: string;
    rows?: unknown[];
    /** The subscore names that packed rows' `sub` values follow. */
    subscores?: readonly string[];
    /** The job's summary: whole for a static report, its head for a live page. */
    summary?: unknown;
    records?: unknown[];
    generation?: number;
  }[];
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
<html lang="en" data-ready="0">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'sha256-${hash}'; style-src 'unsafe-inline'; connect-src ${connect}; img-src data:${
    data.live ? " 'self'" : ""
  }">
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
