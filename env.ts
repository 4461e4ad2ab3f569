/**
 * Environments and task templates.
 *
 * An {@linkcode Environment} holds capabilities (where an agent reaches a
 * shell, a browser...) and task templates. A template is an async generator:
 * its first `yield` is the prompt, the value sent back is the agent's answer,
 * and its second `yield` is the evaluation.
 *
 * @module
 */

import { Capability } from "./capability.ts";
import { TaskError } from "./errors.ts";
import { sha1Hex } from "./_internal/sha1.ts";
import { pyJson } from "./_internal/pyjson.ts";
import {
  type AnySchema,
  type ArgsShape,
  type InferArgs,
  type InputArgs,
  type JsonSchema,
  type LaxArgs,
  parseShape,
  shapeToJsonSchema,
} from "./schema.ts";
import { errorMessage, isRecord } from "./_internal/util.ts";
import { redactValues } from "./_internal/redact.ts";
import { ActiveTask, type PromptFrame, type TemplateBody, type TemplateRecord } from "./task.ts";

export { ActiveTask } from "./task.ts";
export type { GradeFrame, PromptFrame, TemplateBody } from "./task.ts";
export { markSecret } from "./_internal/redact.ts";

/** A task row: which template of which environment, with which arguments. */
export interface TaskRow {
  /** The environment's name. */
  env: string;
  /** The template id. */
  id: string;
  /** Arguments as given. */
  args: Record<string, unknown>;
  /** Stable key, equal to the HUD SDK's for the same id and args. */
  slug: string;
}

/** A `tasks.list` entry, in wire form. */
export interface TaskEntry {
  /** Template id. */
  id: string;
  /** What the task is about. */
  description: string;
  /** JSON Schema of the arguments. */
  args: JsonSchema;
  /** JSON Schema of the agent's input, when declared. */
  input?: JsonSchema;
  /** JSON Schema of the agent's answer, when declared. */
  returns?: JsonSchema;
}

/** What a template with a declared `returns` schema receives as its answer. */
export interface TypedAnswer<T> {
  /** The answer parsed into the declared type, or the raw value when that fails. */
  content: T;
  /** The answer as a string. */
  raw: string;
}

/**
 * Declaration of a template, for {@linkcode Environment.template}. `Extra`
 * and `Strict` are the literal types of `extraArgs` and `strict`, which
 * decide the type of the arguments the body receives.
 */
export interface TemplateSpec<
  S extends ArgsShape,
  Extra extends boolean = boolean,
  Strict extends boolean = boolean,
> {
  /** Unique id within the environment. */
  id: string;
  /**
   * What the task is about.
   * @default ""
   */
  description?: string;
  /**
   * Argument schemas. Omitted: the template takes no arguments (unless
   * `extraArgs` is set).
   * @default {}
   */
  args?: S;
  /**
   * Whether arguments beyond `args` are accepted, and passed to the body
   * unchanged; `tasks.list` then publishes `additionalProperties: true`.
   * With no `args`, this is how a template accepts any arguments.
   * @default false
   */
  extraArgs?: Extra;
  /**
   * Whether declared arguments are checked: a value that converts cleanly
   * to its type is converted (`"3"` to `3`), any other is refused with an
   * error naming the argument, the value and what was expected. `false`
   * converts the same values but passes the rest through unchanged, as the
   * HUD SDK does; the body then sees them as `unknown`.
   * @default true
   */
  strict?: Strict;
  /** Schema of the agent's input, published in `tasks.list`. */
  input?: AnySchema;
  /**
   * Schema of the agent's answer; the body then receives a
   * {@linkcode TypedAnswer} `{ content, raw }`. TypeScript cannot infer a
   * generator's input type from here: annotate the body's return type with
   * {@linkcode TemplateGenerator} to type the answer.
   */
  returns?: AnySchema;
}

/**
 * The return type to annotate a template body with, to type its answer: a
 * template with `returns: object({ n: integer() })` can declare
 * `async function* (): TemplateGenerator<TypedAnswer<{ n: number }>>`.
 * (TypeScript does not infer a generator's input type from the call.)
 */
export type TemplateGenerator<Answer = unknown> = AsyncGenerator<unknown, void, Answer>;

/**
 * The arguments a template body receives: the declared types when strict,
 * `unknown` values when lax, plus any other names when `extraArgs` is set.
 */
export type TemplateArgs<
  S extends ArgsShape,
  Extra extends boolean = false,
  Strict extends boolean = true,
