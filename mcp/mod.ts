/**
 * MCP over the streamable HTTP transport: {@linkcode McpClient} talks to any
 * MCP server (protocol 2025-06-18 or 2025-11-25), reached directly or
 * through a `HudClient`'s forwarder (`await client.open("mcp")`);
 * {@linkcode addMcpServer} serves typed tools ({@linkcode mcpTool}) from an
 * environment and publishes an `mcp` capability.
 *
 * @module
 */

export {
  MCP_PROTOCOL_VERSIONS,
  type McpBindingOptions,
  McpClient,
  type McpClientOptions,
  McpError,
  type McpToolInfo,
  type McpToolResult,
  resultText,
} from "./client.ts";
export {
  addMcpServer,
  type AddMcpServerOptions,
  checkArgs,
  mcpHandler,
  type McpServerOptions,
  type McpTool,
  mcpTool,
  type McpToolDefinition,
} from "./server.ts";
