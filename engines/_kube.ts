// A Kubernetes API client with Deno's own fetch: where the API server is
// and how to authenticate (a kubeconfig's server, CA and credentials, or
// the pod's service account in the cluster), calls that retry 409, 429 and
// 5xx with jitter, rate limits, and the WebSocket of a port-forward. No
// kubectl.

import { delay } from "../_internal/async.ts";
import { errorMessage, isRecord } from "../_internal/util.ts";
import { reachableSync } from "../_internal/fs.ts";
import { formatHostPort } from "../_internal/net.ts";
import { parseYaml } from "./_yaml.ts";
import { RawWebSocket } from "./_websocket.ts";

/** A failed API call: the HTTP status, the Status object's reason and message. */
export class KubeApiError extends Error {
  /** HTTP status. */
  readonly status: number;
  /** The Status reason (`NotFound`, `AlreadyExists`, `Forbidden`...). */
  readonly reason: string;
  /** An error for an HTTP `status`. */
  constructor(message: string, status: number, reason: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "KubeApiError";
    this.status = status;
    this.reason = reason;
  }
}

/** Where the API server is and who we are to it. */
export interface KubeConfig {
  /** `https://host:port`, no trailing slash. */
  server: string;
  /** PEM CA certificates to trust, besides the system's. */
  caCerts: string[];
  /** PEM client certificate and key. */
  cert?: string;
  key?: string;
  /** A bearer token, read again when it may have changed (service account, exec plugin). */
  token?: () => Promise<string | undefined>;
  /** The namespace of the context (or the pod). */
  namespace: string;
  /** Whether this is the pod's own service account. */
  inCluster: boolean;
  /** The pod we run in, when in the cluster (`HOSTNAME`). */
  podName?: string;
  /** What the configuration was read from, for errors. */
  source: string;
}

/** Options for {@linkcode loadKubeConfig}. */
export interface LoadKubeConfigOptions {
  /** A kubeconfig file; default `KUBECONFIG` (the first that exists), else in-cluster, else ~/.kube/config. */
  kubeconfig?: string;
  /** The context; default the file's current-context. */
  context?: string;
  /** The service account's directory, in the cluster. */
  serviceAccountDir?: string;
}

const SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount";

/** Reads the configuration, as kubectl would find it (one file; no merging of several). */
export async function loadKubeConfig(options: LoadKubeConfigOptions = {}): Promise<KubeConfig> {
  let file = options.kubeconfig;
  if (file === undefined) {
    const listed = (Deno.env.get("KUBECONFIG") ?? "").split(":").filter((p) => p !== "");
    file = listed.find(reachableSync);
    if (file === undefined && listed.length > 0) {
      throw new Deno.errors.NotFound(
        `Cannot read the kubeconfig: none of KUBECONFIG "${listed.join(":")}" exists`,
      );
    }
  }
  if (file === undefined && Deno.env.get("KUBERNETES_SERVICE_HOST")) {
    return await inClusterConfig(options.serviceAccountDir ?? SERVICE_ACCOUNT_DIR);
  }
  if (file === undefined) {
    const home = Deno.env.get("HOME");
    file = home ? `${home}/.kube/config` : undefined;
    if (file === undefined || !reachableSync(file)) {
      throw new Deno.errors.NotFound(
        "Cannot find the Kubernetes API: no kubeconfig (set KUBECONFIG or pass kubeconfig) and not in a cluster",
      );
    }
  }
  return await fileConfig(file, options.context);
}

async function inClusterConfig(dir: string): Promise<KubeConfig> {
  const host = Deno.env.get("KUBERNETES_SERVICE_HOST")!;
  const port = Deno.env.get("KUBERNETES_SERVICE_PORT") ?? "443";
  const ca = await Deno.readTextFile(`${dir}/ca.crt`);
  const namespace = (await Deno.readTextFile(`${dir}/namespace`).catch(() => "default")).trim();
  // Bound tokens rotate: read the file again every minute.
  let cached: { token: string; at: number } | null = null;
  const token = async () => {
    if (cached === null || Date.now() - cached.at > 60_000) {
      cached = { token: (await Deno.readTextFile(`${dir}/token`)).trim(), at: Date.now() };
    }
    return cached.token;
  };
  await token();
  return {
    server: `https://${formatHostPort(host, Number(port))}`,
    caCerts: [ca],
    token,
    namespace,
    inCluster: true,
    podName: Deno.env.get("HOSTNAME"),
    source: `the service account in ${dir}`,
  };
}

