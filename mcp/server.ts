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
import { isRecord } from "../_internal/util.ts";
import { formatHost } from "../_internal/net.ts";
import { MCP_PROTOCOL_VERSIONS } from "./client.ts";

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

/** Options for {@linkcode serveMcp} and {@linkcode addMcpServer}. */
export interface McpServerOptions {
  /** The tools to serve. */
  tools: McpTool[];
  /** The server's name in `serverInfo`. @default "hud-sdk" */
  name?: string;
  /**
   * How replies to requests are sent: `json` bodies, or `sse` (a
   * `text/event-stream` with the one reply) when the client accepts it.
   * @default "json"
   */
  replies?: "json" | "sse";
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

/**
 * The request handler of a streamable HTTP MCP server (for `Deno.serve`).
 * @throws {TypeError} for tool names that clash
 */
export function serveMcp(options: McpServerOptions): (request: Request) => Promise<Response> {
  const tools = new Map<string, McpTool>();
  for (const t of options.tools ?? []) {
    if (tools.has(t.name)) {
      throw new TypeError(`Cannot serve MCP tools: "${t.name}" is given twice`);
    }
    tools.set(t.name, t);
  }
  const sessions = new Map<string, string>();
  const serverInfo = { name: options.name ?? "hud-sdk", version: "0.1.0" };

  const handle = async (msg: JsonRpcMessage, session: string | null) => {
    const params = isRecord(msg.params) ? msg.params : {};
    switch (msg.method) {
      case "initialize": {
        const asked = String(params.protocolVersion ?? "");
        const version = MCP_PROTOCOL_VERSIONS.includes(asked) ? asked : MCP_PROTOCOL_VERSIONS[0];
        const id = crypto.randomUUID();
        sessions.set(id, version);
        return {
          session: id,
          result: {
            protocolVersion: version,
            capabilities: { tools: { listChanged: false } },
            serverInfo,
          },
        };
      }
      case "ping":
        return { result: {} };
      case "tools/list":
        return {
          result: {
            tools: [...tools.values()].map((t) => ({
              name: t.name,
              description: t.description,
              inputSchema: t.inputSchema,
            })),
          },
        };
      case "tools/call": {
        const tool = tools.get(String(params.name));
        if (!tool) return { error: [-32602, `Unknown tool: "${params.name}"`] as const };
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
          return {
            result: {
              content: [{ type: "text", text: String((err as Error)?.message ?? err) }],
              isError: true,
            },
          };
        }
      }
      default:
        void session;
        return { error: [-32601, `Method not found: "${msg.method}"`] as const };
    }
  };

  return async (request) => {
    if (request.method === "DELETE") {
      const id = request.headers.get("mcp-session-id");
      if (id === null || !sessions.delete(id)) return new Response(null, { status: 404 });
      return new Response(null, { status: 200 });
    }
    if (request.method !== "POST") {
      return new Response("Method not allowed: this server does not stream on GET", {
        status: 405,
        headers: { allow: "POST, DELETE" },
      });
    }
    let msg: JsonRpcMessage;
    try {
      msg = await request.json();
    } catch {
      return Response.json(rpcError(null, -32700, "Parse error"), { status: 400 });
    }
    if (!isRecord(msg) || typeof msg.method !== "string") {
      return Response.json(
        rpcError(null, -32600, "Invalid request: expected one JSON-RPC message"),
        {
          status: 400,
        },
      );
    }
    let session: string | null = null;
    if (msg.method !== "initialize") {
      session = request.headers.get("mcp-session-id");
      if (session === null) {
        return Response.json(rpcError(msg.id, -32000, "Bad request: missing Mcp-Session-Id"), {
          status: 400,
        });
      }
      if (!sessions.has(session)) {
        return Response.json(rpcError(msg.id, -32001, "Session not found"), { status: 404 });
      }
      const version = request.headers.get("mcp-protocol-version");
      if (version !== null && !MCP_PROTOCOL_VERSIONS.includes(version)) {
        return Response.json(
          rpcError(msg.id, -32000, `Bad request: unsupported protocol version "${version}"`),
          { status: 400 },
        );
      }
    }
    if (msg.id === undefined) return new Response(null, { status: 202 }); // a notification
    const out = await handle(msg, session);
    const reply = "error" in out && out.error
      ? rpcError(msg.id, out.error[0], out.error[1])
      : { jsonrpc: "2.0", id: msg.id, result: out.result };
    const headers: Record<string, string> = {};
    if ("session" in out && out.session) headers["mcp-session-id"] = out.session;
    const accept = request.headers.get("accept") ?? "";
    if (options.replies === "sse" && accept.includes("text/event-stream")) {
      headers["content-type"] = "text/event-stream";
      headers["cache-control"] = "no-cache";
      return new Response(`event: message\ndata: ${JSON.stringify(reply)}\n\n`, { headers });
    }
    return Response.json(reply, { headers });
  };
}

/** Options for {@linkcode addMcpServer}. */
export interface AddMcpServerOptions extends McpServerOptions {
  /**
   * The capability's name.
   * @default "tools"
   */
  capability?: string;
  /**
   * Interface to listen on.
   * @default "127.0.0.1"
   */
  hostname?: string;
}

/**
 * Serves `tools` over streamable HTTP while `env` runs, and publishes them
 * as an `mcp` capability (`http://host:port/mcp`).
 * @throws {TypeError} for tool names that clash
 */
export function addMcpServer(env: Environment, options: AddMcpServerOptions): void {
  const handler = serveMcp(options);
  const name = options.capability ?? "tools";
  let server: Deno.HttpServer<Deno.NetAddr> | null = null;
  env.initialize(() => {
    server = Deno.serve({
      hostname: options.hostname ?? "127.0.0.1",
      port: 0,
      onListen: () => {},
    }, (request) => {
      const path = new URL(request.url).pathname;
      if (path !== "/mcp") {
        return new Response("Not found: the MCP endpoint is /mcp", { status: 404 });
      }
      return handler(request);
    });
    const addr = server.addr;
    const host = formatHost(addr.hostname);
    env.addCapability(Capability.mcp({
      name,
      url: `http://${host}:${addr.port}/mcp`,
      transport: "streamable-http",
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
