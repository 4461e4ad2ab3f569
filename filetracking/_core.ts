// The file tracker's state and its five methods, independent of transport:
// baselines, change detection, patches, payload caps and artifact capture.

import { unifiedDiff } from "./_diff.ts";
import { artifactType, isCredentialPath } from "./_rules.ts";
import { type Entry, sameContent, type Scan, type ScanIssue, Scanner, sha256Hex } from "./_scan.ts";

export type { ScanIssue };

/** The tracker's methods a `filetracking/1` server serves, by their wire names. */
export const METHODS = ["snapshot", "diff", "setup", "advance", "flush"] as const;
/** One of {@linkcode METHODS}. */
export type Method = typeof METHODS[number];

// Wire payloads keep the protocol's snake_case names: they are recorded in
// traces as they are, so a camelCase copy would only add a conversion. Their
// shapes are those of HUD's tracker (hud/environment/file_tracker.py), so
// that either side's observer reads the other's tracker; what this one adds
// (`skipped_paths`, `skipped_files`, scan data on `advance`) is extra members.

/** One file in a `snapshot` result. */
export interface SnapshotFile {
  /** Path relative to the root, `/`-separated. */
  path: string;
  /** Size in bytes. */
  size: number;
  /** sha256 hex of the content; `null` for credential-shaped or unread files. */
  content_hash: string | null;
}

/** Result of `snapshot`: every tracked file. */
export interface FileSnapshot {
  /** Tracked files, sorted by path. */
  files: SnapshotFile[];
  /** Number of files the scan tracked. */
  files_scanned: number;
  /** Present and `true` when the list or a hash was cut short by a limit. */
  truncated?: boolean;
  /**
   * Present when the scan skipped paths it could not track (unreadable,
   * replaced while read, too deep): each with the reason. At most 100.
   */
  skipped_paths?: ScanIssue[];
}

/** How a file changed. */
export type PatchStatus = "added" | "modified" | "deleted";

/** One changed file in a `diff`, `setup` or `flush` result. */
export interface FilePatch {
  /** Path relative to the root, `/`-separated. */
  path: string;
  /** How it changed. A rename shows as a deletion and an addition. */
  status: PatchStatus;
  /** Unified diff text, or a one-line placeholder where no diff is recorded. */
  patch: string;
  /** Size before, 0 when added. */
  size_before: number;
  /** Size after, 0 when deleted. */
  size_after: number;
  /** sha256 hex before, `null` when added, credential-shaped or unread. */
  content_hash_before: string | null;
  /** sha256 hex after, `null` when deleted, credential-shaped or unread. */
  content_hash_after: string | null;
}

/** Result of `diff` and `setup`: what changed since the reference point. */
export interface FileDiff {
  /** When the scan started, in seconds since the Unix epoch (HUD's `time.time()`). */
  snapshot_timestamp: number;
  /** How long the scan took, in milliseconds. */
  scan_duration_ms: number;
  /** Number of files the scan tracked. */
  files_scanned: number;
  /** Number of entries in `patches`. */
  files_changed: number;
  /** Changed files, sorted by path. */
  patches: FilePatch[];
  /** Present and `true` when a limit left content unread or patches omitted. */
  truncated?: boolean;
  /**
   * Present when the scan skipped paths it could not track (unreadable,
   * replaced while read, too deep): each with the reason. At most 100.
   */
  skipped_paths?: ScanIssue[];
}

/** Result of `advance`: the new reference point. */
export interface AdvanceResult {
  /** Always `true` (all HUD's tracker answers). */
  advanced: true;
  /** When the scan started, in seconds since the Unix epoch. */
  snapshot_timestamp: number;
  /** How long the scan took, in milliseconds. */
  scan_duration_ms: number;
  /** Number of files the scan tracked. */
  files_scanned: number;
  /** Present and `true` when the content budget left files unread. */
  truncated?: boolean;
  /**
   * Present when the scan skipped paths it could not track (unreadable,
   * replaced while read, too deep): each with the reason. At most 100.
   */
  skipped_paths?: ScanIssue[];
}

