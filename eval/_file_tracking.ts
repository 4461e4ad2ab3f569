// File tracking around a rollout's agent phase: when the environment
// publishes a `filetracking/1` capability, the agent runs inside
// observeFiles(), and each non-empty result, cut down to the task's own part
// of the workspace, becomes a `filetracking.<kind>` step of the trace. What
// the tracker's events look like is known here, not in the rollout.

import type { HudClient } from "../client.ts";
import { type FileTrackingEvent, type FlushResult, observeFiles } from "../filetracking/tracker.ts";
import { errorMessage, isRecord } from "../_internal/util.ts";
import type { Run } from "./run.ts";
import type { Trace } from "./trace.ts";

/** The file tracking a rollout asks for: off, or how often to poll. */
export type FileTrackingConfig = false | { pollInterval?: number };

/** Runs the agent (`runAgent`) as file tracking sees fit; throws what the agent throws. */
export type AgentPhaseWrapper = (runAgent: () => Promise<void>) => Promise<void>;

/**
 * The wrapper that observes the agent phase of `run`, or `null` when
 * tracking is off or the environment has no `filetracking/1` capability.
 * Tracker failures become `filetracking_error` steps; they never fail the
 * rollout. `signal` stops the tracking (the rollout's deadline).
 */
export function fileTrackingWrapper(
  client: HudClient,
  run: Run,
  trace: Trace,
  config: FileTrackingConfig,
  signal: AbortSignal,
): AgentPhaseWrapper | null {
  if (config === false) return null;
  const tracker = client.manifest.bindings.find((c) => c.protocol === "filetracking/1");
  if (tracker === undefined) return null;
  // A task may scope the tracker to its own part of the workspace with
  // per-episode data: `bindings: { filetracking: { path } }`.
  const episode = run.bindings[tracker.name];
  const path = isRecord(episode) && typeof episode.path === "string" ? episode.path : null;
  return (runAgent) =>
    observeFiles(client.binding(tracker.name), runAgent, {
      pollInterval: config.pollInterval,
      signal,
      onResult: (event) => {
        const result = scoped(event, path);
        if (result !== null) trace.record(`filetracking.${event.kind}`, result);
      },
      onError: (err) => trace.record("filetracking_error", errorMessage(err)),
    });
}

/**
 * The part of a tracker result under `scope` (a path relative to the
 * tracker's root), or `null` when nothing of it is left.
 */
export function scoped(event: FileTrackingEvent, scope: string | null): unknown | null {
  const inScope = (path: string) =>
    scope === null || path === scope || path.startsWith(scope.endsWith("/") ? scope : `${scope}/`);
  switch (event.kind) {
    case "snapshot": {
      const files = event.result.files.filter((f) => inScope(f.path));
      return files.length === 0 ? null : { ...event.result, files };
    }
    case "setup":
    case "diff": {
      const patches = event.result.patches.filter((p) => inScope(p.path));
      return patches.length === 0
        ? null
        : { ...event.result, patches, files_changed: patches.length };
    }
    case "flush":
      return scopedFlush(event.result, inScope);
  }
}

function scopedFlush(result: FlushResult, inScope: (path: string) => boolean): unknown | null {
  // HUD's shape, which this project's tracker sends too (a HUD tracker has
  // no skipped_files; a flat flush of an earlier version of this one has
  // the diff's members beside capture).
  const diff = result.diff ?? (result as unknown as FlushResult["diff"]);
  const capture = result.capture ?? { files: [] };
  const patches = (diff.patches ?? []).filter((p) => inScope(p.path));
  const files = (capture.files ?? []).filter((f) => inScope(f.path));
  const skipped = (capture.skipped_files ?? []).filter((f) => inScope(f.path));
  if (patches.length === 0 && files.length === 0 && skipped.length === 0) return null;
  return {
    diff: { ...diff, patches, files_changed: patches.length },
    capture: {
      ...capture,
      files,
      files_eligible: files.length + skipped.length,
      files_captured: files.length,
      files_skipped: skipped.length,
      skipped_files: skipped,
    },
  };
}