> =
  & ([Strict] extends [true] ? InferArgs<S> : LaxArgs<S>)
  & ([Extra] extends [false] ? unknown : Record<string, unknown>);

/** Options for calling a template to mint a task row. */
export interface TaskRowOptions {
  /**
   * Overrides the computed slug.
   * @default the id, or `<id>-<8 hex of sha1(args)>` when there are args
   */
  slug?: string;
}

/** A registered template: call it with arguments to get a {@linkcode TaskRow}. */
export interface Template<S extends ArgsShape = ArgsShape, Extra extends boolean = boolean> {
  /**
   * Mints a task row. Arguments are checked as `tasks.start` checks them
   * (unknown, missing and, for a strict template, refused values); the row
   * keeps them as given.
   * @throws {TypeError} for unknown, missing or refused arguments
   */
  (
    args?: InputArgs<S> & ([Extra] extends [false] ? unknown : Record<string, unknown>),
    options?: TaskRowOptions,
  ): TaskRow;
  /** Template id. */
  readonly id: string;
  /** The environment it belongs to. */
  readonly env: Environment;
  /** What the task is about. */
  readonly description: string;
}

/** Options for {@linkcode Environment}'s constructor. */
export interface EnvironmentOptions {
  /**
   * Version published in the manifest.
   * @default "0.0.1"
   */
  version?: string;
  /**
   * Capabilities published from the start.
   * @default []
   */
  capabilities?: Capability[];
}

/**
 * Serves a capability's streams from this process: the control server hands
 * each `tunnel.open` for the capability straight to {@linkcode attach}
 * instead of dialling the capability's url. Such a capability has no port
 * of its own, so it is reachable only through the control channel (and its
 * token); its published url is a placeholder that clients never dial, since
 * they reach capabilities through their local forwarders.
 */
export interface CapabilityHandler {
  /**
   * Takes over one stream, after the server has sent the `tunnel.open`
   * reply. `head` holds the bytes the client sent right after its preface.
   * Resolve when done with the stream; the server closes `conn` then, and
   * on shutdown (which ends pending reads).
   */
  attach(conn: Deno.Conn, head: Uint8Array): Promise<void>;
}

/** A lifecycle hook. */
export type Hook = () => void | Promise<void>;

const encoder = new TextEncoder();

/**
 * The slug of a task row, computed as the HUD SDK does: the id when there
 * are no args, else `<id>-<first 8 hex of sha1(json.dumps(args, sort_keys=True))>`.
 *
 * @example
 * ```ts
 * import { taskSlug } from "./env.ts";
 * import assert from "node:assert/strict";
 *
 * assert.equal(taskSlug("add", { a: 1, b: 2 }), "add-1744f53e");
 * assert.equal(taskSlug("hello", {}), "hello");
 * ```
 */
export function taskSlug(id: string, args: Record<string, unknown>): string {
  if (Object.keys(args).length === 0) return id;
  return `${id}-${sha1Hex(encoder.encode(pyJson(args))).slice(0, 8)}`;
}

function quoteList(names: string[]): string {
  return names.map((n) => JSON.stringify(n)).join(", ");
}

function isAsyncGeneratorFunction(fn: unknown): boolean {
  return typeof fn === "function" && fn.constructor?.name === "AsyncGeneratorFunction";
}

// Rows minted from a live environment's templates, so that a taskset can run
// them in-process without being told where the environment is.
const rowOrigins = new WeakMap<TaskRow, Environment>();

/** The live environment a task row was minted from, if any. */
export function environmentOf(row: TaskRow): Environment | undefined {
  return rowOrigins.get(row);
}

type LifeState = "idle" | "starting" | "started" | "stopping";

/**
 * Checks a template's spec and body and makes its record.
 * @throws {TypeError} when `body` is not an async generator function, or
 *   the id is invalid or already in `templates`
 */
