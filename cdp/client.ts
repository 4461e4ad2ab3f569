/**
 * A small Chrome DevTools Protocol client over the built-in `WebSocket`:
 * commands with `send(method, params)`, events (`on`, `waitFor`, `events`),
 * flat target sessions (`Target.attachToTarget` with `flatten: true`), and
 * page helpers (`navigate`, `evaluate`, `screenshot`). Every wait takes an
 * `AbortSignal`.
 *
 * @module
 */

import type { Capability } from "../capability.ts";
import {
  CdpError,
  type CdpErrorKind,
  type CdpErrorOptions,
  type CdpEvent,
  type CdpEventHandler,
  type CdpParams,
  isObject,
} from "./_protocol.ts";
import { type CdpChannel, webSocketChannel } from "./_channel.ts";
import { discoverBrowserWsUrl } from "./_discover.ts";
import {
  type CdpNavigateOptions,
  type CdpNavigateResult,
  evaluateInPage,
  navigatePage,
  screenshotPage,
} from "./_page.ts";

export {
  CdpError,
  type CdpErrorKind,
  type CdpErrorOptions,
  type CdpEvent,
  type CdpEventHandler,
  type CdpParams,
};
export type { CdpChannel };
export { type CdpNavigateOptions, type CdpNavigateResult, discoverBrowserWsUrl };

/** Options for {@linkcode CdpClient.connect}. */
export interface CdpConnectOptions {
  /** Aborts the connection attempt. */
  signal?: AbortSignal;
}

/** Options for {@linkcode CdpClient.send}. */
export interface CdpSendOptions {
  /** Route the command to a flat target session. */
  sessionId?: string;
  /** Stops waiting for the answer (the command may still run in the browser). */
  signal?: AbortSignal;
}

/** Options for {@linkcode CdpClient.waitFor}. */
export interface CdpWaitForOptions {
  /** Only match events of this session (`undefined` = any session). */
  sessionId?: string;
  /** Stops waiting. */
  signal?: AbortSignal;
}

interface Pending {
  method: string;
  resolve: (value: CdpParams) => void;
  reject: (reason: unknown) => void;
}

function abortReason(signal: AbortSignal): unknown {
  return signal.reason ?? new DOMException("Aborted", "AbortError");
}

/** Options for {@linkcode CdpClient.fromBinding}. */
export interface CdpBindingOptions {
  /** Aborts connecting. */
  signal?: AbortSignal;
}

/** A client over a {@linkcode CdpChannel}, and the two calls that feed it. */
export interface ChannelClient {
  /** The client. */
  client: CdpClient;
  /** Hands the client one message from the browser. */
  receive(text: string): void;
  /** Tells the client that the channel closed. */
  end(code: number, reason: string): void;
}

// Assigned in CdpClient's static block, which can reach its #private members.
let newChannelClient: (channel: CdpChannel) => ChannelClient;

/**
 * A client over `channel`: for the relay in this process, which has no
 * WebSocket to offer. Not part of the face (`cdp/mod.ts` leaves it out).
 * @param channel how messages reach the browser
 * @returns the client and the calls that deliver to it
 */
export function channelClient(channel: CdpChannel): ChannelClient {
  return newChannelClient(channel);
}

/**
 * Client for one CDP WebSocket connection (usually the browser endpoint).
 *
 * @example Drive a page in a browser published by an environment
 * ```ts ignore
 * import { connect } from "../mod.ts";
 *
 * await using client = await connect("tcp://127.0.0.1:8765");
 * await using browser = await client.open("browser");
 * await using page = await browser.newPage();
 * await page.navigate("http://127.0.0.1:8080/");
 * console.log(await page.evaluate("document.title"));
 * ```
 */
export class CdpClient implements AsyncDisposable {
  #channel: CdpChannel;
  #nextId = 1;
  #pending = new Map<number, Pending>();
  #handlers = new Map<string, Set<CdpEventHandler>>();
  #closeListeners = new Set<() => void>();
  #closeError: CdpError | undefined;
  #closed: Promise<void>;

  private constructor(channel: CdpChannel, closed: Promise<void>) {
    this.#channel = channel;
    this.#closed = closed;
  }