function named(list: unknown, name: string, what: string, file: string): Record<string, unknown> {
  const entry = Array.isArray(list)
    ? list.find((e) => isRecord(e) && e.name === name) as Record<string, unknown> | undefined
    : undefined;
  if (!entry) {
    throw new TypeError(`Cannot read the kubeconfig ${file}: no ${what} "${name}"`);
  }
  const body = entry[what === "context" ? "context" : what];
  return isRecord(body) ? body : {};
}

async function fileConfig(file: string, context?: string): Promise<KubeConfig> {
  const doc = readYamlFile(file, await Deno.readTextFile(file));
  const name = context ?? doc["current-context"];
  if (typeof name !== "string" || name === "") {
    throw new TypeError(`Cannot read the kubeconfig ${file}: no current-context; pass context`);
  }
  const ctx = named(doc.contexts, name, "context", file);
  const cluster = named(doc.clusters, String(ctx.cluster), "cluster", file);
  const user = ctx.user === undefined ? {} : named(doc.users, String(ctx.user), "user", file);
  if (typeof cluster.server !== "string" || !/^https?:\/\//.test(cluster.server)) {
    throw new TypeError(`Cannot read the kubeconfig ${file}: cluster of "${name}" has no server`);
  }
  if (cluster["insecure-skip-tls-verify"] === true) {
    throw new TypeError(
      `Cannot use the kubeconfig ${file}: insecure-skip-tls-verify is not supported; give the cluster's certificate-authority`,
    );
  }
  const ca = await pem(
    file,
    cluster["certificate-authority-data"],
    cluster["certificate-authority"],
  );
  return {
    server: cluster.server.replace(/\/+$/, ""),
    caCerts: ca ? [ca] : [],
    cert: await pem(file, user["client-certificate-data"], user["client-certificate"]),
    key: await pem(file, user["client-key-data"], user["client-key"]),
    token: userToken(file, user),
    namespace: typeof ctx.namespace === "string" && ctx.namespace !== ""
      ? ctx.namespace
      : "default",
    inCluster: false,
    source: `the kubeconfig ${file} (context "${name}")`,
  };
}

/** The kubeconfig's mapping. */
function readYamlFile(file: string, text: string): Record<string, unknown> {
  let doc: unknown;
  try {
    doc = parseYaml(text);
  } catch (err) {
    throw new TypeError(`Cannot read the kubeconfig ${file}: ${errorMessage(err)}`, {
      cause: err,
    });
  }
  if (!isRecord(doc)) throw new TypeError(`Cannot read the kubeconfig ${file}: not a mapping`);
  return doc;
}

/** A path the kubeconfig names, relative to its directory. */
function besides(file: string, p: unknown): string {
  const dir = file.includes("/") ? file.slice(0, file.lastIndexOf("/")) : ".";
  return String(p).startsWith("/") ? String(p) : `${dir}/${p}`;
}

/** PEM text given inline (base64 `*-data`) or by a file, or undefined. */
async function pem(file: string, data: unknown, ref: unknown): Promise<string | undefined> {
  if (typeof data === "string" && data !== "") {
    return new TextDecoder().decode(Uint8Array.from(atob(data), (c) => c.charCodeAt(0)));
  }
  if (typeof ref === "string" && ref !== "") return await Deno.readTextFile(besides(file, ref));
  return undefined;
}

/** The user's bearer token: given, in a file (read each time), or from a credential plugin. */
function userToken(file: string, user: Record<string, unknown>): KubeConfig["token"] {
  if (typeof user.token === "string" && user.token !== "") {
    const t = user.token;
    return () => Promise.resolve(t);
  }
  if (typeof user.tokenFile === "string") {
    const f = besides(file, user.tokenFile);
    return async () => (await Deno.readTextFile(f)).trim();
  }
  if (isRecord(user.exec)) return execToken(user.exec, file);
  return undefined;
}

