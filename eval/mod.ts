/**
 * Evaluation: a {@linkcode Run} starts a task and grades the agent's
 * answer; {@linkcode rollout} places an environment, runs an
 * {@linkcode Agent} against one task and records a {@linkcode Trace};
 * {@linkcode Taskset} runs many rollouts concurrently into a
 * {@linkcode Job}; {@linkcode CommandAgent} runs any program as the agent.
 *
 * @module
 */

export {
  type Agent,
  type AgentContext,
  defaultRuntimeFor,
  functionAgent,
  type Grade,
  gradeFromFrame,
  NotGradedError,
  type Phase,
  rollout,
  type RolloutObserver,
  type RolloutOptions,
  Run,
  type RunStartOptions,
  Trace,
  type TraceError,
  type TraceJson,
  type TraceStatus,
  type TraceStep,
} from "./run.ts";
export {
  CommandAgent,
  type CommandAgentOptions,
  type CommandAgentRecord,
} from "./command_agent.ts";
export {
  Job,
  type JobProgress,
  type JobSummary,
  type RowSelector,
  type RunRecord,
  type TaskResult,
  Taskset,
  type TasksetRunOptions,
} from "./taskset.ts";
export { formatDuration, formatJobTable, formatProgress } from "./report.ts";
