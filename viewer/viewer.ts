/**
 * The trace viewer: {@linkcode startViewer} serves a page over one or more
 * results files (the JSONL that `Taskset.run({ out })` writes) on
 * 127.0.0.1 and shows new rollouts as a job appends them;
 * {@linkcode renderReport} makes the same page as one self-contained HTML
 * file.
 *
 * @module
 */

import { parseRecord, ResultsFile, ROW_FIELDS, Rows } from "./_data.ts";
import { renderPage } from "./_page.ts";
import { resultsFilesDir } from "../eval/results.ts";
import { bearerToken, generateToken, tokenProblem, TokenVerifier } from "../_internal/auth.ts";
import { formatHost, isLoopback } from "../_internal/net.ts";
import { errorMessage } from "../_internal/util.ts";

/** Options for {@linkcode renderReport}. */
export interface ReportOptions {
  /**
   * The page title.
   * @default "HUD results"
   */
  title?: string;
}

function baseName(path: string): string {
  return path.slice(path.lastIndexOf("/") + 1) || path;
}

/** Names for the files: base names, or the full paths when two share one. */
function namesOf(paths: string[]): string[] {
  const bases = paths.map(baseName);
  return bases.map((b, i) => bases.indexOf(b) !== bases.lastIndexOf(b) ? paths[i] : b);
}

async function checkFiles(paths: string[], what: string): Promise<void> {
  if (!Array.isArray(paths) || paths.length === 0) {
    throw new TypeError(`Cannot ${what}: give at least one results file`);
  }
  for (const path of paths) {
    if (typeof path !== "string" || path === "") {
      throw new TypeError(`Cannot ${what}: a results file path must be a non-empty string`);
    }
    const info = await Deno.stat(path).catch(() => null);
    if (info === null || !info.isFile) {
      throw new TypeError(`Cannot ${what}: "${path}" is not a file (run a job with --out first)`);
    }
  }
}

/**
 * One self-contained HTML page (inline CSS and script, data included, no
 * network) showing the results files: the job summary, the rollouts table,
 * each rollout's steps, and a comparison when there are two or more files.
 *
 * @example
 * ```ts
 * import { renderReport } from "./viewer.ts";
 * import assert from "node:assert/strict";
 *
 * const file = await Deno.makeTempFile({ suffix: ".jsonl" });
 * const record = {
 *   job_id: "j", group_id: "j:t", task: { env: "e", id: "t", args: {}, slug: "t" },
 *   repeat: 0, status: "completed", reward: 1, failed_phase: null,
 *   trace: { steps: [{ type: "agent", timestamp: "", content: "</script><b>hi</b>" }] },
 * };
 * await Deno.writeTextFile(file, JSON.stringify(record) + "\n");
 * const html = await renderReport([file]);
 * assert.ok(!html.includes("</script><b>"));
 * await Deno.remove(file);
 * ```
 *
 * @param paths results files (JSONL), the first one shown first
 * @throws {TypeError} when no file is given or one does not exist
 */
export async function renderReport(paths: string[], options: ReportOptions = {}): Promise<string> {
  await checkFiles(paths, "write report");
  const names = namesOf(paths);
  const files = [];
  for (let f = 0; f < paths.length; f++) {
    const table = new Rows();
    const records = [];
    for (const line of (await Deno.readTextFile(paths[f])).split("\n")) {
      const record = parseRecord(line);
      if (record === null) continue;
      table.add(record);
      records.push(record);
    }
    files.push({
      name: names[f],
      rows: table.packed(),
      subscores: table.subscoreNames,
      summary: table.summary,
      records,
    });
  }
  return await renderPage(options.title ?? "HUD results", {
    files,
    fields: ROW_FIELDS,
    live: false,
  });
}

/** Options for {@linkcode startViewer}. */
export interface ViewerOptions {
  /**
   * Interface to listen on.
   * @default "127.0.0.1"
   */
  hostname?: string;
  /**
   * Port to listen on; 0 picks a free one.
   * @default 0
   */
  port?: number;
  /** Aborting it shuts the server down. */
  signal?: AbortSignal;
  /** Called once listening, with the address. */
  onListen?: (addr: Deno.NetAddr) => void;
  /**
   * How often the page asks for new rows, in ms.
   * @default 1000
   */
  pollInterval?: number;
  /**
   * The page title.
   * @default "HUD results"
   */
  title?: string;
  /**
   * The secret every request must carry (in the url's `token` parameter or
   * as `Authorization: Bearer`); others get 403.
   * @default a fresh 256-bit one
   */
  token?: string;
}