/** A credential plugin (`users[].user.exec`): runs it, keeps its token until it expires. */
function execToken(exec: Record<string, unknown>, file: string): () => Promise<string | undefined> {
  let cached: { token: string; until: number } | null = null;
  return async () => {
    if (cached !== null && Date.now() < cached.until) return cached.token;
    const cred = await runPlugin(exec, file);
    const expires = cred.expirationTimestamp
      ? Date.parse(cred.expirationTimestamp) - 30_000
      : Date.now() + 5 * 60_000;
    cached = { token: cred.token, until: expires };
    return cred.token;
  };
}

/** Runs a credential plugin as kubectl does; its ExecCredential's token and expiry. */
async function runPlugin(
  exec: Record<string, unknown>,
  file: string,
): Promise<{ token: string; expirationTimestamp?: string }> {
  const env: Record<string, string> = {};
  if (Array.isArray(exec.env)) {
    for (const e of exec.env) if (isRecord(e)) env[String(e.name)] = String(e.value);
  }
  const command = String(exec.command);
  const what = `Cannot authenticate with the kubeconfig ${file}`;
  const out = await new Deno.Command(command, {
    args: Array.isArray(exec.args) ? exec.args.map(String) : [],
    env: {
      ...env,
      KUBERNETES_EXEC_INFO: JSON.stringify({
        apiVersion: exec.apiVersion,
        kind: "ExecCredential",
        spec: { interactive: false },
      }),
    },
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
    signal: AbortSignal.timeout(60_000),
  }).output().catch((err) => {
    throw new Deno.errors.NotFound(
      `${what}: cannot run its credential plugin "${command}": ${errorMessage(err)}`,
      { cause: err },
    );
  });
  if (!out.success) {
    throw new Deno.errors.PermissionDenied(
      `${what}: credential plugin "${command}" exited with code ${out.code}: ${
        new TextDecoder().decode(out.stderr).trim().slice(-300)
      }`,
    );
  }
  const cred = JSON.parse(new TextDecoder().decode(out.stdout)) as {
    status?: { token?: string; expirationTimestamp?: string };
  };
  const token = cred.status?.token;
  if (!token) {
    throw new Deno.errors.PermissionDenied(`${what}: credential plugin "${command}" gave no token`);
  }
  return { token, expirationTimestamp: cred.status?.expirationTimestamp };
}

/** A token bucket: `perSecond` on average, bursts of `burst`. */
export class RateLimiter {
  readonly #perSecond: number;
  readonly #burst: number;
  #tokens: number;
  #at = Date.now();
  #queue: Promise<void> = Promise.resolve();

  constructor(perSecond: number, burst: number = Math.max(1, Math.ceil(perSecond))) {
    this.#perSecond = perSecond;
    this.#burst = burst;
    this.#tokens = burst;
  }

  /** Waits for a token (in arrival order). */
  acquire(signal?: AbortSignal): Promise<void> {
    const next = this.#queue.then(async () => {
      const now = Date.now();
      this.#tokens = Math.min(
        this.#burst,
        this.#tokens + (now - this.#at) * this.#perSecond / 1000,
      );
      this.#at = now;
      if (this.#tokens < 1) {
        await delay(Math.ceil((1 - this.#tokens) * 1000 / this.#perSecond), signal);
        this.#tokens = 1;
        this.#at = Date.now();
      }
      this.#tokens -= 1;
    });
    this.#queue = next.catch(() => {});
    return next;
  }
}

/** Options of one call. */
export interface KubeCallOptions {
  signal?: AbortSignal;
  /** Retry 409, 429 and 5xx (and connection errors) with jitter. @default true */
  retry?: boolean;
  /** Most attempts when retrying. @default 6 */
  attempts?: number;
  /** `Content-Type` of the body. @default application/json */
  contentType?: string;
}

/** Status codes worth another try: conflicts, throttling, server trouble. */
function retriable(status: number): boolean {
  return status === 409 || status === 429 || status >= 500;
}

