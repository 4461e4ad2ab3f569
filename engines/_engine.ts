// A client for the Docker Engine API (which Podman also serves) over its
// unix socket, with Deno's own fetch: the few calls the container runtime
// and the image builder need.

import { errorMessage } from "../_internal/util.ts";

/** The newest API version this client speaks; older servers are met at theirs. */
const OUR_API = "1.43";

/** Where to look for an engine, in order, when `DOCKER_HOST` is not set. */
const SOCKETS = ["/var/run/docker.sock", "/run/podman/podman.sock"];

/** A failed Engine API call: the HTTP status and the engine's message. */
export class EngineError extends Error {
  /** HTTP status. */
  readonly status: number;
  /** An error for an HTTP `status` with the engine's `message`. */
  constructor(message: string, status: number, options?: ErrorOptions) {
    super(message, options);
    this.name = "EngineError";
    this.status = status;
  }
}

function compareVersions(a: string, b: string): number {
  const [a1, a2] = a.split(".").map(Number);
  const [b1, b2] = b.split(".").map(Number);
  return a1 !== b1 ? a1 - b1 : a2 - b2;
}

/** The engine socket: `socket`, else `DOCKER_HOST` (unix only), else the first that exists. */
export function findEngineSocket(socket?: string): string {
  if (socket !== undefined) return socket;
  const host = Deno.env.get("DOCKER_HOST");
  if (host) {
    if (!host.startsWith("unix://")) {
      throw new TypeError(
        `Cannot reach the container engine: DOCKER_HOST "${host}" is not a unix:// socket; unset it or point it at one`,
      );
    }
    return host.slice("unix://".length);
  }
  const xdg = Deno.env.get("XDG_RUNTIME_DIR");
  for (const path of [...SOCKETS, ...(xdg ? [`${xdg}/podman/podman.sock`] : [])]) {
    try {
      if (Deno.statSync(path).isSocket) return path;
    } catch {
      // not there
    }
  }
  throw new Deno.errors.NotFound(
    `Cannot reach the container engine: no socket at ${
      SOCKETS.join(" or ")
    }; start Docker or Podman, or set DOCKER_HOST=unix:///path`,
  );
}

/** A connection to one engine; close it when done. */
export class EngineClient implements Disposable {
  readonly #http: Deno.HttpClient;
  readonly #prefix: string;
  /** The socket path. */
  readonly socket: string;
  /** `Docker` or `Podman`, and the engine's version. */
  readonly product: string;

  private constructor(http: Deno.HttpClient, socket: string, prefix: string, product: string) {
    this.#http = http;
    this.socket = socket;
    this.#prefix = prefix;
    this.product = product;
  }

  /** Connects and negotiates the API version. */
  static async open(socket?: string, signal?: AbortSignal): Promise<EngineClient> {
    const path = findEngineSocket(socket);
    const http = Deno.createHttpClient({ proxy: { transport: "unix", path } });
    try {
      const res = await fetch("http://engine/version", { client: http, signal });
      if (!res.ok) throw new EngineError(`GET /version: ${await res.text()}`, res.status);
      const v = await res.json() as {
        ApiVersion?: string;
        MinAPIVersion?: string;
        Version?: string;
        Components?: { Name: string }[];
      };
      const api = v.ApiVersion ?? OUR_API;
      const use = compareVersions(api, OUR_API) < 0 ? api : OUR_API;
      const podman = (v.Components ?? []).some((c) => /podman/i.test(c.Name));
      return new EngineClient(
        http,
        path,
        `/v${use}`,
        `${podman ? "Podman" : "Docker"} ${v.Version}`,
      );
    } catch (err) {
      http.close();
      if (err instanceof EngineError) throw err;
      throw new Deno.errors.ConnectionRefused(
        `Cannot reach the container engine at ${path}: ${
          errorMessage(err)
        }; is the daemon running?`,
        { cause: err },
      );
    }
  }

