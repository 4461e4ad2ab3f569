/**
 * File tracking: what an agent changed in a directory, as unified diffs.
 * {@linkcode startFileTracker} serves a `filetracking/1` tracker of a
 * directory; {@linkcode FileTrackerClient} reads it, and
 * {@linkcode observeFiles} records its diffs as trace steps while a
 * rollout's agent works.
 *
 * @module
 */

export {
  type AdvanceResult,
  type ArtifactCapture,
  type CapturedFile,
  type FileDiff,
  type FilePatch,
  type FileSnapshot,
  type FileTracker,
  type FileTrackerCallOptions,
  FileTrackerClient,
  type FileTrackerClientOptions,
  type FileTrackerOptions,
  type FileTrackingEvent,
  type FlushResult,
  observeFiles,
  type ObserveFilesOptions,
  type PatchStatus,
  type ScanIssue,
  type SkippedArtifact,
  type SnapshotFile,
  startFileTracker,
} from "./tracker.ts";