  static {
    newChannelClient = (channel) => {
      let done!: () => void;
      const client = new CdpClient(channel, new Promise<void>((resolve) => done = resolve));
      return {
        client,
        receive: (text) => client.#onMessage(text),
        end: (code, reason) => {
          client.#onClose(code, reason);
          done();
        },
      };
    };
  }

  /**
   * Opens a WebSocket to `wsUrl` (e.g. `ws://127.0.0.1:9222/devtools/browser/<id>`).
   * Rejects with a `TypeError` if the socket fails to open, or with the signal's reason.
   */
  static async connect(wsUrl: string | URL, options: CdpConnectOptions = {}): Promise<CdpClient> {
    const { signal } = options;
    signal?.throwIfAborted();
    const url = new URL(wsUrl);
    if (url.protocol !== "ws:" && url.protocol !== "wss:") {
      throw new TypeError(`CDP endpoint must be a ws:// or wss:// URL, got ${url.href}`);
    }
    const ws = new WebSocket(url);
    let client: CdpClient | undefined;
    const closed = new Promise<void>((resolve) => {
      ws.addEventListener("close", (ev) => {
        if (client !== undefined) client.#onClose(ev.code, ev.reason);
        resolve();
      }, { once: true });
    });
    return await new Promise<CdpClient>((resolve, reject) => {
      const cleanup = () => {
        signal?.removeEventListener("abort", onAbort);
        ws.removeEventListener("open", onOpen);
        ws.removeEventListener("close", onFail);
      };
      const onOpen = () => {
        cleanup();
        const c = new CdpClient(webSocketChannel(ws), closed);
        ws.addEventListener("message", (ev) => {
          if (typeof ev.data === "string") c.#onMessage(ev.data);
        });
        client = c;
        resolve(c);
      };
      const onFail = (ev: CloseEvent) => {
        cleanup();
        reject(new TypeError(`Failed to open CDP WebSocket ${url.href} (close code ${ev.code})`));
      };
      const onAbort = () => {
        cleanup();
        ws.close();
        // Settle only after the socket is fully closed so no resource leaks.
        closed.then(() => reject(abortReason(signal!)));
      };
      ws.addEventListener("open", onOpen);
      ws.addEventListener("close", onFail);
      signal?.addEventListener("abort", onAbort, { once: true });
    });
  }

  /**
   * Connects to a `cdp/1.3` capability. A url with a path
   * (`ws://host:port/devtools/browser/<id>`) is used as it is; a bare
   * `ws://host:port` is resolved through `/json/version` on that address.
   * @throws {TypeError} when the capability is not `cdp` or cannot be reached
   */
  static async fromBinding(
    capability: Capability,
    options: CdpBindingOptions = {},
  ): Promise<CdpClient> {
    if (capability.family !== "cdp") {
      throw new TypeError(
        `Cannot open binding "${capability.name}": expected a cdp binding, got "${capability.protocol}"`,
      );
    }
    const url = new URL(capability.url);
    const wsUrl = url.pathname === "/" || url.pathname === ""
      ? await discoverBrowserWsUrl(`${url.protocol === "wss:" ? "https" : "http"}://${url.host}`, {
        signal: options.signal,
      })
      : url.href;
    return await CdpClient.connect(wsUrl, { signal: options.signal });
  }

  /** `true` once the socket has closed or {@linkcode close} was called. */
  get isClosed(): boolean {
    return this.#closeError !== undefined || !this.#channel.open;
  }

  /** Resolves when the underlying socket has closed (for any reason). */
  get closed(): Promise<void> {
    return this.#closed;
  }

