// The control session's method table. A channel takes a parsed request and
// returns the reply frame (or null for a notification); it never sees a
// socket, so every method runs, and is tested, in-process. The server
// around it reads frames, authenticates, writes replies and splices tunnels.

import type { Capability } from "../capability.ts";
import type { Environment } from "../env.ts";
import { ErrorCode, HudProtocolError, TaskError } from "../errors.ts";
import { errorMessage, isRecord } from "../_internal/util.ts";
import { codeStack } from "../_internal/stack.ts";
import { redactSecrets } from "../_internal/redact.ts";
import { type Session, SessionRegistry, type SessionRegistryOptions } from "./sessions.ts";

/** The `error` member of an error reply. */
export interface WireError {
  code: number;
  message: string;
  /** For task code that threw: where (see {@linkcode taskErrorData}). */
  data?: TaskErrorData;
}

/**
 * What an error reply says of task code that threw, beside its message (a
 * member JSON-RPC allows, which HUD's Python client ignores): the first
 * frame in the environment's own code, its stack of such frames (secrets
 * redacted), and the failure class the code named, if it named one.
 */
export interface TaskErrorData {
  /** `/path/env.ts:12:7`. */
  at?: string;
  /** The error's first line and the environment's frames. */
  stack?: string;
  /** A failure class the thrown error carried (`errorClass`), such as `verifier_timeout`. */
  class?: string;
}

/** What a reply carries of `err`, task code that threw; `undefined` when it knows nothing. */
export function taskErrorData(err: TaskError): TaskErrorData | undefined {
  const cause = err.cause;
  const data: TaskErrorData = {};
  const where = codeStack(cause);
  if (where !== null) {
    data.at = where.at;
    data.stack = where.stack;
  }
  const named = (cause as { errorClass?: unknown } | null)?.errorClass;
  if (typeof named === "string" && /^[a-z_]{1,40}$/.test(named)) data.class = named;
  return Object.keys(data).length === 0 ? undefined : data;
}

/** A reply frame, ready to encode. */
export type Reply =
  | { jsonrpc: "2.0"; id: unknown; result: Record<string, unknown> }
  | { jsonrpc: "2.0"; id: unknown; error: WireError };

/** An error reply to request `id`. */
export function errorReply(id: unknown, code: number, message: string): Reply {
  return { jsonrpc: "2.0", id, error: { code, message } };
}

/**
 * The one place where a thrown error becomes a wire error. The server's own
 * refusals are {@linkcode HudProtocolError}s and keep their code; anything
 * else (refused arguments, task code that threw, a broken grading contract:
 * the environment's plain and named errors) is `-32000` with its message;
 * task code's message with secrets redacted, and where it threw as `data`.
 */
export function toWireError(err: unknown): WireError {
  if (err instanceof HudProtocolError) return { code: err.code, message: err.message };
  if (!(err instanceof TaskError)) {
    return { code: ErrorCode.SERVER_ERROR, message: errorMessage(err) };
  }
  // Task code's message may quote what it read (a config, a key): redacted, as its stack is.
  const data = taskErrorData(err);
  return {
    code: ErrorCode.SERVER_ERROR,
    message: redactSecrets(err.message),
    ...(data ? { data } : {}),
  };
}

/** Options of a {@linkcode ControlDispatcher}. */
export interface ControlDispatcherOptions extends SessionRegistryOptions {
  /** The url a capability is published under in the manifest. @default its own url */
  urlOf?: (capability: Capability) => string;
  /** Called with each error of task code (a template that threw), after its reply is made. */
  onTaskError?: (error: TaskError) => void;
}

/** What a method sees: the environment, the registry, its channel's session. */
interface Context {
  readonly env: Environment;
  readonly sessions: SessionRegistry;
  readonly urlOf: ((capability: Capability) => string) | undefined;
  readonly onTaskError: ((error: TaskError) => void) | undefined;
  session: Session;
  ended: boolean;
}

/**
 * Whether Python reads `value` as false (`None`, `False`, `0`, `""`, `[]`,
 * `{}`): HUD's server takes `params` and `args` that are so as `{}`.
 */
function pyFalsy(value: unknown): boolean {
  if (value === undefined || value === null || value === false || value === 0 || value === 0n) {
    return true;
  }
  if (value === "") return true;
  if (Array.isArray(value)) return value.length === 0;
  return isRecord(value) && Object.keys(value).length === 0;
}

/** A method name as HUD's server shows it in "method not found". */
function showMethod(method: unknown): string {
  if (typeof method === "string") return method;
  return typeof method === "object" && method !== null ? JSON.stringify(method) : String(method);
}

/**
 * A method: `params` as the request has them (absent is `undefined`); a
 * method that reads them takes them through {@linkcode readParams}.
 */
type Method = (
  c: Context,
  params: unknown,
) => Record<string, unknown> | Promise<Record<string, unknown>>;

/**
 * `params` as an object: what Python reads as false is `{}`, as on HUD's
 * server; another non-object is `-32602` (HUD's server fails on it when it
 * reads a member, with `-32000` and Python's `AttributeError`).
 * @throws {HudProtocolError} `-32602 params must be an object`
 */
function readParams(params: unknown): Record<string, unknown> {
  const value = pyFalsy(params) ? {} : params;
  if (!isRecord(value)) {
    throw new HudProtocolError(ErrorCode.INVALID_PARAMS, "params must be an object");
  }
  return value;
}

function manifest(c: Context): Record<string, unknown> {
  return {
    session_id: c.session.id,
    env: { name: c.env.name, version: c.env.version },
    // The template of the task a resumed session holds, so that a client
    // grading it can check what it grades.
    ...(c.session.task ? { task: { id: c.session.task.id } } : {}),
    bindings: c.env.capabilities.map((cap) => {
      const binding = cap.toManifest();
      if (c.urlOf) binding.url = c.urlOf(cap);
      return binding;
    }),
  };
}