function templateRecord<S extends ArgsShape, Extra extends boolean, Strict extends boolean>(
  spec: TemplateSpec<S, Extra, Strict>,
  body: TemplateBody<TemplateArgs<S, Extra, Strict>, unknown>,
  envName: string,
  templates: ReadonlyMap<string, TemplateRecord>,
): TemplateRecord {
  if (!isRecord(spec) || typeof spec.id !== "string" || spec.id === "") {
    throw new TypeError("Cannot register template: id must be a non-empty string");
  }
  const id = spec.id;
  if (!isAsyncGeneratorFunction(body)) {
    throw new TypeError(
      `Cannot register template "${id}": body must be an async generator function (async function*)`,
    );
  }
  if (templates.has(id)) {
    throw new TypeError(
      `Cannot register template "${id}": environment "${envName}" already has a template with this id`,
    );
  }
  if (spec.args !== undefined && !isRecord(spec.args)) {
    throw new TypeError(`Cannot register template "${id}": args must be an object of schemas`);
  }
  for (const flag of ["extraArgs", "strict"] as const) {
    if (spec[flag] !== undefined && typeof spec[flag] !== "boolean") {
      throw new TypeError(`Cannot register template "${id}": "${flag}" must be a boolean`);
    }
  }
  return {
    id,
    description: spec.description ?? "",
    shape: spec.args ?? {},
    extraArgs: spec.extraArgs ?? false,
    strict: spec.strict ?? true,
    input: spec.input,
    returns: spec.returns,
    body: body as TemplateBody<Record<string, unknown>, unknown>,
  };
}

/**
 * An environment: a name, a version, capabilities, task templates and
 * lifecycle hooks.
 *
 * @example Declare a template and mint a task row
 * ```ts
 * import { Environment, integer } from "./mod.ts";
 * import assert from "node:assert/strict";
 *
 * const env = new Environment("demo", { version: "1.2.3" });
 * const add = env.template(
 *   { id: "add", args: { a: integer(), b: integer() } },
 *   async function* ({ a, b }) {
 *     const answer = yield `What is ${a} + ${b}?`;
 *     yield Number(answer) === a + b ? 1 : 0;
 *   },
 * );
 * assert.deepEqual(add({ a: 1, b: 2 }), { env: "demo", id: "add", args: { a: 1, b: 2 }, slug: "add-1744f53e" });
 *
 * const task = await env.startTask("add", { a: "1", b: 2 });
 * assert.equal(task.prompt.prompt, "What is 1 + 2?");
 * assert.deepEqual(await task.grade("3"), { score: 1 });
 * ```
 */
export class Environment {
  readonly #name: string;
  readonly #version: string;
  readonly #capabilities = new Map<string, Capability>();
  readonly #handlers = new Map<string, CapabilityHandler>();
  readonly #templates = new Map<string, TemplateRecord>();
  readonly #initHooks: Hook[] = [];
  readonly #shutdownHooks: Hook[] = [];
  #state: LifeState = "idle";
  #transition: Promise<void> = Promise.resolve();

  /**
   * Creates an environment.
   * @param name the environment's name, published in the manifest
   * @throws {TypeError} when the name or a capability is invalid
   */
  constructor(name = "environment", options: EnvironmentOptions = {}) {
    if (typeof name !== "string" || name === "") {
      throw new TypeError("Cannot create environment: name must be a non-empty string");
    }
    this.#name = name;
    this.#version = options.version ?? "0.0.1";
    for (const cap of options.capabilities ?? []) this.addCapability(cap);
  }

  /** The environment's name. */
  get name(): string {
    return this.#name;
  }

  /** The environment's version. */
  get version(): string {
    return this.#version;
  }