  /** One call; JSON in and out. `null` for an empty body. */
  async call(
    method: string,
    path: string,
    body?: unknown,
    signal?: AbortSignal,
  ): Promise<unknown> {
    const res = await this.raw(method, path, {
      body: body === undefined ? undefined : JSON.stringify(body),
      headers: body === undefined ? {} : { "content-type": "application/json" },
      signal,
    });
    const text = await res.text();
    return text === "" ? null : JSON.parse(text);
  }

  /** One call, the response as it comes (for streams); fails on an error status. */
  async raw(
    method: string,
    path: string,
    init: { body?: BodyInit; headers?: Record<string, string>; signal?: AbortSignal } = {},
  ): Promise<Response> {
    const res = await fetch(`http://engine${this.#prefix}${path}`, {
      method,
      client: this.#http,
      body: init.body,
      headers: init.headers,
      signal: init.signal,
    });
    if (res.status >= 400) {
      const text = await res.text();
      let message = text.trim();
      try {
        message = (JSON.parse(text) as { message?: string }).message ?? message;
      } catch {
        // not JSON
      }
      throw new EngineError(`${method} ${path.split("?")[0]}: ${message}`, res.status);
    }
    return res;
  }

  /** The last `lines` lines of a container's output (stdout and stderr). */
  async logs(id: string, lines = 20): Promise<string> {
    const res = await this.raw(
      "GET",
      `/containers/${id}/logs?stdout=1&stderr=1&tail=${lines}`,
    );
    const bytes = new Uint8Array(await res.arrayBuffer());
    return demultiplex(bytes);
  }

  /** Closes the HTTP client. */
  close(): void {
    this.#http.close();
  }

  [Symbol.dispose](): void {
    this.close();
  }
}

/**
 * A container's log stream without a TTY comes in frames (1 byte stream,
 * 3 zero, 4 bytes big-endian length); with a TTY it is plain.
 */
function demultiplex(bytes: Uint8Array): string {
  const decoder = new TextDecoder();
  const framed = bytes.length >= 8 && bytes[0] <= 2 && bytes[1] === 0 && bytes[2] === 0 &&
    bytes[3] === 0;
  if (!framed) return decoder.decode(bytes);
  let out = "";
  let at = 0;
  while (at + 8 <= bytes.length) {
    const n = new DataView(bytes.buffer, bytes.byteOffset + at + 4, 4).getUint32(0);
    out += decoder.decode(bytes.subarray(at + 8, at + 8 + n));
    at += 8 + n;
  }
  return out;
}

/** 404, or Podman's 500 for a container another call removed meanwhile. */
function isGone(err: EngineError): boolean {
  return err.status === 404 || (err.status === 500 && /no such container/i.test(err.message));
}

/**
 * The engine's record of image `ref` (`GET /images/{ref}/json`), or null
 * when it has none.
 * @throws {EngineError} for any other failure
 */
export async function inspectImage<T = Record<string, unknown>>(
  engine: EngineClient,
  ref: string,
  signal?: AbortSignal,
): Promise<T | null> {
  try {
    return await engine.call(
      "GET",
      `/images/${encodeURIComponent(ref)}/json`,
      undefined,
      signal,
    ) as T;
  } catch (err) {
    if (err instanceof EngineError && err.status === 404) return null;
    throw err;
  }
}

/**
 * Stops and removes a container; one already stopped, gone, or being
 * removed by another cleaner counts as removed.
 */
export async function removeContainer(
  engine: EngineClient,
  id: string,
  stopTimeout: number,
): Promise<void> {
  try {
    await engine.call("POST", `/containers/${id}/stop?t=${stopTimeout}`);
  } catch (err) {
    // 304: already stopped; 404 (or Podman's 500 "no such container"): already gone.
    if (!(err instanceof EngineError) || (err.status !== 304 && !isGone(err))) throw err;
  }
  try {
    await engine.call("DELETE", `/containers/${id}?force=true`);
  } catch (err) {
    // 404: already gone; 409 "already in progress": another cleaner (a
    // second `gc`, the runtime releasing it) is removing it right now.
    const gone = err instanceof EngineError &&
      (isGone(err) || (err.status === 409 && /already in progress/.test(err.message)));
    if (!gone) throw err;
  }
}
