/**
 * The environment side of MCP: {@linkcode addMcpServer} serves typed tools
 * over the streamable HTTP transport with `Deno.serve` and publishes an
 * `mcp` capability, so that authors give agents tools without writing a
 * server.
 *
 * @module
 */

import { Capability } from "../capability.ts";
import type { Environment } from "../env.ts";
import { type ArgsShape, type InferArgs, type JsonSchema, shapeToJsonSchema } from "../schema.ts";
import { errorMessage, isRecord } from "../_internal/util.ts";
import { formatHost, isLoopback } from "../_internal/net.ts";
import { MCP_PROTOCOL_VERSIONS } from "./client.ts";
import { bearerToken, generateToken, tokenProblem, TokenVerifier } from "../_internal/auth.ts";
import { BodyTooLargeError, formatBytes, readCapped } from "../_internal/body.ts";

/** A tool an MCP server serves. */
export interface McpTool {
  /** The tool's name: letters, digits, `_`, `-` and `.`. */
  readonly name: string;
  /** What it does. */
  readonly description: string;
  /** JSON Schema of its arguments. */
  readonly inputSchema: JsonSchema;
  /** Runs the tool on raw arguments; throws for bad arguments or a failure. */
  call(args: Record<string, unknown>): Promise<unknown>;
}

/** What {@linkcode mcpTool} takes. */
export interface McpToolDefinition<S extends ArgsShape> {
  /** The tool's name. */
  name: string;
  /** What it does. */
  description?: string;
  /** Its arguments, as schema.ts builders. */
  args: S;
  /** Runs the tool on checked arguments; a string is sent as text, anything else as JSON. */
  run(args: InferArgs<S>): unknown;
}

/**
 * Coerces and checks `input` against `shape`: defaults filled in, unknown
 * and missing arguments refused.
 * @throws {TypeError} naming the first bad argument
 */
export function checkArgs(
  shape: ArgsShape,
  input: Record<string, unknown>,
): Record<string, unknown> {
  const checked: Record<string, unknown> = {};
  for (const [key, schema] of Object.entries(shape)) {
    if (input[key] === undefined) {
      if (schema.hasDefault) checked[key] = schema.defaultValue;
      else if (!schema.optional) throw new TypeError(`missing argument "${key}"`);
      continue;
    }
    const value = schema.coerce(input[key]);
    if (!schema.accepts(value)) {
      throw new TypeError(
        `argument "${key}" must be ${schema.kind}, got ${JSON.stringify(input[key])}`,
      );
    }
    checked[key] = value;
  }
  const extra = Object.keys(input).filter((k) => !(k in shape));
  if (extra.length > 0) throw new TypeError(`unknown argument "${extra[0]}"`);
  return checked;
}

const TOOL_NAME = /^[A-Za-z0-9_.-]{1,128}$/;

/**
 * Makes a typed MCP tool.
 * @throws {TypeError} for a bad name or a missing function
 */
export function mcpTool<S extends ArgsShape>(definition: McpToolDefinition<S>): McpTool {
  const { name, description, args, run } = definition ?? {};
  if (typeof name !== "string" || !TOOL_NAME.test(name)) {
    throw new TypeError(`Cannot define MCP tool: bad name "${name}"`);
  }
  if (typeof run !== "function") {
    throw new TypeError(`Cannot define MCP tool "${name}": run must be a function`);
  }
  const shape = args ?? ({} as S);
  return {
    name,
    description: description ?? "",
    inputSchema: shapeToJsonSchema(shape, false),
    async call(input) {
      return await run(checkArgs(shape, input) as InferArgs<S>);
    },
  };
}