/** An artifact file captured by `flush`. */
export interface CapturedFile {
  /** Path relative to the root, `/`-separated. */
  path: string;
  /** Size in bytes. */
  size: number;
  /** sha256 hex of the content. */
  content_hash: string;
  /** Media type guessed from the extension. */
  content_type: string;
  /** The content, as a file part (the shape model APIs take). */
  file: { type: "file"; data: string; media_type: string };
  /** Whether the file is new since the run's baseline, or changed. */
  status: "added" | "modified";
}

/** An artifact file `flush` did not capture, and why. */
export interface SkippedArtifact {
  /** Path relative to the root, `/`-separated. */
  path: string;
  /** Size in bytes. */
  size: number;
  /** `count`, `size` or `total` (which cap), or `unreadable`. */
  reason: "count" | "size" | "total" | "unreadable";
}

/** Artifacts (documents, images, html, spreadsheets) added or changed during the run. */
export interface ArtifactCapture {
  /** When the scan started, in seconds since the Unix epoch. */
  snapshot_timestamp: number;
  /** How long the scan took, in milliseconds. */
  scan_duration_ms: number;
  /** Number of files the scan tracked. */
  files_scanned: number;
  /** Files added or changed since the run's baseline, artifacts or not. */
  files_changed: number;
  /** Artifact files among them. */
  files_eligible: number;
  /** Entries in `files`. */
  files_captured: number;
  /** Eligible files not captured. */
  files_skipped: number;
  /** Captured files, sorted by path. */
  files: CapturedFile[];
  /** Present and `true` when a capture cap left eligible files out. */
  truncated?: boolean;
  /** The skipped files and the reason for each. */
  skipped_files: SkippedArtifact[];
}

/** Result of `flush`: the final diff and the captured artifacts, as HUD's tracker sends them. */
export interface FlushResult {
  /** Changes since the last report. */
  diff: FileDiff;
  /** Artifacts added or changed since the run's baseline. */
  capture: ArtifactCapture;
}

/** Limits of a tracker; every field is required here, defaults live in the public options. */
export interface TrackerLimits {
  maxFileSize: number;
  scanBudget: number;
  maxPayload: number;
  maxCaptureFiles: number;
  maxCaptureFileSize: number;
  maxCaptureTotal: number;
}

/**
 * One observer's position. Each connection to the tracker has its own, so
 * that observers running side by side (concurrent rollouts on one
 * workspace) each get every change, instead of one observer's `diff`
 * consuming changes that another should have reported.
 */
export interface TrackerCursor {
  /** The last reported state; `diff` and `flush` report against it. */
  last: Scan;
  /** Set by `setup` and `advance`; `flush` captures artifacts changed since. */
  run: Scan;
}

/** The tracker state: one scanner, the baseline, and a cursor per observer. */
export class Tracker {
  readonly #scanner: Scanner;
  readonly #limits: TrackerLimits;
  /** Taken when the tracker started; `setup` reports against it. */
  readonly #start: Scan;
  /** The cursor of callers that pass none. */
  readonly #shared: TrackerCursor;
  #lock: Promise<unknown> = Promise.resolve();

  constructor(scanner: Scanner, limits: TrackerLimits, baseline: Scan) {
    this.#scanner = scanner;
    this.#limits = limits;
    this.#start = baseline;
    this.#shared = this.cursor();
  }