  /** Published capabilities, in the order they were added. */
  get capabilities(): readonly Capability[] {
    return [...this.#capabilities.values()];
  }

  /** Whether the initialize hooks have run and the environment is not stopped. */
  get started(): boolean {
    return this.#state === "started";
  }

  /**
   * Publishes a capability, replacing any with the same name.
   * @param capability what to publish
   * @param handler serves the capability's streams in this process (see
   *   {@linkcode CapabilityHandler}); without one, `tunnel.open` dials the
   *   capability's url
   * @throws {TypeError} when `capability` is not a {@linkcode Capability} with
   *   a url, or `handler` has no `attach` function
   */
  addCapability(capability: Capability, handler?: CapabilityHandler): void {
    if (!(capability instanceof Capability)) {
      throw new TypeError(`Cannot add capability to "${this.#name}": expected a Capability`);
    }
    if (!capability.url) {
      throw new TypeError(`Cannot add capability "${capability.name}": it has no url`);
    }
    if (handler !== undefined && typeof handler?.attach !== "function") {
      throw new TypeError(
        `Cannot add capability "${capability.name}": the handler must have an attach(conn, head) function`,
      );
    }
    this.#capabilities.set(capability.name, capability);
    if (handler) this.#handlers.set(capability.name, handler);
    else this.#handlers.delete(capability.name);
  }

  /** Withdraws a published capability (and its handler); returns whether there was one. */
  removeCapability(name: string): boolean {
    this.#handlers.delete(name);
    return this.#capabilities.delete(name);
  }

  /** The in-process handler of the capability published under `name`, if it has one. */
  capabilityHandler(name: string): CapabilityHandler | undefined {
    return this.#handlers.get(name);
  }

  /** The capability published under `name`. */
  capability(name: string): Capability | undefined {
    return this.#capabilities.get(name);
  }

  /** Registers a hook run by {@linkcode Environment.start}, in registration order. */
  initialize(hook: Hook): void {
    if (typeof hook !== "function") {
      throw new TypeError("Cannot register initialize hook: expected a function");
    }
    this.#initHooks.push(hook);
  }

  /** Registers a hook run by {@linkcode Environment.stop}, in reverse order. */
  shutdown(hook: Hook): void {
    if (typeof hook !== "function") {
      throw new TypeError("Cannot register shutdown hook: expected a function");
    }
    this.#shutdownHooks.push(hook);
  }

  /**
   * Runs the initialize hooks once. When a hook fails, the shutdown hooks run
   * (best effort) and the error is thrown. Idempotent.
   */
  start(): Promise<void> {
    this.#transition = this.#transition.then(async () => {
      if (this.#state === "started") return;
      this.#state = "starting";
      try {
        for (const hook of this.#initHooks) await hook();
      } catch (err) {
        await this.#runShutdownHooks().catch(() => {});
        this.#state = "idle";
        throw err;
      }
      this.#state = "started";
    });
    const done = this.#transition;
    this.#transition = done.catch(() => {});
    return done;
  }

  /**
   * Runs the shutdown hooks in reverse order, all of them even when some
   * fail. Idempotent.
   * @throws {AggregateError} listing the hooks' errors, after all have run
   */
  stop(): Promise<void> {
    this.#transition = this.#transition.then(async () => {
      if (this.#state !== "started") return;
      this.#state = "stopping";
      try {
        await this.#runShutdownHooks();
      } finally {
        this.#state = "idle";
      }
    });
    const done = this.#transition;
    this.#transition = done.catch(() => {});
    return done;
  }

  async #runShutdownHooks(): Promise<void> {
    const errors: unknown[] = [];
    for (const hook of [...this.#shutdownHooks].reverse()) {
      try {
        await hook();
      } catch (err) {
        errors.push(err);
      }
    }
    if (errors.length > 0) {
      throw new AggregateError(errors, `Cannot stop environment "${this.#name}" cleanly`);
    }
  }

  /**
   * Registers a task template.
   *
   * @param spec the id, argument schemas and description
   * @param body an async generator function: yield the prompt, receive the
   *   answer, yield the evaluation
   * @returns a function that mints task rows
   * @throws {TypeError} when `body` is not an async generator function, or
   *   the id is invalid or already registered
   */
  template<
    S extends ArgsShape = Record<never, never>,
    Extra extends boolean = false,
    Strict extends boolean = true,
  >(
    spec: TemplateSpec<S, Extra, Strict>,
    body: TemplateBody<TemplateArgs<S, Extra, Strict>, unknown>,
  ): Template<S, Extra> {
    const record = templateRecord(spec, body, this.#name, this.#templates);
    this.#templates.set(record.id, record);
    return this.#minter(record) as Template<S, Extra>;
  }

  /** The function that mints task rows of `record`, with its id, environment and description. */
  #minter(
    record: TemplateRecord,
  ): (args?: Record<string, unknown>, options?: TaskRowOptions) => TaskRow {
    const { id } = record;
    const envName = this.#name;
    const mint = (args?: Record<string, unknown>, options?: TaskRowOptions): TaskRow => {
      const given = (args ?? {}) as Record<string, unknown>;
      if (!isRecord(given)) {
        throw new TypeError(`Cannot create task "${id}": args must be an object`);
      }
      const checked = checkArgs(record, given);
      if (typeof checked === "string") {
        throw new TypeError(`Cannot create task "${id}": ${checked}`);
      }
      const row: TaskRow = {
        env: envName,
        id,
        args: { ...given },
        slug: options?.slug ?? taskSlug(id, given),
      };
      rowOrigins.set(row, this);
      return row;
    };
    Object.defineProperties(mint, {
      id: { value: id, enumerable: true },
      env: { value: this, enumerable: true },
      description: { value: record.description, enumerable: true },
    });
    return mint;
  }