  /**
   * Sends a command and resolves with its `result` object.
   * Rejects with {@linkcode CdpError} (`kind: "protocol"` or `"closed"`) or the signal's reason.
   */
  send<T extends object = CdpParams>(
    method: string,
    params?: CdpParams,
    options: CdpSendOptions = {},
  ): Promise<T> {
    const { sessionId, signal } = options;
    if (typeof method !== "string" || method === "") {
      return Promise.reject(new TypeError("CDP method must be a non-empty string"));
    }
    if (signal?.aborted) return Promise.reject(abortReason(signal));
    if (this.isClosed) {
      return Promise.reject(
        new CdpError(`Cannot send ${method}: CDP connection is closed`, {
          kind: "closed",
          method,
          cause: this.#closeError,
        }),
      );
    }
    const id = this.#nextId++;
    const message: CdpParams = { id, method, params: params ?? {} };
    if (sessionId !== undefined) message.sessionId = sessionId;
    return new Promise<T>((resolve, reject) => {
      const onAbort = () => {
        this.#pending.delete(id);
        reject(abortReason(signal!));
      };
      this.#pending.set(id, {
        method,
        resolve: (value) => {
          signal?.removeEventListener("abort", onAbort);
          resolve(value as T);
        },
        reject: (reason) => {
          signal?.removeEventListener("abort", onAbort);
          reject(reason);
        },
      });
      signal?.addEventListener("abort", onAbort, { once: true });
      this.#channel.send(JSON.stringify(message));
    });
  }

  /**
   * Subscribes to an event (`"*"` receives every event). Returns an unsubscribe function.
   * Handler exceptions are reported via `reportError` and do not affect other handlers.
   */
  on(method: string, handler: CdpEventHandler): () => void {
    let set = this.#handlers.get(method);
    if (set === undefined) {
      set = new Set();
      this.#handlers.set(method, set);
    }
    // Wrap so the same function can be registered twice and removed independently.
    const entry: CdpEventHandler = (params, event) => handler(params, event);
    set.add(entry);
    return () => {
      const current = this.#handlers.get(method);
      current?.delete(entry);
      if (current?.size === 0) this.#handlers.delete(method);
    };
  }

  /**
   * Async iterator over events (all, or only `methods`). Ends when the client closes or
   * `signal` aborts (abort ends iteration quietly). Events are buffered while not consumed.
   */
  async *events(
    options: { methods?: readonly string[]; sessionId?: string; signal?: AbortSignal } = {},
  ): AsyncGenerator<CdpEvent, void, undefined> {
    const { methods, sessionId, signal } = options;
    const queue: CdpEvent[] = [];
    let wake: (() => void) | undefined;
    let done = false;
    const notify = () => {
      const w = wake;
      wake = undefined;
      w?.();
    };
    const offs = (methods ?? ["*"]).map((m) =>
      this.on(m, (_params, event) => {
        if (sessionId === undefined || event.sessionId === sessionId) {
          queue.push(event);
          notify();
        }
      })
    );
    const stop = () => {
      done = true;
      notify();
    };
    signal?.addEventListener("abort", stop, { once: true });
    this.#closed.then(stop);
    try {
      while (true) {
        const next = queue.shift();
        if (next !== undefined) {
          yield next;
          continue;
        }
        if (done || signal?.aborted || this.isClosed) return;
        await new Promise<void>((resolve) => (wake = resolve));
      }
    } finally {
      for (const off of offs) off();
      signal?.removeEventListener("abort", stop);
    }
  }

  /**
   * Resolves with the params of the next `method` event matching `predicate`.
   * Subscribe *before* triggering the action that emits the event.
   * Rejects with the signal's reason or a `CdpError` (`kind: "closed"`).
   */
  waitFor(
    method: string,
    predicate?: (params: CdpParams, event: CdpEvent) => boolean,
    options: CdpWaitForOptions = {},
  ): Promise<CdpParams> {
    const { sessionId, signal } = options;
    if (signal?.aborted) return Promise.reject(abortReason(signal));
    if (this.isClosed) {
      return Promise.reject(
        new CdpError(`Cannot wait for ${method}: CDP connection is closed`, {
          kind: "closed",
          method,
        }),
      );
    }
    const { promise, resolve, reject } = Promise.withResolvers<CdpParams>();
    const finish = () => {
      off();
      signal?.removeEventListener("abort", onAbort);
      this.#closeListeners.delete(onClose);
    };
    const onAbort = () => {
      finish();
      reject(abortReason(signal!));
    };
    const onClose = () => {
      finish();
      reject(
        new CdpError(`CDP connection closed while waiting for ${method}`, {
          kind: "closed",
          method,
          cause: this.#closeError,
        }),
      );
    };
    const off = this.on(method, (params, event) => {
      if (sessionId !== undefined && event.sessionId !== sessionId) return;
      try {
        if (predicate !== undefined && !predicate(params, event)) return;
        resolve(params);
      } catch (error) {
        reject(error);
      }
      finish();
    });
    signal?.addEventListener("abort", onAbort, { once: true });
    this.#closeListeners.add(onClose);
    return promise;
  }

  /** Returns a {@linkcode CdpSession} view for an already attached flat session. */
  session(sessionId: string, targetId?: string): CdpSession {
    return new CdpSession(this, sessionId, targetId);
  }

  /** Attaches to `targetId` with `flatten: true` and returns the session. */
  async attachToTarget(targetId: string, options: { signal?: AbortSignal } = {}): Promise<
    CdpSession
  > {
    const { sessionId } = await this.send<{ sessionId: string }>(
      "Target.attachToTarget",
      { targetId, flatten: true },
      options,
    );
    return new CdpSession(this, sessionId, targetId);
  }

  /**
   * Creates a new page target in a window of its own (`Target.createTarget`), attaches to it
   * and enables the `Page` and `Runtime` domains. Close it with {@linkcode CdpSession.close}.
   */
  async newPage(
    url = "about:blank",
    options: { signal?: AbortSignal } = {},
  ): Promise<CdpSession> {
    // A window of its own: a background tab of a shared window renders no
    // frames, and a screenshot of it waits until another tab yields.
    const { targetId } = await this.send<{ targetId: string }>(
      "Target.createTarget",
      { url, newWindow: true },
      options,
    );
    try {
      const session = await this.attachToTarget(targetId, options);
      await Promise.all([
        session.send("Page.enable", undefined, options),
        session.send("Page.setLifecycleEventsEnabled", { enabled: true }, options),
        session.send("Runtime.enable", undefined, options),
      ]);
      return session;
    } catch (error) {
      if (!this.isClosed) await this.send("Target.closeTarget", { targetId }).catch(() => {});
      throw error;
    }
  }

  /**
   * Closes the socket (idempotent). Pending calls reject with `CdpError` (`kind: "closed"`).
   * Resolves once the socket is fully closed.
   */
  close(): Promise<void> {
    if (this.#closeError === undefined) {
      this.#failPending(new CdpError("CDP client was closed", { kind: "closed" }));
    }
    if (this.#channel.open) this.#channel.close();
    return this.#closed;
  }

  /** Same as {@linkcode close}. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }

  #onClose(code: number, reason: string) {
    if (this.#closeError === undefined) {
      this.#failPending(
        new CdpError(
          `CDP connection closed (code ${code}${reason ? `, reason: ${reason}` : ""})`,
          { kind: "closed" },
        ),
      );
    }
    const listeners = [...this.#closeListeners];
    this.#closeListeners.clear();
    for (const listener of listeners) listener();
  }

  #failPending(error: CdpError) {
    this.#closeError = error;
    const pending = [...this.#pending.values()];
    this.#pending.clear();
    for (const p of pending) {
      p.reject(
        new CdpError(`${p.method} failed: ${error.message}`, {
          kind: "closed",
          method: p.method,
          cause: error,
        }),
      );
    }
  }

  #onMessage(text: string) {
    let msg: unknown;
    try {
      msg = JSON.parse(text);
    } catch {
      return;
    }
    if (!isObject(msg)) return;
    if (typeof msg.id === "number") {
      const pending = this.#pending.get(msg.id);
      if (pending === undefined) return; // aborted or unknown
      this.#pending.delete(msg.id);
      if (isObject(msg.error)) {
        const code = typeof msg.error.code === "number" ? msg.error.code : undefined;
        const text = typeof msg.error.message === "string" ? msg.error.message : "Unknown error";
        const data = typeof msg.error.data === "string" ? msg.error.data : undefined;
        pending.reject(
          new CdpError(`${pending.method}: ${text}${data ? ` (${data})` : ""} [${code}]`, {
            kind: "protocol",
            code,
            method: pending.method,
            data,
          }),
        );
      } else {
        pending.resolve(isObject(msg.result) ? msg.result : {});
      }
      return;
    }
    if (typeof msg.method === "string") {
      const event: CdpEvent = {
        method: msg.method,
        params: isObject(msg.params) ? msg.params : {},
        sessionId: typeof msg.sessionId === "string" ? msg.sessionId : undefined,
      };
      for (const key of [event.method, "*"]) {
        const set = this.#handlers.get(key);
        if (set === undefined) continue;
        for (const handler of [...set]) {
          try {
            handler(event.params, event);
          } catch (error) {
            reportError(error);
          }
        }
      }
    }
  }
}

/** A flat target session on a {@linkcode CdpClient}. */
export class CdpSession implements AsyncDisposable {
  #client: CdpClient;
  #sessionId: string;
  #targetId: string | undefined;

  /** Wraps an attached session; prefer {@linkcode CdpClient.attachToTarget}. */
  constructor(client: CdpClient, sessionId: string, targetId?: string) {
    this.#client = client;
    this.#sessionId = sessionId;
    this.#targetId = targetId;
  }

  /** The CDP session id. */
  get sessionId(): string {
    return this.#sessionId;
  }

  /** The target id, if known. */
  get targetId(): string | undefined {
    return this.#targetId;
  }

  /** The owning client. */
  get client(): CdpClient {
    return this.#client;
  }

  /** Sends a command to this session. See {@linkcode CdpClient.send}. */
  send<T extends object = CdpParams>(
    method: string,
    params?: CdpParams,
    options: { signal?: AbortSignal } = {},
  ): Promise<T> {
    return this.#client.send<T>(method, params, { ...options, sessionId: this.#sessionId });
  }

  /** Subscribes to events of this session only. Returns an unsubscribe function. */
  on(method: string, handler: CdpEventHandler): () => void {
    return this.#client.on(method, (params, event) => {
      if (event.sessionId === this.#sessionId) handler(params, event);
    });
  }

  /** Waits for an event of this session. See {@linkcode CdpClient.waitFor}. */
  waitFor(
    method: string,
    predicate?: (params: CdpParams, event: CdpEvent) => boolean,
    options: { signal?: AbortSignal } = {},
  ): Promise<CdpParams> {
    return this.#client.waitFor(method, predicate, { ...options, sessionId: this.#sessionId });
  }

  /**
   * Navigates the main frame and waits for its `load` (default) lifecycle event.
   *
   * Uses `Page.lifecycleEvent` matched on the returned `loaderId` instead of bare
   * `Page.loadEventFired`, so a late load event from a previous document cannot be mistaken
   * for this one. Requires `Page.enable` + `Page.setLifecycleEventsEnabled` (done by
   * {@linkcode CdpClient.newPage}). Throws `CdpError` if navigation fails (`errorText`).
   */
  navigate(url: string, options: CdpNavigateOptions = {}): Promise<CdpNavigateResult> {
    return navigatePage(this, url, options);
  }

  /**
   * Evaluates `expression` in the page (`Runtime.evaluate`, `returnByValue`, `awaitPromise`)
   * and returns the JSON value. A thrown exception becomes `CdpError` with
   * `kind: "exception"`; values that cannot be serialized come back as `undefined`.
   */
  evaluate<T = unknown>(
    expression: string,
    options: { signal?: AbortSignal; awaitPromise?: boolean } = {},
  ): Promise<T> {
    return evaluateInPage<T>(this, expression, options);
  }

  /** Captures a PNG screenshot (`Page.captureScreenshot`) and returns its bytes. */
  screenshot(
    options: { signal?: AbortSignal; fullPage?: boolean } = {},
  ): Promise<Uint8Array<ArrayBuffer>> {
    return screenshotPage(this, options);
  }

  /** Closes the target (`Target.closeTarget`); no-op if the client is already closed. */
  async close(options: { signal?: AbortSignal } = {}): Promise<void> {
    if (this.#client.isClosed) return;
    if (this.#targetId !== undefined) {
      await this.#client.send("Target.closeTarget", { targetId: this.#targetId }, options);
    } else {
      await this.#client.send("Target.detachFromTarget", { sessionId: this.#sessionId }, options);
    }
  }

  /** Same as {@linkcode close}, ignoring errors. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.close().catch(() => {});
  }
}