  /** A new observer position, at the baseline. Scans are shared, not copied. */
  cursor(): TrackerCursor {
    return { last: this.#start, run: this.#start };
  }

  /** Resolves `root` and takes the baseline. */
  static async create(root: string, limits: TrackerLimits): Promise<Tracker> {
    const resolved = await Deno.realPath(root);
    const info = await Deno.stat(resolved);
    if (!info.isDirectory) throw new TypeError(`Cannot track files: "${root}" is not a directory`);
    const scanner = new Scanner(resolved, limits);
    return new Tracker(scanner, limits, await scanner.scan());
  }

  /** Every tracked file now. */
  snapshot(): Promise<FileSnapshot> {
    return this.#serial(async () => {
      const scan = await this.#scanner.scan();
      const files: SnapshotFile[] = [];
      let budget = this.#limits.maxPayload;
      let truncated = scan.truncated;
      for (const [path, e] of scan.files) {
        const cost = path.length + 120;
        if (cost > budget) {
          truncated = true;
          break;
        }
        budget -= cost;
        files.push({ path, size: e.size, content_hash: publicHash(e) });
      }
      const result: FileSnapshot = { files, files_scanned: scan.files.size };
      if (truncated) result.truncated = true;
      if (scan.issues.length > 0) result.skipped_paths = [...scan.issues];
      return result;
    });
  }

  /** Changes since the last `diff`, `setup`, `advance` or `flush`. */
  diff(cursor: TrackerCursor = this.#shared): Promise<FileDiff> {
    return this.#serial(async () => {
      const scan = await this.#scanner.scan();
      const result = this.#compare(cursor.last, scan);
      cursor.last = scan;
      return result;
    });
  }

  /** Changes since the tracker started (the task's setup); then re-baselines. */
  setup(cursor: TrackerCursor = this.#shared): Promise<FileDiff> {
    return this.#serial(async () => {
      const scan = await this.#scanner.scan();
      const result = this.#compare(this.#start, scan);
      cursor.last = cursor.run = scan;
      return result;
    });
  }

  /** Re-baselines without reporting. */
  advance(cursor: TrackerCursor = this.#shared): Promise<AdvanceResult> {
    return this.#serial(async () => {
      const scan = await this.#scanner.scan();
      cursor.last = cursor.run = scan;
      const result: AdvanceResult = {
        advanced: true,
        snapshot_timestamp: epochSeconds(scan.timestamp),
        scan_duration_ms: roundMs(scan.durationMs),
        files_scanned: scan.files.size,
      };
      if (scan.truncated) result.truncated = true;
      if (scan.issues.length > 0) result.skipped_paths = [...scan.issues];
      return result;
    });
  }

  /** The final diff, plus the artifacts added or changed since the run's baseline. */
  flush(cursor: TrackerCursor = this.#shared): Promise<FlushResult> {
    return this.#serial(async () => {
      const scan = await this.#scanner.scan();
      const diff = this.#compare(cursor.last, scan);
      cursor.last = scan;
      return { diff, capture: await this.#capture(cursor.run, scan) };
    });
  }

  /** Runs scans one at a time, whichever connection asks. */
  #serial<T>(fn: () => Promise<T>): Promise<T> {
    const next = this.#lock.then(fn);
    this.#lock = next.catch(() => {});
    return next;
  }

  #compare(from: Scan, to: Scan): FileDiff {
    const patches: FilePatch[] = [];
    let budget = this.#limits.maxPayload;
    let truncated = to.truncated;
    const add = (path: string, before: Entry | undefined, after: Entry | undefined) => {
      let patch = this.#patch(path, before, after);
      if (patch.length > budget) {
        patch =
          `Diff of ${path} omitted: payload cap of ${this.#limits.maxPayload} bytes reached\n`;
        truncated = true;
      }
      budget = Math.max(0, budget - patch.length);
      patches.push({
        path,
        status: before === undefined ? "added" : after === undefined ? "deleted" : "modified",
        patch,
        size_before: before?.size ?? 0,
        size_after: after?.size ?? 0,
        content_hash_before: before ? publicHash(before) : null,
        content_hash_after: after ? publicHash(after) : null,
      });
    };
    const paths = new Set([...from.files.keys(), ...to.files.keys()]);
    for (const path of [...paths].sort((x, y) => x < y ? -1 : x > y ? 1 : 0)) {
      const before = from.files.get(path);
      const after = to.files.get(path);
      if (before && after && sameContent(before, after)) continue;
      add(path, before, after);
    }
    const result: FileDiff = {
      snapshot_timestamp: epochSeconds(to.timestamp),
      scan_duration_ms: roundMs(to.durationMs),
      files_scanned: to.files.size,
      files_changed: patches.length,
      patches,
    };
    if (truncated) result.truncated = true;
    if (to.issues.length > 0) result.skipped_paths = [...to.issues];
    return result;
  }

  #patch(path: string, before: Entry | undefined, after: Entry | undefined): string {
    const oldLabel = before ? `a/${path}` : "/dev/null";
    const newLabel = after ? `b/${path}` : "/dev/null";
    const kinds = [before?.kind, after?.kind];
    if (kinds.includes("credential") || isCredentialPath(path)) {
      return `Credential-shaped file ${path}: content not recorded\n`;
    }
    if (kinds.includes("large")) {
      return `File ${path} is over ${this.#limits.maxFileSize} bytes: diff not recorded\n`;
    }
    if ((before && before.hash === null) || (after && after.hash === null)) {
      return `File ${path} was not read (scan content budget reached): diff not recorded\n`;
    }
    const textual = (e: Entry | undefined) =>
      e === undefined || ((e.kind === "text" || e.kind === "symlink") && e.text !== null);
    if (
      textual(before) && textual(after) &&
      (before?.kind ?? after?.kind) === (after?.kind ?? before?.kind)
    ) {
      return unifiedDiff(before?.text ?? null, after?.text ?? null, {
        oldPath: before ? oldLabel : null,
        newPath: after ? newLabel : null,
      });
    }
    return `Binary files ${oldLabel} and ${newLabel} differ\n`;
  }

  /** The artifacts (by file type) changed from `from` to `to`, within the capture limits. */
  async #capture(from: Scan, to: Scan): Promise<ArtifactCapture> {
    const files: CapturedFile[] = [];
    const skipped: SkippedArtifact[] = [];
    let eligible = 0;
    let changed = 0;
    let total = 0;
    for (const [path, entry] of to.files) {
      const before = from.files.get(path);
      if (before && sameContent(before, entry)) continue;
      changed++;
      const mime = artifactType(path);
      if (mime === null || entry.kind === "credential" || entry.kind === "symlink") continue;
      if (isCredentialPath(path)) continue;
      eligible++;
      const bytes = await this.#take(path, entry.size, files.length, total);
      if (typeof bytes === "string") {
        skipped.push({ path, size: entry.size, reason: bytes });
        continue;
      }
      total += bytes.length;
      files.push({
        path,
        size: bytes.length,
        content_hash: await sha256Hex(bytes),
        content_type: mime,
        file: { type: "file", data: bytes.toBase64(), media_type: mime },
        status: before ? "modified" : "added",
      });
    }
    const capture: ArtifactCapture = {
      snapshot_timestamp: epochSeconds(to.timestamp),
      scan_duration_ms: roundMs(to.durationMs),
      files_scanned: to.files.size,
      files_changed: changed,
      files_eligible: eligible,
      files_captured: files.length,
      files_skipped: skipped.length,
      files,
      skipped_files: skipped,
    };
    if (skipped.some((f) => f.reason !== "unreadable")) capture.truncated = true;
    return capture;
  }

  /**
   * The bytes of an artifact of `size` bytes (by the scan), when the limits
   * leave room for it beside `count` files of `total` bytes; else why not.
   */
  async #take(
    path: string,
    size: number,
    count: number,
    total: number,
  ): Promise<Uint8Array<ArrayBuffer> | SkippedArtifact["reason"]> {
    const l = this.#limits;
    if (count >= l.maxCaptureFiles) return "count";
    if (size > l.maxCaptureFileSize) return "size";
    if (total + size > l.maxCaptureTotal) return "total";
    let bytes: Uint8Array<ArrayBuffer>;
    try {
      bytes = await Deno.readFile(this.#scanner.resolve(path));
    } catch (err) {
      if (!(err instanceof Deno.errors.NotFound || err instanceof Deno.errors.PermissionDenied)) {
        throw err;
      }
      return "unreadable";
    }
    // The file may have grown since the scan.
    if (bytes.length > l.maxCaptureFileSize) return "size";
    if (total + bytes.length > l.maxCaptureTotal) return "total";
    return bytes;
  }
}

function publicHash(e: Entry): string | null {
  return e.kind === "credential" ? null : e.hash;
}

/** A time as HUD's tracker writes it: seconds since the Unix epoch, a float. */
function epochSeconds(date: Date): number {
  return date.getTime() / 1000;
}

function roundMs(ms: number): number {
  return Math.round(ms * 1000) / 1000;
}
