/**
 * An MCP client for the streamable HTTP transport: JSON-RPC over `POST`,
 * replies as JSON or as a `text/event-stream`, the `Mcp-Session-Id` the
 * server hands out, and the protocol version negotiated at `initialize`.
 *
 * @module
 */

import type { Capability } from "../capability.ts";
import { isRecord } from "../_internal/util.ts";
import { Deadline } from "../_internal/async.ts";
import { sseData } from "../_internal/sse.ts";
import { BodyTooLargeError, cappedBody, headText, readCapped } from "../_internal/body.ts";

/** Default of {@linkcode McpClientOptions.maxResponseBytes}. */
const MAX_RESPONSE_BYTES = 16 << 20;

/** Protocol versions this package speaks, newest first. */
export const MCP_PROTOCOL_VERSIONS: readonly string[] = ["2025-11-25", "2025-06-18"];

/** A tool an MCP server offers. */
export interface McpToolInfo {
  /** The tool's name. */
  name: string;
  /** What it does. */
  description?: string;
  /** JSON Schema of its arguments. */
  inputSchema: Record<string, unknown>;
}

/** The result of `tools/call`. */
export interface McpToolResult {
  /** Content blocks (`{ type: "text", text }`...). */
  content: Record<string, unknown>[];
  /** Whether the tool failed. */
  isError: boolean;
  /** Structured output, when the tool gave one. */
  structuredContent?: unknown;
}

/** An error reply from an MCP server. */
export class McpError extends Error {
  /** The JSON-RPC error code, or the HTTP status for a transport error. */
  readonly code: number;
  /** Makes the error. */
  constructor(message: string, code: number, options?: ErrorOptions) {
    super(message, options);
    this.name = "McpError";
    this.code = code;
  }
}

/** Options for {@linkcode McpClient.connect}. */
export interface McpClientOptions {
  /** Bearer token for the server. */
  authToken?: string;
  /** Aborts connecting and every later request. */
  signal?: AbortSignal;
  /**
   * The version to offer first.
   * @default "2025-11-25"
   */
  protocolVersion?: string;
  /** The name this client gives at `initialize`. @default "hud-sdk" */
  clientName?: string;
  /**
   * The most bytes one reply may take (a JSON body, or the whole event
   * stream of one request); past it the reply is cut off as it arrives and
   * the request fails, so that a server cannot make this process buffer
   * without end.
   * @default 16 MiB
   */
  maxResponseBytes?: number;
}

/**
 * Options for {@linkcode McpClient.fromBinding}: those of
 * {@linkcode McpClient.connect} but the token, which the binding carries.
 */
export type McpBindingOptions = Omit<McpClientOptions, "authToken">;

/**
 * A connected MCP session over streamable HTTP.
 *
 * @example
 * ```ts ignore
 * await using mcp = await McpClient.connect("http://127.0.0.1:8000/mcp");
 * const tools = await mcp.listTools();
 * const result = await mcp.callTool("add", { a: 2, b: 3 });
 * ```
 */
export class McpClient implements AsyncDisposable {
  readonly #url: string;
  readonly #headers: Record<string, string>;
  readonly #signal: AbortSignal | undefined;
  readonly #maxResponse: number;
  #sessionId: string | null = null;
  #protocolVersion = "";
  #serverInfo: Record<string, unknown> = {};
  #nextId = 1;
  #closed = false;

