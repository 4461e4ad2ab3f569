/**
 * Evaluation: a {@linkcode Run} starts a task and grades the agent's
 * answer; {@linkcode rollout} places an environment, runs an
 * {@linkcode Agent} against one task and records a {@linkcode Trace};
 * {@linkcode Taskset} runs many rollouts concurrently into a
 * {@linkcode Job}, streamed to a results file; from a workspace snapshot
 * with a {@linkcode ForkRuntime}. Agents that drive a run by
 * a model or by any program are in `@hud/sdk/agents`.
 *
 * @module
 */

export {
  type Phase,
  Trace,
  type TraceError,
  type TraceFile,
  type TraceJson,
  type TraceSnapshot,
  type TraceStatus,
  type TraceStep,
} from "./trace.ts";
export { type Grade, gradeFromFrame, Run, type RunStartOptions } from "./run.ts";
export {
  type Agent,
  type AgentContext,
  type AgentInfo,
  functionAgent,
  type ModelCallUsage,
  NotGradedError,
} from "./agent.ts";
export {
  defaultRuntimeFor,
  rollout,
  type RolloutObserver,
  type RolloutOptions,
} from "./rollout.ts";
export {
  type RolloutRetryOptions,
  type RowSelector,
  Taskset,
  type TasksetRunOptions,
} from "./taskset.ts";
export {
  type CommonFailure,
  Job,
  type JobProgress,
  type JobStop,
  type JobSummary,
  type SnapshotSummary,
  type TaskResult,
  type TaskSummary,
} from "./job.ts";
export {
  type ForkPlacement,
  ForkRuntime,
  placesFromSnapshots,
  type Snapshot,
  type SnapshotRuntime,
} from "./fork.ts";
export type { SnapshotSource } from "./_job_snapshots.ts";
export { resultsFilesDir, type RunRecord } from "./results.ts";
export {
  type ClassedRecord,
  classifyError,
  FAILURE_CLASSES,
  type FailureClassInfo,
  type FailurePhase,
  isFailureClass,
  isGraded,
  type LegacyErrorClass,
  readErrorClass,
  recordClass,
  RETRYABLE_ERROR_CLASSES,
  type RolloutErrorClass,
  rolloutFinished,
} from "./failure.ts";
export {
  AdaptiveConcurrency,
  type AdaptiveConcurrencyOptions,
  type CallOutcome,
  type Clock,
  type ConcurrencyPermit,
  type LimitChange,
  SYSTEM_CLOCK,
  type VirtualClock,
  virtualClock,
} from "./concurrency.ts";
export {
  addUsage,
  callCost,
  type CallTokens,
  DEFAULT_PRICING,
  emptyUsage,
  loadPricing,
  type ModelPrice,
  priceOf,
  type PricingTable,
  traceUsage,
  type Usage,
} from "./usage.ts";
export {
  decodeTurnTokens,
  encodeTurnTokens,
  type StoredTokens,
  traceTokens,
  type TurnTokens,
} from "./tokens.ts";
export {
  type TrainingRow,
  trainingRows,
  type TrainingRowsOptions,
  type TrainingSequence,
  type TrainingSplit,
  type TrainingTurn,
} from "./training.ts";
export {
  commonFailureText,
  formatCount,
  formatDuration,
  formatJobTable,
  formatProgress,
  meanLine,
} from "./report.ts";
export {
  type AtifAgent,
  type AtifFinalMetrics,
  type AtifMetrics,
  type AtifObservationResult,
  type AtifOptions,
  type AtifStep,
  type AtifToolCall,
  type AtifTrajectory,
  toAtif,
  writeTrajectories,
} from "./atif.ts";