/** Options for {@linkcode mcpHandler} and {@linkcode addMcpServer}. */
export interface McpServerOptions {
  /** The tools to serve. */
  tools: McpTool[];
  /** The server's name in `serverInfo`. @default "hud-sdk" */
  serverName?: string;
  /**
   * How replies to requests are sent: `json` bodies, or `sse` (a
   * `text/event-stream` with the one reply) when the client accepts it.
   * @default "json"
   */
  replies?: "json" | "sse";
  /**
   * The bearer token every request must carry (`Authorization: Bearer
   * TOKEN`), compared in constant time; others get 401 before their body is
   * read. {@linkcode addMcpServer} makes a 256-bit one when none is given
   * and publishes it in the capability's `auth_token`.
   * @default none for {@linkcode mcpHandler} (every request is served), a fresh one for {@linkcode addMcpServer}
   */
  authToken?: string;
  /**
   * Host names (without port) accepted in the `Host` header, and in an
   * `Origin` header when one is sent, besides loopback names (`localhost`,
   * 127.0.0.0/8, `[::1]`); anything else gets 403, so that a web page cannot
   * reach the server by rebinding its own name to this address.
   * @default [] (and, for {@linkcode addMcpServer}, the `hostname` it listens on)
   */
  allowedHosts?: string[];
  /**
   * Further `Origin` values accepted, whole (`https://app.example`), for
   * browser clients served from another host.
   * @default []
   */
  allowedOrigins?: string[];
  /**
   * The largest request body, in bytes; a longer one is refused with 413 as
   * its bytes arrive, never read whole.
   * @default 4 MiB
   */
  maxBodyBytes?: number;
}

interface JsonRpcMessage {
  jsonrpc?: string;
  id?: string | number | null;
  method?: string;
  params?: Record<string, unknown>;
}

function rpcError(id: unknown, code: number, message: string): Record<string, unknown> {
  return { jsonrpc: "2.0", id: id ?? null, error: { code, message } };
}

/** Default of {@linkcode McpServerOptions.maxBodyBytes}. */
const MAX_BODY_BYTES = 4 << 20;

/** The host name of a `Host` header value (`[::1]:80` gives `[::1]`), lowercased. */
function hostOfHeader(value: string): string {
  const v = value.trim().toLowerCase();
  if (v.startsWith("[")) {
    const end = v.indexOf("]");
    return end < 0 ? v : v.slice(0, end + 1);
  }
  const colon = v.indexOf(":");
  return colon < 0 ? v : v.slice(0, colon);
}

/** A host name as a `Host` header spells it: IPv6 in brackets, lowercased. */
function hostForm(hostname: string): string {
  return formatHost(hostname.toLowerCase());
}

/**
 * The request handler of a streamable HTTP MCP server (for `Deno.serve`).
 * It checks, in this order, the `Host` and `Origin` headers (403), the
 * bearer token when one is set (401), and the body's size (413), before it
 * parses anything.
 * @throws {TypeError} for tool names that clash or a bad token
 * @throws {RangeError} for a `maxBodyBytes` that is not a positive integer
 */
export function mcpHandler(options: McpServerOptions): (request: Request) => Promise<Response> {
  const server = new McpHttpServer(mcpConfig(options));
  return (request) => server.handle(request);
}

/** {@linkcode McpServerOptions} checked, with every default resolved. */
interface McpConfig {
  readonly tools: ReadonlyMap<string, McpTool>;
  readonly serverName: string;
  readonly replies: "json" | "sse" | undefined;
  readonly verifier: TokenVerifier | null;
  /** Allowed hosts besides loopback, as a `Host` header spells them. */
  readonly hosts: ReadonlySet<string>;
  readonly origins: ReadonlySet<string>;
  readonly maxBodyBytes: number;
}

/**
 * Checks `options` and resolves every default, once.
 * @throws {TypeError} for tool names that clash or a bad token
 * @throws {RangeError} for a `maxBodyBytes` that is not a positive integer
 */
