// The control session's method table. A channel takes a parsed request and
// returns the reply frame (or null for a notification); it never sees a
// socket, so every method runs, and is tested, in-process. The server
// around it reads frames, authenticates, writes replies and splices tunnels.

import type { Environment } from "../env.ts";
import { ErrorCode, HudProtocolError } from "../errors.ts";
import { errorMessage, isRecord } from "../_internal/util.ts";
import { type Session, SessionRegistry, type SessionRegistryOptions } from "./sessions.ts";

/** The `error` member of an error reply. */
export interface WireError {
  code: number;
  message: string;
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
 * the environment's plain and named errors) is `-32000` with its message.
 */
export function toWireError(err: unknown): WireError {
  if (err instanceof HudProtocolError) return { code: err.code, message: err.message };
  return { code: ErrorCode.SERVER_ERROR, message: errorMessage(err) };
}

/** Options of a {@linkcode ControlDispatcher}. */
export interface ControlDispatcherOptions extends SessionRegistryOptions {
  /**
   * Whether a `tasks.grade` from a session with no task may grade the lone
   * parked task.
   */
  adoption: boolean;
}

/** What a method sees: the environment, the registry, its channel's session. */
interface Context {
  readonly env: Environment;
  readonly sessions: SessionRegistry;
  readonly adoption: boolean;
  session: Session;
  ended: boolean;
}

type Method = (
  c: Context,
  params: Record<string, unknown>,
) => Record<string, unknown> | Promise<Record<string, unknown>>;

function manifest(c: Context): Record<string, unknown> {
  return {
    session_id: c.session.id,
    env: { name: c.env.name, version: c.env.version },
    bindings: c.env.capabilities.map((cap) => cap.toManifest()),
  };
}

async function cancelHeld(c: Context): Promise<void> {
  await c.sessions.take(c.session)?.cancel();
}

/** The method table of a control session (PROTOCOL.md, "Control-session methods"). */
const METHODS: ReadonlyMap<string, Method> = new Map<string, Method>([
  ["hello", (c, params) => {
    const wanted = params.session_id;
    if (wanted === undefined || wanted === null || wanted === c.session.id) return manifest(c);
    if (typeof wanted !== "string") {
      throw new HudProtocolError(ErrorCode.INVALID_PARAMS, "session_id must be a string");
    }
    c.session = c.sessions.resume(c.session, wanted);
    return manifest(c);
  }],
  ["tasks.list", (c) => ({ tasks: c.env.listTasks() })],
  ["tasks.start", async (c, params) => {
    const id = params.id;
    if (typeof id !== "string") {
      throw new HudProtocolError(ErrorCode.INVALID_PARAMS, "id must be a string");
    }
    const args = params.args ?? {};
    if (!isRecord(args)) {
      throw new HudProtocolError(ErrorCode.INVALID_PARAMS, "args must be an object");
    }
    if (!c.env.hasTemplate(id)) {
      throw new HudProtocolError(ErrorCode.INVALID_PARAMS, `unknown task: ${id}`);
    }
    c.sessions.checkRoomFor(id);
    await cancelHeld(c);
    const task = await c.env.startTask(id, args);
    await c.sessions.hold(c.session, task);
    return task.prompt;
  }],
  ["tasks.grade", async (c, params) => {
    let task = c.sessions.take(c.session);
    if (task === null) {
      const parked = c.sessions.parkedCount;
      // Adopting someone else's task is only for connections that proved
      // they hold the token; without auth, anyone could grade it.
      if (parked > 0 && !c.adoption) {
        throw new HudProtocolError(
          ErrorCode.INVALID_REQUEST,
          `no task in progress (${parked} parked; adopting a parked task needs an authenticated server: resume yours with hello {"session_id": ...})`,
        );
      }
      task = c.sessions.adopt();
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
  readonly #adoption: boolean;

  constructor(env: Environment, options: ControlDispatcherOptions) {
    this.#env = env;
    this.#sessions = new SessionRegistry(options);
    this.#adoption = options.adoption;
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
      adoption: this.#adoption,
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
   * request without an `id` member), which is run all the same.
   */
  async handle(request: Record<string, unknown>): Promise<Reply | null> {
    let reply: Reply;
    const id = request.id ?? null;
    try {
      reply = { jsonrpc: "2.0", id, result: await this.#run(request) };
    } catch (err) {
      reply = { jsonrpc: "2.0", id, error: toWireError(err) };
    }
    return "id" in request ? reply : null;
  }

  /** The connection is gone: park the session's task, or forget the session. */
  close(): void {
    this.#c.sessions.release(this.#c.session);
  }

  #run(
    request: Record<string, unknown>,
  ): Record<string, unknown> | Promise<Record<string, unknown>> {
    const method = request.method;
    if (method !== undefined && typeof method !== "string") {
      throw new HudProtocolError(
        ErrorCode.INVALID_REQUEST,
        "invalid request: method must be a string",
      );
    }
    const params = request.params ?? {};
    if (!isRecord(params)) {
      throw new HudProtocolError(ErrorCode.INVALID_PARAMS, "params must be an object");
    }
    const run = METHODS.get(method ?? "");
    if (run === undefined) {
      throw new HudProtocolError(ErrorCode.METHOD_NOT_FOUND, `method not found: ${method ?? ""}`);
    }
    return run(this.#c, params);
  }
}
