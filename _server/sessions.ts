// The session registry: which sessions exist, which hold a task, which are
// parked (no live connection) and for how long. No sockets: a connection is
// only "live" or not, so the registry runs (and is tested) in-process.

import type { ActiveTask } from "../env.ts";
import { ErrorCode, HudProtocolError } from "../errors.ts";

/** One control session: its id, its task, whether a connection holds it. */
export interface Session {
  readonly id: string;
  /** A connection holds the session. */
  live: boolean;
  task: ActiveTask | null;
  expiry: ReturnType<typeof setTimeout> | undefined;
}

/** Limits and reporting of a {@linkcode SessionRegistry}. */
export interface SessionRegistryOptions {
  /** How long a parked task waits before it is cancelled, in ms. */
  parkedTtl: number;
  /** Most tasks parked at once. */
  maxParked: number;
  /** Reports a task cancelled because the parked cap was full. */
  onError: (error: unknown) => void;
}

/** `sess-` and 128 random bits as 32 hex characters. */
function newSessionId(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return "sess-" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

/**
 * Sessions by id, and the parked ones apart for O(1) adoption. Refusals are
 * protocol errors: these rules are the protocol's "Sessions" section.
 */
export class SessionRegistry {
  readonly #options: SessionRegistryOptions;
  readonly #sessions = new Map<string, Session>();
  /** Sessions holding a task with no live connection. */
  readonly #parked = new Set<Session>();
  #closing = false;

  constructor(options: SessionRegistryOptions) {
    this.#options = options;
  }

  /** Sessions, live or parked. */
  get size(): number {
    return this.#sessions.size;
  }

  /** Sessions holding a task with no live connection. */
  get parkedCount(): number {
    return this.#parked.size;
  }

  /** Whether {@linkcode close} was called: nothing parks any more. */
  get closing(): boolean {
    return this.#closing;
  }

  /** A new live session with a fresh id. */
  open(): Session {
    const session: Session = { id: newSessionId(), live: true, task: null, expiry: undefined };
    this.#sessions.set(session.id, session);
    return session;
  }

  /**
   * The parked session `id`, taken over by the connection that held
   * `current` (which is released). Messages never repeat a session id: ids
   * are known only to their owner.
   * @throws {HudProtocolError} `-32600` for an unknown session or one with a
   *   live connection
   */
  resume(current: Session, id: string): Session {
    const target = this.#sessions.get(id);
    if (target === undefined) {
      throw new HudProtocolError(
        ErrorCode.INVALID_REQUEST,
        "unknown session (it expired, was graded or cancelled, or never existed)",
      );
    }
    if (target.live) {
      throw new HudProtocolError(ErrorCode.INVALID_REQUEST, "session has a live connection");
    }
    clearTimeout(target.expiry);
    target.expiry = undefined;
    this.#parked.delete(target);
    target.live = true;
    this.release(current);
    return target;
  }

  /**
   * The connection holding `session` is gone: park the session when it
   * holds a task, forget it otherwise. Idempotent.
   */
  release(session: Session): void {
    if (!session.live) return;
    session.live = false;
    if (this.#closing) return;
    if (session.task === null || session.task.done) {
      this.#sessions.delete(session.id);
      return;
    }
    this.#park(session);
  }

  /**
   * Refuses a new task while the parked cap is full (a task started now
   * could not park).
   * @throws {HudProtocolError} `-32002`
   */
  checkRoomFor(templateId: string): void {
    if (this.#parked.size < this.#options.maxParked) return;
    throw new HudProtocolError(
      ErrorCode.LIMIT_EXCEEDED,
      `Cannot start task "${templateId}": ${this.#parked.size} tasks are parked, the server's limit (maxParked); grade or resume them, or wait for them to expire`,
    );
  }

  /** Takes the session's task away (to grade or cancel it), if it has one. */
  take(session: Session): ActiveTask | null {
    const task = session.task;
    session.task = null;
    return task;
  }

  /**
   * Gives `session` its new task. While closing, the task is cancelled
   * instead and the start refused.
   * @throws {HudProtocolError} `-32000 server is shutting down`
   */
  async hold(session: Session, task: ActiveTask): Promise<void> {
    if (this.#closing) {
      await task.cancel();
      throw new HudProtocolError(ErrorCode.SERVER_ERROR, "server is shutting down");
    }
    session.task = task;
  }

  /**
   * The task of the only parked session, which is forgotten (the split
   * "start here, grade from elsewhere" flow).
   * @throws {HudProtocolError} `-32600` when none or several are parked
   */
  adopt(): ActiveTask {
    const parked = this.#parked.size;
    if (parked === 0) {
      throw new HudProtocolError(ErrorCode.INVALID_REQUEST, "no task in progress");
    }
    // Counts only: which sessions are parked is for their owners to know.
    if (parked > 1) {
      throw new HudProtocolError(
        ErrorCode.INVALID_REQUEST,
        `${parked} parked sessions hold a task; resume yours with hello {"session_id": ...} before grading`,
      );
    }
    const owner: Session = this.#parked.values().next().value!;
    const task = owner.task!;
    owner.task = null;
    this.#forget(owner);
    return task;
  }

  /**
   * Stops parking and cancels every held task, live or parked; resolves
   * when their generators have closed.
   */
  close(): Promise<void>[] {
    this.#closing = true;
    const cancels: Promise<void>[] = [];
    for (const session of this.#sessions.values()) {
      clearTimeout(session.expiry);
      const task = this.take(session);
      if (task) cancels.push(task.cancel());
    }
    this.#sessions.clear();
    this.#parked.clear();
    return cancels;
  }

  /** Marks the registry closing without cancelling yet (connections wind down first). */
  beginClose(): void {
    this.#closing = true;
  }

  #park(session: Session): void {
    clearTimeout(session.expiry);
    if (this.#parked.size >= this.#options.maxParked) {
      this.#sessions.delete(session.id);
      void this.take(session)?.cancel();
      this.#options.onError(
        new Error(
          `Cannot park a task: ${this.#parked.size} tasks are parked, the limit (maxParked); cancelled it`,
        ),
      );
      return;
    }
    this.#parked.add(session);
    session.expiry = setTimeout(() => {
      if (session.live || this.#sessions.get(session.id) !== session) return;
      this.#forget(session);
      void this.take(session)?.cancel();
    }, this.#options.parkedTtl);
    Deno.unrefTimer(session.expiry);
  }

  #forget(session: Session): void {
    clearTimeout(session.expiry);
    session.expiry = undefined;
    this.#parked.delete(session);
    this.#sessions.delete(session.id);
  }
}