/** A running viewer, shaped like `Deno.serve`'s handle. */
export interface ViewerServer extends AsyncDisposable {
  /** Where it listens. */
  readonly addr: Deno.NetAddr;
  /**
   * The page's url with its token, `http://127.0.0.1:<port>/?token=...`:
   * whoever has it can read the results, so show it only to the viewer's
   * user.
   */
  readonly url: string;
  /** The token requests must carry. */
  readonly token: string;
  /** Settles when the server has shut down. */
  readonly finished: Promise<void>;
  /** Stops serving; idempotent. */
  shutdown(): Promise<void>;
}

/** Headers on every response: nothing cached, sniffed or sent on as a referrer (the url holds the token). */
const COMMON_HEADERS: Record<string, string> = {
  "cache-control": "no-store",
  "x-content-type-options": "nosniff",
  "referrer-policy": "no-referrer",
};

function jsonResponse(body: string, status = 200): Response {
  return new Response(body, {
    status,
    headers: { "content-type": "application/json; charset=utf-8", ...COMMON_HEADERS },
  });
}

function textResponse(body: string, status: number): Response {
  return new Response(body, {
    status,
    headers: { "content-type": "text/plain; charset=utf-8", ...COMMON_HEADERS },
  });
}

/**
 * Serves the viewer over results files on 127.0.0.1: the page at `/`, new
 * rows at `/api/rows?file=F&from=N` (with the summary's head), the job's
 * summary at `/api/summary?file=F` (what `Job.summary()` says of
 * the file, exact), one record at `/api/record?file=F&i=N`, and the files
 * its traces reference (screenshots) at `/files/<sha256>.png?file=F`, from
 * `<results file>.files/`. Files are read incrementally, so a job that is still writing one shows
 * its rollouts as they finish. Every request must carry the viewer's token
 * (`?token=` as in {@linkcode ViewerServer.url}, or `Authorization: Bearer`;
 * the page sends it with each of its requests), so that other local users,
 * who can reach any loopback port, read nothing; requests whose `Host` is
 * not a loopback name are refused too (no DNS rebinding).
 *
 * @example
 * ```ts
 * import { startViewer } from "./viewer.ts";
 * import assert from "node:assert/strict";
 *
 * const file = await Deno.makeTempFile({ suffix: ".jsonl" });
 * await using viewer = await startViewer([file]);
 * const res = await fetch(new URL("api/rows?file=0&from=0", viewer.url), {
 *   headers: { authorization: `Bearer ${viewer.token}` },
 * });
 * assert.deepEqual((await res.json()).rows, []);
 * const stranger = await fetch(new URL("api/rows?file=0&from=0", viewer.url));
 * assert.equal(stranger.status, 403);
 * await stranger.body?.cancel();
 * await Deno.remove(file);
 * ```
 *
 * @param paths results files (JSONL)
 * @throws {TypeError} when no file is given or one does not exist, or for a bad token
 */
export async function startViewer(
  paths: string[],
  options: ViewerOptions = {},
): Promise<ViewerServer> {
  await checkFiles(paths, "view results");
  const token = options.token ?? generateToken();
  const problem = tokenProblem(token);
  if (problem !== null) throw new TypeError(`Cannot view results: ${problem}`);
  const site = new ViewerSite(paths, token, options);
  // Read what is there before listening, so that the first page is quick.
  await site.refresh();
  let listened: (addr: Deno.NetAddr) => void;
  const listening = new Promise<Deno.NetAddr>((resolve) => listened = resolve);
  const server = Deno.serve({
    hostname: options.hostname ?? "127.0.0.1",
    port: options.port ?? 0,
    signal: options.signal,
    onListen: (addr) => listened(addr as Deno.NetAddr),
    onError: (err) => new Response(`Internal error: ${errorMessage(err)}\n`, { status: 500 }),
  }, (request) => site.handle(request));
  const addr = await listening;
  options.onListen?.(addr);
  const host = formatHost(addr.hostname);
  let stopping: Promise<void> | null = null;
  const shutdown = () => stopping ??= server.shutdown();
  return {
    addr,
    url: `http://${host}:${addr.port}/?token=${encodeURIComponent(token)}`,
    token,
    finished: server.finished,
    shutdown,
    [Symbol.asyncDispose]: shutdown,
  };
}

/** The viewer's requests: the checks every one passes, the page, and the API. */
class ViewerSite {
  readonly #paths: string[];
  readonly #files: ResultsFile[];
  readonly #names: string[];
  readonly #token: string;
  readonly #verifier: TokenVerifier;
  readonly #title: string;
  readonly #pollInterval: number;
  /** Whether it listens on loopback, where a foreign `Host` means DNS rebinding. */
  readonly #loopback: boolean;