function mcpConfig(options: McpServerOptions): McpConfig {
  const tools = new Map<string, McpTool>();
  for (const t of options.tools ?? []) {
    if (tools.has(t.name)) {
      throw new TypeError(`Cannot serve MCP tools: "${t.name}" is given twice`);
    }
    tools.set(t.name, t);
  }
  const maxBodyBytes = options.maxBodyBytes ?? MAX_BODY_BYTES;
  if (!Number.isSafeInteger(maxBodyBytes) || maxBodyBytes <= 0) {
    throw new RangeError(
      `Cannot serve MCP tools: maxBodyBytes must be a positive integer, got "${maxBodyBytes}"`,
    );
  }
  let verifier: TokenVerifier | null = null;
  if (options.authToken !== undefined) {
    const problem = tokenProblem(options.authToken);
    if (problem !== null) throw new TypeError(`Cannot serve MCP tools: ${problem}`);
    verifier = new TokenVerifier(options.authToken);
  }
  return {
    tools,
    serverName: options.serverName ?? "hud-sdk",
    replies: options.replies,
    verifier,
    hosts: new Set((options.allowedHosts ?? []).map(hostForm)),
    origins: new Set(options.allowedOrigins ?? []),
    maxBodyBytes,
  };
}

/** What a method gives: a result (and a new session), or an error code and message. */
type Outcome =
  | { result: Record<string, unknown>; session?: string }
  | { error: readonly [number, string] };

/**
 * One streamable HTTP MCP server: the checks of each request (headers,
 * token, body, session) and the JSON-RPC methods, over the sessions it
 * opened.
 */
class McpHttpServer {
  readonly #config: McpConfig;
  /** Open sessions: id to protocol version. */
  readonly #sessions = new Map<string, string>();

  constructor(config: McpConfig) {
    this.#config = config;
  }

  /** Answers one HTTP request. */
  async handle(request: Request): Promise<Response> {
    const refused = this.#foreign(request);
    if (refused !== null) return new Response(`${refused}\n`, { status: 403 });
    if (this.#unauthorized(request)) {
      return Response.json(
        { error: "invalid_token", error_description: "Unauthorized: a bearer token is required" },
        { status: 401, headers: { "www-authenticate": 'Bearer error="invalid_token"' } },
      );
    }
    if (request.method === "DELETE") {
      const id = request.headers.get("mcp-session-id");
      if (id === null || !this.#sessions.delete(id)) return new Response(null, { status: 404 });
      return new Response(null, { status: 200 });
    }
    if (request.method !== "POST") {
      return new Response("Method not allowed: this server does not stream on GET", {
        status: 405,
        headers: { allow: "POST, DELETE" },
      });
    }
    const msg = await this.#readMessage(request);
    if (msg instanceof Response) return msg;
    const badSession = this.#checkSession(request, msg);
    if (badSession !== null) return badSession;
    if (msg.id === undefined) return new Response(null, { status: 202 }); // a notification
    return this.#reply(request, msg, await this.#dispatch(msg));
  }

  /** Why the request's Host or Origin is refused, or `null`. */
  #foreign(request: Request): string | null {
    if (!this.#allowedHost(hostOfHeader(request.headers.get("host") ?? ""))) {
      return "Forbidden: unexpected Host header";
    }
    const origin = request.headers.get("origin");
    if (origin === null || this.#config.origins.has(origin)) return null;
    let host: string;
    try {
      host = hostForm(new URL(origin).hostname);
    } catch {
      return "Forbidden: unexpected Origin header";
    }
    return this.#allowedHost(host) ? null : "Forbidden: unexpected Origin header";
  }

  #allowedHost(host: string): boolean {
    return isLoopback(host) || this.#config.hosts.has(host);
  }