/** A client for one API server; close it when done. */
export class KubeClient implements Disposable {
  readonly config: KubeConfig;
  readonly #http: Deno.HttpClient;

  constructor(config: KubeConfig) {
    this.config = config;
    const tls = config.cert && config.key ? { cert: config.cert, key: config.key } : {};
    this.#http = Deno.createHttpClient({ caCerts: config.caCerts, ...tls });
  }

  async #headers(extra: Record<string, string> = {}): Promise<Record<string, string>> {
    const token = await this.config.token?.();
    return {
      accept: "application/json",
      ...extra,
      ...(token ? { authorization: `Bearer ${token}` } : {}),
    };
  }

  /**
   * One call; the body is JSON. Returns the parsed reply (text for non-JSON).
   * @throws {KubeApiError} for a refused call, after the retries
   */
  async call(
    method: string,
    path: string,
    body?: unknown,
    options: KubeCallOptions = {},
  ): Promise<unknown> {
    const attempts = options.retry === false ? 1 : options.attempts ?? 6;
    for (let attempt = 1;; attempt++) {
      options.signal?.throwIfAborted();
      const last = attempt >= attempts;
      let res: Response;
      try {
        res = await this.#fetch(method, path, body, options);
      } catch (err) {
        if (options.signal?.aborted) throw err;
        if (last) {
          throw new Deno.errors.ConnectionRefused(
            `Cannot reach the Kubernetes API at ${this.config.server} (${this.config.source}): ${
              errorMessage(err)
            }`,
            { cause: err },
          );
        }
        await delay(backoff(attempt), options.signal);
        continue;
      }
      const text = await res.text();
      if (res.ok) return replyBody(res, text);
      if (!retriable(res.status) || last) throw refusal(method, path, res, text);
      const after = Number(res.headers.get("retry-after"));
      await delay(
        Number.isFinite(after) && after > 0 ? Math.min(after * 1000, 10_000) : backoff(attempt),
        options.signal,
      );
    }
  }

  async #fetch(
    method: string,
    path: string,
    body: unknown,
    options: KubeCallOptions,
  ): Promise<Response> {
    const type: Record<string, string> = body === undefined
      ? {}
      : { "content-type": options.contentType ?? "application/json" };
    return await fetch(`${this.config.server}${path}`, {
      method,
      client: this.#http,
      headers: await this.#headers(type),
      body: body === undefined ? undefined : JSON.stringify(body),
      signal: options.signal,
    });
  }

  /** A WebSocket to `path` (port-forward), authenticated as the calls are. */
  async webSocket(path: string, protocol: string): Promise<RawWebSocket> {
    const token = await this.config.token?.();
    return await RawWebSocket.open({
      url: new URL(`${this.config.server}${path}`),
      protocol,
      headers: token ? { Authorization: `Bearer ${token}` } : {},
      caCerts: this.config.caCerts,
      cert: this.config.cert,
      key: this.config.key,
    });
  }

  close(): void {
    this.#http.close();
  }

  [Symbol.dispose](): void {
    this.close();
  }
}

/** A successful reply's body: JSON parsed, other text as it is, nothing as null. */
function replyBody(res: Response, text: string): unknown {
  if (text === "") return null;
  return (res.headers.get("content-type") ?? "").includes("json") ? JSON.parse(text) : text;
}

/** A refused call, with the Status object's reason and message. */
function refusal(method: string, path: string, res: Response, text: string): KubeApiError {
  let status: { reason?: string; message?: string } = {};
  try {
    status = JSON.parse(text);
  } catch {
    status = { message: text.trim().slice(0, 300) };
  }
  return new KubeApiError(
    `${method} ${path.replace(/\?.*/, "")}: ${res.status} ${status.reason ?? res.statusText}: ${
      status.message ?? ""
    }`.trim(),
    res.status,
    status.reason ?? "",
  );
}

/** Full jitter: a random wait up to 100 ms * 2^attempt, at most 5 s. */
function backoff(attempt: number): number {
  return Math.random() * Math.min(5_000, 100 * 2 ** attempt);
}
