// Test deadlines: every test body runs under a bound, and a test that runs
// out of time fails naming what it was waiting for, instead of hanging the
// suite until CI's own limit.
//
// `test()` (tests/_test.ts) gives every test it declares TEST_BOUND_MS
// unless the test declares its own with withDeadline(). Inside a test,
// `waitingFor(what, p)` names a pending operation and rejects when the
// test's deadline passes, and `testSignal()` is the signal to hand to library
// calls that take one. The resource and op sanitizers are on (deno.json):
// every timer here is cleared before the test ends.

/**
 * The bound for a test that declares none, in ms: 45 s, well under a
 * minute. `HUD_TEST_BOUND_MS` overrides it (up to 10 minutes), for a
 * machine known to be overloaded; declared bounds scale with it.
 */
export const TEST_BOUND_MS: number = boundFromEnv() ?? 45_000;

function boundFromEnv(): number | undefined {
  let text: string | undefined;
  try {
    text = Deno.env.get("HUD_TEST_BOUND_MS");
  } catch {
    return undefined; // no --allow-env
  }
  if (text === undefined || text === "") return undefined;
  const ms = Number(text);
  if (!(Number.isInteger(ms) && ms > 0 && ms <= 600_000)) {
    throw new RangeError(`Invalid HUD_TEST_BOUND_MS: "${text}" (expected ms, up to 600000)`);
  }
  return ms;
}

/** How much longer than 45 s the default bound is; declared bounds follow. */
const SCALE = TEST_BOUND_MS / 45_000;

/** How long a timed-out test gets to run its `finally` blocks, in ms. */
const GRACE_MS = 5_000;

/** What a running test is waiting for, and the signal that ends it. */
interface Running {
  name: string;
  ms: number;
  controller: AbortController;
  pending: Map<number, string>;
}

let current: Running | null = null;
let nextId = 0;
const BOUNDED = Symbol("bounded");

/** A test body, as `Deno.test` takes it. */
export type TestFn = (t: Deno.TestContext) => void | Promise<void>;

/** A timeout of a test or of one operation in it. */
export class DeadlineError extends Error {
  /** Creates the error; the message names what the test waited for. */
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "DeadlineError";
  }
}

function describePending(run: Running): string {
  const pending = [...run.pending.values()];
  return pending.length
    ? `waiting for ${pending.map((p) => `"${p}"`).join(", ")}`
    : "waiting on nothing named (wrap the slow call in waitingFor())";
}

/**
 * What a bounded test must undo whatever happens to its body (daemons,
 * namespaces, firewall rules): run after the body settles, or at once when
 * the deadline passes, before the test reports, within its own bound.
 */
export interface Teardown {
  /** Undoes what the test set up; must itself be bounded and idempotent. */
  teardown: () => Promise<void>;
  /** How long the teardown may take, in ms. */
  teardownMs: number;
}

async function runBounded(
  name: string,
  ms: number,
  fn: TestFn,
  t: Deno.TestContext,
  teardown?: Teardown,
) {
  const outer = current;
  const run: Running = { name, ms, controller: new AbortController(), pending: new Map() };
  current = run;
  let timer: ReturnType<typeof setTimeout> | undefined;
  let grace: ReturnType<typeof setTimeout> | undefined;
  const body = (async () => await fn(t))();
  const timedOut = new Promise<"timeout">((resolve) => {
    timer = setTimeout(() => resolve("timeout"), ms);
  });
  try {
    const first = await Promise.race([body.then(() => "done" as const), timedOut]);
    if (first === "done") return;
    const error = new DeadlineError(
      `Test "${name}" ran out of its ${ms} ms bound, ${describePending(run)}`,
    );
    run.controller.abort(error);
    // Let the body's finally blocks end its children and sockets.
    const settled = await Promise.race([
      body.then(() => true, () => true),
      new Promise<boolean>((resolve) => grace = setTimeout(() => resolve(false), GRACE_MS)),
    ]);
    if (!settled) error.message += ` (and it did not wind down within ${GRACE_MS} ms)`;
    throw error;
  } finally {
    clearTimeout(timer);
    clearTimeout(grace);
    current = outer;
    if (teardown) await runTeardown(name, teardown);
  }
}

async function runTeardown(name: string, { teardown, teardownMs }: Teardown): Promise<void> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  try {
    const ended = await Promise.race([
      teardown().then(() => true),
      new Promise<boolean>((resolve) => timer = setTimeout(() => resolve(false), teardownMs)),
    ]);
    if (!ended) {
      throw new DeadlineError(`Test "${name}": its teardown did not end within ${teardownMs} ms`);
    }
  } finally {
    clearTimeout(timer);
  }
}

/**
 * Bounds a test body: after `ms` it fails, naming the operations it was
 * waiting for. Use for tests that should finish well before TEST_BOUND_MS.
 * `teardown` runs after the body, or as soon as the deadline has passed and
 * the body had its grace, so that what the test started outside this process
 * is undone before the test (and perhaps the run) ends.
 */
export function withDeadline(ms: number, fn: TestFn, teardown?: Teardown): TestFn {
  if (!(ms > 0 && ms < 60_000)) throw new RangeError(`Invalid test bound: ${ms} ms`);
  const scaled = Math.max(ms, Math.round(ms * SCALE));
  const bounded = (t: Deno.TestContext) => runBounded(t.name, scaled, fn, t, teardown);
  return Object.assign(bounded, { [BOUNDED]: true });
}

/**
 * The running test's deadline as a signal (aborts with a DeadlineError),
 * for library calls that take `signal`. Outside a test, never aborts.
 */
export function testSignal(): AbortSignal {
  return current?.controller.signal ?? new AbortController().signal;
}

/**
 * Awaits `promise` as the named operation: if the test's deadline or
 * `ms` passes first, rejects with an error naming `what`. `onTimeout` runs
 * then (close what the promise waits on, so it settles too).
 */
export function waitingFor<T>(
  what: string,
  promise: Promise<T>,
  options: { ms?: number; onTimeout?: () => void } = {},
): Promise<T> {
  const run = current;
  const id = ++nextId;
  run?.pending.set(id, what);
  const signal = run?.controller.signal;
  return new Promise<T>((resolve, reject) => {
    let timer: ReturnType<typeof setTimeout> | undefined;
    const done = () => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
      run?.pending.delete(id);
    };
    const fail = (error: Error) => {
      done();
      promise.catch(() => {});
      try {
        options.onTimeout?.();
      } finally {
        reject(error);
      }
    };
    const onAbort = () => fail(new DeadlineError(`Timed out waiting for ${what}`));
    if (signal?.aborted) return onAbort();
    signal?.addEventListener("abort", onAbort, { once: true });
    if (options.ms !== undefined) {
      timer = setTimeout(
        () => fail(new DeadlineError(`Timed out after ${options.ms} ms waiting for ${what}`)),
        options.ms,
      );
    }
    promise.then((v) => {
      done();
      resolve(v);
    }, (e) => {
      done();
      reject(e);
    });
  });
}

/**
 * A test function under the default bound (TEST_BOUND_MS), unless
 * withDeadline() already gave it one. `test()` in tests/_test.ts applies it
 * to every test it declares.
 */
export function withDefaultDeadline(name: string, fn: TestFn): TestFn {
  if ((fn as { [BOUNDED]?: boolean })[BOUNDED]) return fn;
  return (t) => runBounded(name, TEST_BOUND_MS, fn, t);
}