  #unauthorized(request: Request): boolean {
    const verifier = this.#config.verifier;
    if (verifier === null) return false;
    return !verifier.verify(bearerToken(request.headers.get("authorization")));
  }

  /** The body as one JSON-RPC message, or the response that refuses it. */
  async #readMessage(request: Request): Promise<JsonRpcMessage | Response> {
    const maxBody = this.#config.maxBodyBytes;
    const tooLarge = () =>
      Response.json(
        rpcError(null, -32600, `Invalid request: the body is over ${formatBytes(maxBody)}`),
        { status: 413 },
      );
    const declared = Number(request.headers.get("content-length") ?? "0");
    if (declared > maxBody) return tooLarge();
    let msg: JsonRpcMessage;
    try {
      const bytes = await readCapped(request.body, maxBody, "the request body");
      msg = JSON.parse(new TextDecoder().decode(bytes));
    } catch (err) {
      if (err instanceof BodyTooLargeError) return tooLarge();
      return Response.json(rpcError(null, -32700, "Parse error"), { status: 400 });
    }
    if (!isRecord(msg) || typeof msg.method !== "string") {
      return Response.json(
        rpcError(null, -32600, "Invalid request: expected one JSON-RPC message"),
        { status: 400 },
      );
    }
    return msg;
  }

  /** Past `initialize`, a message needs an open session and a known protocol version. */
  #checkSession(request: Request, msg: JsonRpcMessage): Response | null {
    if (msg.method === "initialize") return null;
    const session = request.headers.get("mcp-session-id");
    if (session === null) {
      return Response.json(rpcError(msg.id, -32000, "Bad request: missing Mcp-Session-Id"), {
        status: 400,
      });
    }
    if (!this.#sessions.has(session)) {
      return Response.json(rpcError(msg.id, -32001, "Session not found"), { status: 404 });
    }
    const version = request.headers.get("mcp-protocol-version");
    if (version !== null && !MCP_PROTOCOL_VERSIONS.includes(version)) {
      return Response.json(
        rpcError(msg.id, -32000, `Bad request: unsupported protocol version "${version}"`),
        { status: 400 },
      );
    }
    return null;
  }

  /** The method's outcome as a JSON-RPC reply, in JSON or (when asked and accepted) SSE. */
  #reply(request: Request, msg: JsonRpcMessage, out: Outcome): Response {
    const reply = "error" in out
      ? rpcError(msg.id, out.error[0], out.error[1])
      : { jsonrpc: "2.0", id: msg.id, result: out.result };
    const headers: Record<string, string> = {};
    if ("session" in out && out.session) headers["mcp-session-id"] = out.session;
    const accept = request.headers.get("accept") ?? "";
    if (this.#config.replies === "sse" && accept.includes("text/event-stream")) {
      headers["content-type"] = "text/event-stream";
      headers["cache-control"] = "no-cache";
      return new Response(`event: message\ndata: ${JSON.stringify(reply)}\n\n`, { headers });
    }
    return Response.json(reply, { headers });
  }

  /** Runs one JSON-RPC method. */
  async #dispatch(msg: JsonRpcMessage): Promise<Outcome> {
    const params = isRecord(msg.params) ? msg.params : {};
    switch (msg.method) {
      case "initialize":
        return this.#initialize(params);
      case "ping":
        return { result: {} };
      case "tools/list":
        return { result: { tools: [...this.#config.tools.values()].map(toolInfo) } };
      case "tools/call":
        return await this.#callTool(params);
      default:
        return { error: [-32601, `Method not found: "${msg.method}"`] };
    }
  }

  /** Opens a session in the version the client asked for, else the newest known. */
  #initialize(params: Record<string, unknown>): Outcome {
    const asked = String(params.protocolVersion ?? "");
    const version = MCP_PROTOCOL_VERSIONS.includes(asked) ? asked : MCP_PROTOCOL_VERSIONS[0];
    const id = crypto.randomUUID();
    this.#sessions.set(id, version);
    return {
      session: id,
      result: {
        protocolVersion: version,
        capabilities: { tools: { listChanged: false } },
        serverInfo: { name: this.#config.serverName, version: "0.1.0" },
      },
    };
  }

  /** Runs a tool: its value as text (and structured, for an object), a failure as an error result. */
  async #callTool(params: Record<string, unknown>): Promise<Outcome> {
    const tool = this.#config.tools.get(String(params.name));
    if (!tool) return { error: [-32602, `Unknown tool: "${params.name}"`] };
    const args = isRecord(params.arguments) ? params.arguments : {};
    try {
      const value = await tool.call(args);
      const text = typeof value === "string" ? value : JSON.stringify(value ?? null);
      return {
        result: {
          content: [{ type: "text", text }],
          ...(isRecord(value) ? { structuredContent: value } : {}),
          isError: false,
        },
      };
    } catch (err) {
      return { result: { content: [{ type: "text", text: errorMessage(err) }], isError: true } };
    }
  }
}