  private constructor(url: string, options: McpClientOptions) {
    this.#url = url;
    this.#signal = options.signal;
    this.#maxResponse = options.maxResponseBytes ?? MAX_RESPONSE_BYTES;
    this.#headers = {
      "content-type": "application/json",
      accept: "application/json, text/event-stream",
      ...(options.authToken ? { authorization: `Bearer ${options.authToken}` } : {}),
    };
  }

  /**
   * Connects: `initialize`, then `notifications/initialized`.
   * @param url the server's endpoint (`http://host:port/mcp`)
   * @throws {McpError} when the server refuses or offers no version we speak
   * @throws {TypeError} for a url that is not http(s)
   * @throws {RangeError} for a `maxResponseBytes` that is not a positive integer
   */
  static async connect(url: string, options: McpClientOptions = {}): Promise<McpClient> {
    const max = options.maxResponseBytes;
    if (max !== undefined && (!Number.isSafeInteger(max) || max <= 0)) {
      throw new RangeError(
        `Cannot connect to MCP server: maxResponseBytes must be a positive integer, got "${max}"`,
      );
    }
    let parsed: URL;
    try {
      parsed = new URL(url);
    } catch {
      throw new TypeError(`Cannot connect to MCP server: bad url "${url}"`);
    }
    if (parsed.protocol !== "http:" && parsed.protocol !== "https:") {
      throw new TypeError(
        `Cannot connect to MCP server "${url}": only http(s) (streamable HTTP) is supported`,
      );
    }
    const client = new McpClient(parsed.href, options);
    const offered = options.protocolVersion ?? MCP_PROTOCOL_VERSIONS[0];
    const result = await client.request("initialize", {
      protocolVersion: offered,
      capabilities: {},
      clientInfo: { name: options.clientName ?? "hud-sdk", version: "0.1.0" },
    });
    const version = String(result.protocolVersion ?? "");
    if (!MCP_PROTOCOL_VERSIONS.includes(version)) {
      await client.close();
      throw new McpError(
        `Cannot connect to MCP server "${url}": it speaks protocol "${version}", we speak ${
          MCP_PROTOCOL_VERSIONS.map((v) => `"${v}"`).join(", ")
        }`,
        -32602,
      );
    }
    client.#protocolVersion = version;
    client.#serverInfo = isRecord(result.serverInfo) ? result.serverInfo : {};
    await client.notify("notifications/initialized");
    return client;
  }

  /**
   * An MCP client for a `mcp` capability (its url already pointing at the
   * local forwarder when it comes from `HudClient.binding()`).
   * @throws {TypeError} when the capability is not a streamable HTTP MCP server
   */
  static fromBinding(
    capability: Capability,
    options: McpBindingOptions = {},
  ): Promise<McpClient> {
    if (capability.family !== "mcp") {
      throw new TypeError(
        `Cannot open binding "${capability.name}": expected an mcp binding, got "${capability.protocol}"`,
      );
    }
    const token = capability.params.auth_token;
    return McpClient.connect(capability.url, {
      ...options,
      authToken: typeof token === "string" ? token : undefined,
    });
  }

  /** The negotiated protocol version. */
  get protocolVersion(): string {
    return this.#protocolVersion;
  }
  /** The session id the server gave, if any. */
  get sessionId(): string | null {
    return this.#sessionId;
  }
  /** The server's `serverInfo`. */
  get serverInfo(): Record<string, unknown> {
    return this.#serverInfo;
  }

  #requestHeaders(): Record<string, string> {
    const h = { ...this.#headers };
    if (this.#sessionId) h["mcp-session-id"] = this.#sessionId;
    if (this.#protocolVersion) h["mcp-protocol-version"] = this.#protocolVersion;
    return h;
  }

  #signalFor(signal?: AbortSignal): AbortSignal | undefined {
    const all = [signal, this.#signal].filter((s): s is AbortSignal => s !== undefined);
    return all.length === 0 ? undefined : all.length === 1 ? all[0] : AbortSignal.any(all);
  }

  /**
   * Sends one request and returns its result.
   * @throws {McpError} for an error reply or an HTTP error
   */
  async request(
    method: string,
    params: Record<string, unknown> = {},
    signal?: AbortSignal,
  ): Promise<Record<string, unknown>> {
    if (this.#closed) throw new McpError(`Cannot call "${method}": the MCP client is closed`, -1);
    const id = this.#nextId++;
    const response = await fetch(this.#url, {
      method: "POST",
      headers: this.#requestHeaders(),
      body: JSON.stringify({ jsonrpc: "2.0", id, method, params }),
      signal: this.#signalFor(signal),
    });
    const session = response.headers.get("mcp-session-id");
    if (session && method === "initialize") this.#sessionId = session;
    if (!response.ok) {
      const text = await headText(response.body, 300);
      throw new McpError(
        `MCP "${method}" failed: HTTP ${response.status}${text ? `: ${text}` : ""}`,
        response.status,
      );
    }
    let reply: unknown;
    try {
      reply = await this.#readReply(response, id, `the reply to "${method}"`);
    } catch (err) {
      if (err instanceof BodyTooLargeError) {
        throw new McpError(
          `MCP "${method}" failed: ${err.message} (maxResponseBytes)`,
          -32603,
          { cause: err },
        );
      }
      throw err;
    }
    if (!isRecord(reply)) {
      throw new McpError(`MCP "${method}" failed: no reply to request ${id}`, -32603);
    }
    if (isRecord(reply.error)) {
      throw new McpError(
        `MCP "${method}" failed: ${reply.error.message ?? "error"}`,
        Number(reply.error.code ?? -32603),
      );
    }
    return isRecord(reply.result) ? reply.result : {};
  }

  /**
   * The reply to request `id`: a JSON body, or the message of an event
   * stream that answers it; `undefined` for a body that is not JSON.
   * @throws {BodyTooLargeError} past `maxResponseBytes`
   */
  async #readReply(response: Response, id: number, what: string): Promise<unknown> {
    const type = response.headers.get("content-type") ?? "";
    if (!type.includes("text/event-stream")) {
      const bytes = await readCapped(response.body, this.#maxResponse, what);
      try {
        return JSON.parse(new TextDecoder().decode(bytes));
      } catch {
        return undefined;
      }
    }
    const events = cappedBody(response.body!, this.#maxResponse, what);
    for await (const { data } of sseData(events, { dropUnterminated: true })) {
      const message = JSON.parse(data);
      // Server requests and notifications may come first; the reply ends it.
      if (isRecord(message) && message.id === id && ("result" in message || "error" in message)) {
        return message;
      }
    }
    return undefined;
  }

  /** Sends a notification (no reply). */
  async notify(method: string, params?: Record<string, unknown>): Promise<void> {
    const response = await fetch(this.#url, {
      method: "POST",
      headers: this.#requestHeaders(),
      body: JSON.stringify({ jsonrpc: "2.0", method, ...(params ? { params } : {}) }),
      signal: this.#signalFor(),
    });
    await response.body?.cancel();
    if (!response.ok) {
      throw new McpError(
        `MCP notification "${method}" failed: HTTP ${response.status}`,
        response.status,
      );
    }
  }

  /** Every tool the server offers (following `nextCursor`). */
  async listTools(signal?: AbortSignal): Promise<McpToolInfo[]> {
    const tools: McpToolInfo[] = [];
    let cursor: string | undefined;
    do {
      const result = await this.request("tools/list", cursor ? { cursor } : {}, signal);
      for (const t of Array.isArray(result.tools) ? result.tools : []) {
        if (!isRecord(t) || typeof t.name !== "string") continue;
        tools.push({
          name: t.name,
          ...(typeof t.description === "string" ? { description: t.description } : {}),
          inputSchema: isRecord(t.inputSchema) ? t.inputSchema : { type: "object" },
        });
      }
      cursor = typeof result.nextCursor === "string" ? result.nextCursor : undefined;
    } while (cursor);
    return tools;
  }

  /** Calls a tool. A tool's own failure comes back with `isError`, not thrown. */
  async callTool(
    name: string,
    args: Record<string, unknown>,
    signal?: AbortSignal,
  ): Promise<McpToolResult> {
    const result = await this.request("tools/call", { name, arguments: args }, signal);
    const out: McpToolResult = {
      content: Array.isArray(result.content) ? result.content.filter(isRecord) : [],
      isError: result.isError === true,
    };
    if (result.structuredContent !== undefined) out.structuredContent = result.structuredContent;
    return out;
  }

  /** Ends the session (a `DELETE`, best effort). */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    if (this.#sessionId === null) return;
    using bound = new Deadline(2_000, undefined, "MCP session close");
    try {
      const r = await fetch(this.#url, {
        method: "DELETE",
        headers: this.#requestHeaders(),
        signal: bound.signal,
      });
      await r.body?.cancel();
    } catch {
      // The server may be gone already.
    }
  }

  /** Same as {@linkcode McpClient.close}. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}

/** The text of a tool result's content blocks. */
export function resultText(result: McpToolResult): string {
  const parts = result.content.map((b) =>
    b.type === "text" && typeof b.text === "string" ? b.text : JSON.stringify(b)
  );
  if (parts.length === 0 && result.structuredContent !== undefined) {
    return JSON.stringify(result.structuredContent);
  }
  return parts.join("\n");
}
