// The tools one ChatAgent run offers its model: the author's own, those of
// the run's capabilities (a shell's, each MCP server's, a desktop's computer
// tool), and `submit`, which
// ends the run with an answer. Private to the SDK: ChatAgent is the face.

import type { Run } from "../eval/run.ts";
import type { SshClient } from "../ssh/client.ts";
import { McpClient, type McpToolInfo, resultText as mcpText } from "../mcp/client.ts";
import { string as stringSchema } from "../schema.ts";
import { isRecord } from "../_internal/util.ts";
import type { ToolSpec } from "./model.ts";
import { type ComputerToolOptions, openComputerTool } from "./computer.ts";
import {
  type AgentTool,
  defineTool,
  shellTools,
  type ShellToolsOptions,
  truncate,
} from "./tools.ts";

/** The name of the tool that ends a run. */
export const SUBMIT = "submit";

/** What the toolbox needs of the agent's options, resolved. */
export interface ToolboxConfig {
  /** The author's own tools. */
  readonly tools: readonly AgentTool[];
  /** Whether to offer the tools of the run's capabilities. */
  readonly capabilityTools: boolean;
  /** The most characters of a capability tool's result the model sees. */
  readonly outputLimit: number;
  /** Limits of the shell tools. */
  readonly shell: ShellToolsOptions | undefined;
  /** The computer tool's screen size and settling. */
  readonly computer: ComputerToolOptions | undefined;
}

/** Something the toolbox opened for the run, closed when the run ends. */
export interface Closable {
  close(): Promise<void>;
}

/** The tools of one run, by name, and the answer `submit` was given. */
export class Toolbox {
  readonly #tools: Map<string, AgentTool>;
  #submitted: { answer: unknown } | null = null;

  constructor(tools: Map<string, AgentTool>) {
    this.#tools = tools;
    tools.set(
      SUBMIT,
      defineTool({
        name: SUBMIT,
        description: "Submit your final answer and end the task.",
        args: { answer: stringSchema({ description: "The final answer" }) },
        run: ({ answer }) => {
          this.#submitted = { answer };
          return "submitted";
        },
      }),
    );
  }

  /** The tools by name, `submit` last. */
  get tools(): ReadonlyMap<string, AgentTool> {
    return this.#tools;
  }

  /** What the model is told of each tool. */
  get specs(): ToolSpec[] {
    return [...this.#tools.values()].map((t) => ({
      name: t.name,
      description: t.description,
      parameters: t.parameters,
      ...(t.anthropic ? { anthropic: t.anthropic } : {}),
    }));
  }

  /** The answer given to `submit`, once it was called. */
  get submitted(): { answer: unknown } | null {
    return this.#submitted;
  }
}

/**
 * The tools for `run`: the author's, then (unless turned off) the shell's
 * and each MCP server's, then `submit`. What it opens is pushed on `opened`
 * as soon as it is open, so that the caller closes it even when a later
 * step fails.
 */
export async function openToolbox(
  run: Run,
  config: ToolboxConfig,
  signal: AbortSignal,
  opened: Closable[],
): Promise<Toolbox> {
  const tools = new Map<string, AgentTool>();
  for (const t of config.tools) tools.set(t.name, t);
  if (config.capabilityTools) {
    await addShellTools(tools, run, config, opened);
    await addMcpTools(tools, run, config.outputLimit, signal, opened);
    if (!tools.has("computer")) {
      // A desktop: the computer tool, its screenshots seen by the model.
      const computer = await openComputerTool(run, config.computer, signal);
      if (computer) {
        opened.push(computer.vnc);
        tools.set("computer", computer.tool);
      }
    }
  }
  return new Toolbox(tools);
}

/** The tools of the run's shell (the capability named `shell`, else the first SSH one). */
async function addShellTools(
  tools: Map<string, AgentTool>,
  run: Run,
  config: ToolboxConfig,
  opened: Closable[],
): Promise<void> {
  const shell = run.capabilities.find((c) => c.family === "ssh" && c.name === "shell") ??
    run.capabilities.find((c) => c.family === "ssh");
  if (!shell) return;
  const ssh = await run.client.open(shell.name) as SshClient;
  opened.push(ssh);
  // The task may name where its shell starts: `bindings: { shell: { cwd } }`.
  const episode = run.bindings[shell.name];
  const cwd = isRecord(episode) && typeof episode.cwd === "string" && episode.cwd !== ""
    ? episode.cwd
    : config.shell?.cwd;
  for (const t of shellTools(ssh, { outputLimit: config.outputLimit, ...config.shell, cwd })) {
    if (!tools.has(t.name)) tools.set(t.name, t);
  }
}

/**
 * Each streamable-HTTP MCP server's tools, reached through the forwarder; a
 * name already taken is prefixed with the capability's.
 */
async function addMcpTools(
  tools: Map<string, AgentTool>,
  run: Run,
  outputLimit: number,
  signal: AbortSignal,
  opened: Closable[],
): Promise<void> {
  for (const cap of run.capabilities) {
    if (cap.family !== "mcp" || cap.params.transport === "websocket") continue;
    const mcp = await McpClient.fromBinding(cap, { signal });
    opened.push(mcp);
    for (const info of await mcp.listTools(signal)) {
      const name = tools.has(info.name) || info.name === SUBMIT
        ? `${cap.name}_${info.name}`
        : info.name;
      tools.set(name, mcpTool(mcp, info, name, outputLimit));
    }
  }
}

/** A server's tool as the model's, its text cut to `outputLimit`. */
function mcpTool(mcp: McpClient, info: McpToolInfo, name: string, outputLimit: number): AgentTool {
  return {
    name,
    description: info.description ?? "",
    parameters: info.inputSchema,
    async call(args, { signal }) {
      const result = await mcp.callTool(info.name, args, signal);
      // A server's text is as untrusted as a command's output: cut to the
      // same limit before the model (and the trace) sees it.
      const text = truncate(mcpText(result), outputLimit);
      if (result.isError) throw new Error(text);
      return text;
    },
  };
}