  /** The `tasks.list` entries, in registration order. */
  listTasks(): TaskEntry[] {
    return [...this.#templates.values()].map((t) => {
      const entry: TaskEntry = {
        id: t.id,
        description: t.description,
        args: shapeToJsonSchema(t.shape, t.extraArgs),
      };
      if (t.input) entry.input = t.input.toJsonSchema();
      if (t.returns) entry.returns = t.returns.toJsonSchema();
      return entry;
    });
  }

  /** Whether a template with this id is registered. */
  hasTemplate(id: string): boolean {
    return this.#templates.has(id);
  }

  /**
   * Checks a task's template and arguments as {@linkcode startTask} does,
   * without running any task code: a taskset's rows, before any starts.
   *
   * @param id the template id
   * @param args the arguments
   * @throws {RangeError} for an id no template has
   * @throws {TypeError} for args that are not an object, or refused
   *   arguments (the message names each with its value and what was expected)
   */
  checkTask(id: string, args: unknown = {}): void {
    this.#prepare(id, args);
  }

  /** The template and the arguments its body receives, or the error startTask throws. */
  #prepare(
    id: string,
    args: unknown,
  ): { template: TemplateRecord; prepared: Record<string, unknown> } {
    const template = this.#templates.get(id);
    if (template === undefined) {
      throw new RangeError(`Cannot start task: unknown template ${JSON.stringify(id)}`);
    }
    if (args === null || args === undefined) args = {};
    if (!isRecord(args)) {
      throw new TypeError(`Cannot start task "${id}": args must be an object`);
    }
    const prepared = checkArgs(template, args);
    if (typeof prepared === "string") {
      throw new TypeError(`Cannot start task "${id}": ${prepared}`);
    }
    return { template, prepared };
  }

  /**
   * Starts a task in-process: checks the arguments (converting those that
   * convert cleanly, `"3"` to `3` for an integer), then runs the template
   * to its first `yield`. No task code runs when an argument is refused.
   *
   * @param id the template id
   * @param args the arguments
   * @returns the task waiting for its answer
   * @throws {RangeError} for an id no template has
   * @throws {TypeError} for args that are not an object, or refused
   *   arguments (unknown, missing, or of the wrong type: the message names
   *   each with its value and what was expected)
   * @throws {TaskError} when the task code throws, or returns before
   *   yielding a prompt
   */
  async startTask(id: string, args: unknown = {}): Promise<ActiveTask> {
    const { template, prepared } = this.#prepare(id, args);
    const gen = template.body(prepared) as AsyncGenerator<
      unknown,
      unknown,
      unknown
    >;
    let first: IteratorResult<unknown, unknown>;
    try {
      first = await gen.next();
    } catch (err) {
      // The message goes to the client: without the secrets this process holds.
      throw new TaskError(id, redactValues(errorMessage(err)), { cause: err });
    }
    if (first.done) {
      throw new TaskError(
        id,
        `Cannot start task "${id}": the template returned before yielding a prompt`,
      );
    }
    const value = first.value;
    const prompt: PromptFrame = isRecord(value) && "prompt" in value
      ? value as PromptFrame
      : { prompt: value === undefined ? null : value };
    return new ActiveTask(template, gen, prompt);
  }
}

/**
 * The arguments the body receives, or what is wrong with them as a message:
 * unknown and missing names, then each refused value with what was expected.
 */
function checkArgs(
  template: TemplateRecord,
  given: Record<string, unknown>,
): Record<string, unknown> | string {
  const shape = template.shape;
  const r = parseShape(shape, given, { strict: template.strict, extra: template.extraArgs });
  const problems: string[] = [];
  if (r.unknown.length > 0) problems.push(`unknown arguments ${quoteList(r.unknown)}`);
  if (r.missing.length > 0) problems.push(`missing arguments ${quoteList(r.missing)}`);
  if (problems.length > 0) {
    const names = Object.keys(shape);
    problems[problems.length - 1] += ` (expected ${
      names.length > 0 ? quoteList(names) : "no arguments"
    })`;
  }
  for (const issue of r.issues) {
    problems.push(`argument ${JSON.stringify(issue.path)} ${issue.message}`);
  }
  return problems.length > 0 ? problems.join("; ") : r.value;
}
