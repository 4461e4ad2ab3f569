/**
 * A Deno SDK for building the environments that AI agents are evaluated and
 * trained in, speaking the HUD control protocol (`hud/1.0`) on the wire.
 *
 * An {@linkcode Environment} declares capabilities (where an agent reaches a
 * shell, a browser, a tool server...) and task templates. A template is an
 * async generator: its first `yield` is the prompt, it receives the agent's
 * answer, and its second `yield` is the score. {@linkcode serve} publishes
 * an environment on a TCP control port; {@linkcode connect} reaches one,
 * with a local forwarder per capability. {@linkcode rollout} runs an
 * {@linkcode Agent} against one task on a runtime such as
 * {@linkcode LocalRuntime}, and a {@linkcode Taskset} runs many into a
 * {@linkcode Job}.
 *
 * This face names what the quick start and a typical environment need;
 * every subsystem has its own subpath export: `@hud/sdk/runtime` (the
 * runtime contract, `SubprocessRuntime`, `Shared`), `@hud/sdk/engines`
 * (containers, Docker Swarm), `@hud/sdk/eval` (traces, jobs, results files,
 * reports), `@hud/sdk/agents` (`ChatAgent`, model backends, `CommandAgent`),
 * `@hud/sdk/ssh`, `@hud/sdk/cdp`, `@hud/sdk/mcp`, `@hud/sdk/filetracking`,
 * `@hud/sdk/workspace`, `@hud/sdk/viewer`, and `@hud/sdk/server`,
 * `@hud/sdk/client` and `@hud/sdk/cli`.
 *
 * @example A template, served and graded
 * ```ts
 * import { bind, connect, Environment, integer } from "./mod.ts";
 * import assert from "node:assert/strict";
 *
 * const env = new Environment("arith");
 * const add = env.template(
 *   { id: "add", args: { a: integer(), b: integer() } },
 *   async function* ({ a, b }) {
 *     const answer = yield `What is ${a} + ${b}?`;
 *     yield Number(answer) === a + b ? 1 : 0;
 *   },
 * );
 * const row = add({ a: 2, b: 3 });
 *
 * await using server = bind(env);
 * await using client = await connect(server);
 * const { prompt } = await client.startTask(row.id, row.args);
 * assert.equal(prompt, "What is 2 + 3?");
 * assert.equal((await client.grade({ answer: "5" })).score, 1);
 * ```
 *
 * @module
 */

export { Capability, type CapabilityManifest } from "./capability.ts";
export {
  Environment,
  environmentOf,
  type EnvironmentOptions,
  type TaskRow,
  taskSlug,
  type Template,
  type TemplateSpec,
} from "./env.ts";
export {
  any,
  array,
  boolean,
  enumOf,
  type Infer,
  type InferArgs,
  integer,
  literal,
  number,
  object,
  optional,
  type Schema,
  string,
  withDefault,
} from "./schema.ts";
export { loadEnvironment, type LoadEnvironmentOptions } from "./loader.ts";
export {
  ConnectionClosedError,
  ErrorCode,
  HudProtocolError,
  NotReadyError,
  ProtocolViolationError,
  TaskError,
} from "./errors.ts";
export { bind, type HudServer, serve, type ServeOptions } from "./server.ts";
export { connect, type ConnectOptions, HudClient, type Manifest } from "./client.ts";
export { LocalRuntime, type LocalRuntimeOptions } from "./runtime/local.ts";
export type { Placement, RuntimeProvider } from "./runtime/placement.ts";
export { Trace } from "./eval/trace.ts";
export { type Grade, Run } from "./eval/run.ts";
export { type Agent, type AgentContext, functionAgent } from "./eval/agent.ts";
export { rollout, type RolloutOptions } from "./eval/rollout.ts";
export { type RowSelector, Taskset, type TasksetRunOptions } from "./eval/taskset.ts";
export { Job, type JobProgress, type JobSummary, type TaskResult } from "./eval/job.ts";
export type { RunRecord } from "./eval/results.ts";
export {
  addWorkspace,
  type Workspace,
  type WorkspaceExecOptions,
  type WorkspaceExecResult,
  type WorkspaceOptions,
} from "./workspace/mod.ts";