/** A tool as `tools/list` lists it. */
function toolInfo(t: McpTool): Record<string, unknown> {
  return { name: t.name, description: t.description, inputSchema: t.inputSchema };
}

/** Options for {@linkcode addMcpServer}. */
export interface AddMcpServerOptions extends McpServerOptions {
  /**
   * The capability's name.
   * @default "tools"
   */
  name?: string;
  /**
   * Interface to listen on.
   * @default "127.0.0.1"
   */
  hostname?: string;
}

/**
 * Serves `tools` over streamable HTTP while `env` runs, and publishes them
 * as an `mcp` capability (`http://host:port/mcp`) whose `auth_token` is the
 * bearer token the server requires: only clients given the manifest (over
 * the authenticated control channel) can call the tools.
 *
 * @example
 * ```ts
 * import { Environment } from "../env.ts";
 * import { integer } from "../schema.ts";
 * import { McpClient, resultText } from "./client.ts";
 * import { addMcpServer, mcpTool } from "./server.ts";
 * import assert from "node:assert/strict";
 *
 * const env = new Environment("calc");
 * addMcpServer(env, {
 *   tools: [mcpTool({ name: "add", args: { a: integer(), b: integer() }, run: ({ a, b }) => a + b })],
 * });
 * await env.start();
 * try {
 *   await using mcp = await McpClient.fromBinding(env.capability("tools")!);
 *   assert.equal(resultText(await mcp.callTool("add", { a: 2, b: 3 })), "5");
 * } finally {
 *   await env.stop();
 * }
 * ```
 *
 * @throws {TypeError} for tool names that clash, a bad token, or the old `capability` option
 * @throws {RangeError} for a `maxBodyBytes` that is not a positive integer
 */
export function addMcpServer(env: Environment, options: AddMcpServerOptions): void {
  if (isRecord(options) && "capability" in options) {
    throw new TypeError(
      'Cannot add MCP server: the "capability" option is now "name" (the capability\'s name)',
    );
  }
  const hostname = options.hostname ?? "127.0.0.1";
  const authToken = options.authToken ?? generateToken();
  const listening = hostForm(hostname);
  const wildcard = listening === "0.0.0.0" || listening === "[::]";
  const handler = mcpHandler({
    ...options,
    authToken,
    allowedHosts: [...(options.allowedHosts ?? []), ...(wildcard ? [] : [listening])],
  });
  const name = options.name ?? "tools";
  let server: Deno.HttpServer<Deno.NetAddr> | null = null;
  env.initialize(() => {
    server = Deno.serve({ hostname, port: 0, onListen: () => {} }, (request) => {
      const path = new URL(request.url).pathname;
      if (path !== "/mcp") {
        return new Response("Not found: the MCP endpoint is /mcp", { status: 404 });
      }
      return handler(request);
    });
    const addr = server.addr;
    env.addCapability(Capability.mcp({
      name,
      url: `http://${formatHost(addr.hostname)}:${addr.port}/mcp`,
      transport: "streamable-http",
      authToken,
    }));
  });
  env.shutdown(async () => {
    const s = server;
    server = null;
    if (s === null) return;
    env.removeCapability(name);
    await s.shutdown();
  });
}
