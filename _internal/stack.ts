// Where an environment's own code failed: the stack of an error its task
// code threw, without the SDK's frames and the runtime's, so that the
// command line, the serve log and the results file can name the file and
// line of the environment (as `deno run` does) rather than only a message.

import { redactSecrets } from "./redact.ts";

/** The SDK's own directory: frames in its library files are not the environment's. */
const SDK_ROOT = new URL("../", import.meta.url).href;

/** Directories of the SDK's tree that hold programs, whose frames are a user's own code. */
const PROGRAM_DIRS = ["examples/", "tests/", "bench/"];

/** The most frames kept: the environment's, closest to the throw. */
const MAX_FRAMES = 12;

/** `file:///a/b.ts:3:7` as `/a/b.ts:3:7`; other locations as they are. */
export function shownLocation(location: string): string {
  if (!location.startsWith("file://")) return location;
  try {
    const m = /^(.*?)(:\d+:\d+)$/.exec(location);
    return m === null ? location : decodeURIComponent(new URL(m[1]).pathname) + m[2];
  } catch {
    return location;
  }
}

/** The location a stack frame names (`file:///x.ts:3:7`), or `null`. */
function frameLocation(frame: string): string | null {
  const m = /^\s*at (?:.*? \()?(.+?:\d+:\d+)\)?\s*$/.exec(frame);
  return m === null ? null : m[1];
}

/** Whether a location is the SDK's library code, or the runtime's. */
function isOurs(location: string): boolean {
  if (location.startsWith("ext:") || location.startsWith("node:")) return true;
  if (!location.startsWith(SDK_ROOT)) return false;
  const rest = location.slice(SDK_ROOT.length);
  return !PROGRAM_DIRS.some((d) => rest.startsWith(d));
}

/** Where task code failed: its first own frame, and its stack of own frames. */
export interface CodeStack {
  /** The first frame in the environment's code, `/path/env.ts:12:7`. */
  readonly at: string;
  /** The error's first line, then the environment's frames (paths as `at` shows them), redacted. */
  readonly stack: string;
}

/**
 * The environment's part of `err`'s stack: the frames outside the SDK's
 * library and the runtime, paths shown as paths, secrets redacted. `null`
 * when `err` has no stack or no such frame.
 */
export function codeStack(err: unknown): CodeStack | null {
  if (!(err instanceof Error) || typeof err.stack !== "string") return null;
  const lines = err.stack.split("\n");
  const frameStart = lines.findIndex((l) => frameLocation(l) !== null);
  if (frameStart < 0) return null;
  const head = lines.slice(0, frameStart).join("\n");
  const frames: string[] = [];
  for (const line of lines.slice(frameStart)) {
    const location = frameLocation(line);
    if (location === null || isOurs(location)) continue;
    frames.push(line.replace(location, shownLocation(location)).trimEnd());
    if (frames.length === MAX_FRAMES) break;
  }
  if (frames.length === 0) return null;
  return {
    at: shownLocation(frameLocation(frames[0])!),
    stack: redactSecrets([head, ...frames].join("\n")),
  };
}

// deno-lint-ignore no-control-regex
const ANSI = /\x1b\[[0-9;]*m/g;

/**
 * Where a module failed to load, as Deno's message for it says (a syntax
 * error, a module not found: `    at file:///x.ts:2:11` on a line of its
 * own), else as the error's stack does (code that threw as the module
 * ran); `null` when neither says.
 */
export function loadLocation(err: unknown): string | null {
  const text = (err instanceof Error ? err.message : String(err)).replace(ANSI, "");
  const m = /^\s*at (\S+:\d+:\d+)\s*$/m.exec(text);
  if (m !== null) return shownLocation(m[1]);
  return codeStack(err)?.at ?? null;
}