async function cancelHeld(c: Context): Promise<void> {
  await c.sessions.take(c.session)?.cancel();
}

/**
 * The method table of a control session (PROTOCOL.md, "Control-session
 * methods"). `tasks.list`, `tasks.cancel` and `bye` never read their params,
 * as on HUD's server, so no params can make them fail.
 */
const METHODS: ReadonlyMap<string, Method> = new Map<string, Method>([
  ["hello", (c, raw) => {
    const wanted = readParams(raw).session_id;
    if (wanted === undefined || wanted === null || wanted === c.session.id) return manifest(c);
    if (typeof wanted !== "string") {
      throw new HudProtocolError(ErrorCode.INVALID_PARAMS, "session_id must be a string");
    }
    c.session = c.sessions.resume(c.session, wanted);
    return manifest(c);
  }],
  ["tasks.list", (c) => ({ tasks: c.env.listTasks() })],
  ["tasks.start", async (c, raw) => {
    const params = readParams(raw);
    const id = params.id;
    if (typeof id !== "string") {
      throw new HudProtocolError(ErrorCode.INVALID_PARAMS, "id must be a string");
    }
    const args = pyFalsy(params.args) ? {} : params.args;
    if (!isRecord(args)) {
      throw new HudProtocolError(ErrorCode.INVALID_PARAMS, "args must be an object");
    }
    // As HUD's server: the held task goes first, even when the id names no
    // template (so it cannot be graded after a failed restart).
    await cancelHeld(c);
    if (!c.env.hasTemplate(id)) {
      throw new HudProtocolError(ErrorCode.INVALID_PARAMS, `unknown task: ${id}`);
    }
    c.sessions.checkRoomFor(id);
    const task = await c.env.startTask(id, args);
    await c.sessions.hold(c.session, task);
    return task.prompt;
  }],
  ["tasks.grade", async (c, raw) => {
    // No task of its own: the lone parked one (HUD's "start here, grade
    // from another process" flow), with or without authentication.
    const task = c.sessions.take(c.session) ?? c.sessions.adopt();
    let params: Record<string, unknown>;
    try {
      params = readParams(raw);
    } catch (err) {
      // A grade consumes the task whatever the outcome, as on HUD's server
      // (which reads the answer inside the grade that cancels the task).
      await task.cancel();
      throw err;
    }
    return await task.grade(params.answer);
  }],
  ["tasks.cancel", async (c) => {
    await cancelHeld(c);
    return { cancelled: true };
  }],
  ["bye", async (c) => {
    await cancelHeld(c);
    c.ended = true;
    return { goodbye: true };
  }],
]);

/**
 * The method table and the session registry of one server. Each control
 * connection gets a {@linkcode ControlChannel} from {@linkcode open}.
 */
export class ControlDispatcher {
  readonly #env: Environment;
  readonly #sessions: SessionRegistry;
  readonly #urlOf: ((capability: Capability) => string) | undefined;
  readonly #onTaskError: ((error: TaskError) => void) | undefined;

  constructor(env: Environment, options: ControlDispatcherOptions) {
    this.#env = env;
    this.#sessions = new SessionRegistry(options);
    this.#urlOf = options.urlOf;
    this.#onTaskError = options.onTaskError;
  }

  /** The session registry (counts, shutdown). */
  get sessions(): SessionRegistry {
    return this.#sessions;
  }

  /** A channel for a new control connection, with a fresh session. */
  open(): ControlChannel {
    return new ControlChannel({
      env: this.#env,
      sessions: this.#sessions,
      urlOf: this.#urlOf,
      onTaskError: this.#onTaskError,
      session: this.#sessions.open(),
      ended: false,
    });
  }
}

/**
 * One control connection as the method table sees it: requests in, replies
 * out, one at a time. {@linkcode close} when the connection is gone.
 */
export class ControlChannel {
  readonly #c: Context;

  constructor(context: Context) {
    this.#c = context;
  }

  /** The id of the session this channel holds now (`hello` may resume another). */
  get sessionId(): string {
    return this.#c.session.id;
  }

  /** Whether `bye` was handled: the connection is to be closed. */
  get ended(): boolean {
    return this.#c.ended;
  }

  /**
   * Runs one request. Returns its reply, or `null` for a notification (a
   * request whose `id` is absent or `null`, as HUD's server reads it),
   * which is run all the same.
   */
  async handle(request: Record<string, unknown>): Promise<Reply | null> {
    let reply: Reply;
    const id = request.id ?? null;
    try {
      reply = { jsonrpc: "2.0", id, result: await this.#run(request) };
    } catch (err) {
      reply = { jsonrpc: "2.0", id, error: toWireError(err) };
      if (err instanceof TaskError) this.#reportTaskError(err);
    }
    return id === null ? null : reply;
  }

  #reportTaskError(err: TaskError): void {
    try {
      this.#c.onTaskError?.(err);
    } catch {
      // A reporter that throws must not take the reply with it.
    }
  }

  /** The connection is gone: park the session's task, or forget the session. */
  close(): void {
    this.#c.sessions.release(this.#c.session);
  }

  #run(
    request: Record<string, unknown>,
  ): Record<string, unknown> | Promise<Record<string, unknown>> {
    const method = request.method ?? "";
    const run = typeof method === "string" ? METHODS.get(method) : undefined;
    if (run === undefined) {
      throw new HudProtocolError(
        ErrorCode.METHOD_NOT_FOUND,
        `method not found: ${showMethod(method)}`,
      );
    }
    return run(this.#c, request.params);
  }
}