  constructor(paths: string[], token: string, options: ViewerOptions) {
    this.#paths = paths;
    this.#files = paths.map((p) => new ResultsFile(p));
    this.#names = namesOf(paths);
    this.#token = token;
    this.#verifier = new TokenVerifier(token);
    this.#title = options.title ?? "HUD results";
    this.#pollInterval = options.pollInterval ?? 1000;
    this.#loopback = isLoopback(options.hostname ?? "127.0.0.1");
  }

  /** Reads what the files gained. */
  async refresh(): Promise<void> {
    await Promise.all(this.#files.map((f) => f.refresh()));
  }

  async handle(request: Request): Promise<Response> {
    const host = (request.headers.get("host") ?? "").replace(/:\d+$/, "");
    if (this.#loopback && !isLoopback(host)) {
      return textResponse("Forbidden: unexpected Host header\n", 403);
    }
    const url = new URL(request.url);
    const given = bearerToken(request.headers.get("authorization")) ??
      url.searchParams.get("token");
    if (!this.#verifier.verify(given)) {
      return textResponse("Forbidden: open the url with the token that view printed\n", 403);
    }
    if (request.method !== "GET") return textResponse("Method not allowed\n", 405);
    if (url.pathname === "/") return await this.#page();
    const f = Number(url.searchParams.get("file") ?? "0");
    const file = Number.isInteger(f) && f >= 0 && f < this.#files.length ? this.#files[f] : null;
    if (url.pathname.startsWith("/files/") && file !== null) {
      return await traceFileResponse(this.#paths[f], url) ?? textResponse("Not found\n", 404);
    }
    const api = API.get(url.pathname);
    if (api === undefined) return textResponse("Not found\n", 404);
    if (file === null) return jsonResponse('{"error":"unknown file"}', 404);
    return await api(file, url);
  }

  /** The page, with the rows so far in it: one round trip to a full table. */
  async #page(): Promise<Response> {
    await this.refresh();
    const page = await renderPage(this.#title, {
      files: this.#files.map((f, i) => ({
        name: this.#names[i],
        rows: f.table.packed(),
        subscores: f.table.subscoreNames,
        summary: f.table.head,
        generation: f.generation,
      })),
      fields: ROW_FIELDS,
      live: true,
      pollInterval: this.#pollInterval,
      token: this.#token,
    });
    return new Response(page, {
      headers: { "content-type": "text/html; charset=utf-8", ...COMMON_HEADERS },
    });
  }
}

const IMAGE_TYPES: Readonly<Record<string, string>> = {
  png: "image/png",
  jpg: "image/jpeg",
  webp: "image/webp",
};

/**
 * A trace's file (a screenshot) for `/files/<sha256>.<ext>`, read from
 * beside its results file; null for another path, 404 for a missing file.
 */
async function traceFileResponse(resultsPath: string, url: URL): Promise<Response | null> {
  const named = /^\/files\/([0-9a-f]{64})\.(png|jpg|webp)$/.exec(url.pathname);
  if (named === null) return null;
  const path = `${resultsFilesDir(resultsPath)}/${named[1]}.${named[2]}`;
  const bytes = await Deno.readFile(path).catch(() => null);
  if (bytes === null) return textResponse("Not found\n", 404);
  return new Response(bytes, {
    headers: { "content-type": IMAGE_TYPES[named[2]], ...COMMON_HEADERS },
  });
}

/** The API, by path: each answers for one results file. */
const API = new Map<string, (file: ResultsFile, url: URL) => Promise<Response> | Response>([
  ["/api/rows", rowsResponse],
  ["/api/summary", summaryResponse],
  ["/api/record", recordResponse],
]);

/** The rows from `from` on (all of them when the file was rewritten since `generation`). */
async function rowsResponse(file: ResultsFile, url: URL): Promise<Response> {
  await file.refresh();
  const generation = Number(url.searchParams.get("generation") ?? file.generation);
  const from = generation === file.generation
    ? Math.max(0, Number(url.searchParams.get("from") ?? "0") || 0)
    : 0;
  return jsonResponse(JSON.stringify({
    generation: file.generation,
    rows: file.table.packed(from),
    subscores: file.table.subscoreNames,
    summary: file.table.head,
  }));
}

/** What `Job.summary()` says of the file. */
async function summaryResponse(file: ResultsFile): Promise<Response> {
  await file.refresh();
  return jsonResponse(JSON.stringify(file.table.summary));
}

/** Record `i`, as the file holds it. */
function recordResponse(file: ResultsFile, url: URL): Response {
  const i = Number(url.searchParams.get("i"));
  if (!Number.isInteger(i) || i < 0 || i >= file.lines.length) {
    return jsonResponse('{"error":"no such record"}', 404);
  }
  return jsonResponse(file.lines[i]);
}
