/**
 * A small schema vocabulary for template arguments: one declaration gives
 * the template typed arguments in TypeScript, the JSON Schema published in
 * `tasks.list`, and the checking applied at `tasks.start`.
 *
 * Checking is strict ({@linkcode Schema.parse}): a value of the declared
 * type is taken as is, a value that converts cleanly is converted (`"3"` to
 * `3` for an integer, `"true"` to `true` for a boolean, JSON text to an
 * array or object), and anything else is refused with a message naming what
 * was expected. Lax coercion ({@linkcode Schema.coerce}), for templates
 * declared `strict: false`, converts the same values and passes the rest
 * through unchanged, as the HUD SDK does.
 *
 * @example Declare arguments
 * ```ts
 * import { enumOf, integer, optional, string, withDefault } from "./schema.ts";
 * import assert from "node:assert/strict";
 *
 * const difficulty = withDefault(integer(), 1);
 * assert.deepEqual(difficulty.toJsonSchema(), { default: 1, type: "integer" });
 * assert.deepEqual(difficulty.parse("3"), { ok: true, value: 3 });
 * assert.equal(difficulty.parse("2.5").ok, false);
 * assert.equal(enumOf(["python", "shell"]).expected, 'one of "python", "shell"');
 * assert.deepEqual(optional(string()).parse(null), { ok: true, value: undefined });
 * ```
 *
 * @module
 */

import { isRecord } from "./_internal/util.ts";
import { stringifyJson } from "./_internal/framing.ts";

/** A JSON Schema object, as published on the wire. */
export type JsonSchema = { [key: string]: unknown };

/** Documentation fields every schema factory accepts. */
export interface SchemaOptions {
  /** Shown in the published JSON Schema. */
  description?: string;
  /** Overrides the title derived from the argument name. */
  title?: string;
}

/** One reason a value was refused. */
export interface SchemaIssue {
  /**
   * Where inside the value: `""` for the value itself, `"[2]"` for an array
   * item, `".depth"` for an object property (nested paths concatenate).
   */
  path: string;
  /** What is wrong, to follow the argument's name: `must be an integer, got "abc"`. */
  message: string;
}

/** The outcome of {@linkcode Schema.parse}: the checked value, or why it was refused. */
export type ParseResult<T> =
  | { ok: true; value: T }
  | { ok: false; issues: SchemaIssue[] };

/**
 * An argument type. `T` is the TypeScript type the template sees; `O` says
 * whether the argument may be left out.
 */
export interface Schema<T, O extends boolean = boolean> {
  /** The kind of value: `integer`, `number`, `string`, `boolean`, `enum`, `array`, `object`, `any`. */
  readonly kind: string;
  /** What the type accepts, in words: `an integer`, `one of "a", "b"`. */
  readonly expected: string;
  /** Whether the argument may be left out (or given as `null`). */
  readonly optional: O;
  /** Whether a default is filled in when the argument is left out. */
  readonly hasDefault: boolean;
  /** The default value, when {@linkcode Schema.hasDefault}. */
  readonly defaultValue: T | undefined;
  /** The JSON Schema for this type (without a title). */
  toJsonSchema(): JsonSchema;
  /**
   * Strict checking: the value when it has this type, converted when it
   * converts cleanly (see each factory), else the issues found.
   */
  parse(value: unknown): ParseResult<T>;
  /**
   * Lax coercion: converts what {@linkcode Schema.parse} converts and
   * returns anything else unchanged (array items and object properties one
   * by one).
   */
  coerce(value: unknown): unknown;
  /** Whether `value` already has this type, unconverted (used for `returns` parsing). */
  accepts(value: unknown): boolean;
  /** Phantom field carrying the TypeScript type; never set. */
  readonly __type?: T;
}

/** Any schema, whatever its value type. */
// deno-lint-ignore no-explicit-any
export type AnySchema = Schema<any, boolean>;

/** The TypeScript type a schema describes. */
export type Infer<S> = S extends Schema<infer T, boolean> ? T : never;

/** A record of argument schemas, keyed by argument name. */
export type ArgsShape = Record<string, AnySchema>;

/** Keys of a shape whose schemas are optional. */
export type OptionalKeys<S extends ArgsShape> = {
  [K in keyof S]: S[K] extends Schema<unknown, true> ? K : never;
}[keyof S];
/** Keys of a shape whose schemas are required. */
export type RequiredKeys<S extends ArgsShape> = Exclude<keyof S, OptionalKeys<S>>;

/**
 * The arguments object a strict template receives for a shape of schemas:
 * defaulted arguments are always present, optional ones may be absent.
 */
export type InferArgs<S extends ArgsShape> =
  & { [K in RequiredKeys<S>]: Infer<S[K]> }
  & { [K in OptionalKeys<S>]?: Infer<S[K]> };

/**
 * The arguments object a lax (`strict: false`) template receives: the same
 * names, but a value that did not convert is passed through as it came, so
 * nothing is known of its type.
 */
export type LaxArgs<S extends ArgsShape> =
  & { [K in RequiredKeys<S>]: unknown }
  & { [K in OptionalKeys<S>]?: unknown };

/** A schema with a default: callers may leave the argument out. */
export type DefaultedSchema<T> = Schema<T, false> & { readonly hasDefault: true };

/** Keys a caller may leave out: optional or defaulted. */
export type OmittableKeys<S extends ArgsShape> = {
  [K in keyof S]: S[K] extends Schema<unknown, true> ? K
    : S[K] extends { readonly hasDefault: true } ? K
    : never;
}[keyof S];

/**
 * The arguments a caller passes: defaulted arguments may be left out, and
 * optional ones left out or given as `null`.
 */
export type InputArgs<S extends ArgsShape> =
  & { [K in Exclude<keyof S, OmittableKeys<S>>]: Infer<S[K]> }
  & { [K in OptionalKeys<S>]?: Infer<S[K]> | null }
  & { [K in Exclude<OmittableKeys<S>, OptionalKeys<S>>]?: Infer<S[K]> };

/** A string holding JSON, parsed; anything else (or bad JSON) unchanged. */
function parseJsonText(value: unknown): unknown {
  if (typeof value !== "string") return value;
  try {
    return JSON.parse(value);
  } catch {
    return value;
  }
}

/** A value as shown in a message: JSON, cut at 80 characters. */
export function showValue(value: unknown): string {
  if (value === undefined) return "undefined";
  if (typeof value === "number" && !Number.isFinite(value)) return String(value);
  let text: string | undefined;
  try {
    text = stringifyJson(value);
  } catch {
    text = undefined;
  }
  text ??= String(value);
  return text.length > 80 ? `${text.slice(0, 77)}...` : text;
}

/** Defines an own, enumerable property: `__proto__` is a name like any other. */
export function setOwn(target: Record<string, unknown>, key: string, value: unknown): void {
  Object.defineProperty(target, key, {
    value,
    enumerable: true,
    writable: true,
    configurable: true,
  });
}

function ok<T>(value: T): ParseResult<T> {
  return { ok: true, value };
}

function refuse<T>(expected: string, got: unknown, hint = ""): ParseResult<T> {
  return {
    ok: false,
    issues: [{ path: "", message: `must be ${expected}, got ${showValue(got)}${hint}` }],
  };
}

interface SchemaParts {
  kind: string;
  expected: string;
  json: () => JsonSchema;
  parse: (v: unknown) => ParseResult<unknown>;
  /** Lax coercion; by default the value `parse` gives, or the input unchanged. */
  coerce?: (v: unknown) => unknown;
  accepts: (v: unknown) => boolean;
}

class BaseSchema<T, O extends boolean> implements Schema<T, O> {
  readonly kind: string;
  readonly expected: string;
  readonly optional: O;
  readonly hasDefault: boolean;
  readonly defaultValue: T | undefined;
  readonly #parts: SchemaParts;
  declare readonly __type?: T;

  constructor(parts: SchemaParts, optional: O, defaults?: { value: T }) {
    this.kind = parts.kind;
    this.expected = parts.expected;
    this.#parts = parts;
    this.optional = optional;
    this.hasDefault = defaults !== undefined;
    this.defaultValue = defaults?.value;
  }

  toJsonSchema(): JsonSchema {
    const schema = this.#parts.json();
    return this.hasDefault ? { default: this.defaultValue, ...schema } : schema;
  }

  parse(value: unknown): ParseResult<T> {
    // Optional means "may be left out": null says the same thing (as None does in Python).
    if (this.optional && (value === null || value === undefined)) return ok(undefined as T);
    return this.#parts.parse(value) as ParseResult<T>;
  }

  coerce(value: unknown): unknown {
    if (this.optional && value === null) return undefined;
    if (this.#parts.coerce) return this.#parts.coerce(value);
    const parsed = this.#parts.parse(value);
    return parsed.ok ? parsed.value : value;
  }

  accepts(value: unknown): boolean {
    if (this.optional && (value === null || value === undefined)) return true;
    return this.#parts.accepts(value);
  }

  /** Same type with another optionality and default (used by the wrappers). */
  derive<O2 extends boolean>(optional: O2, defaults?: { value: T }): BaseSchema<T, O2> {
    return new BaseSchema(this.#parts, optional, defaults);
  }
}

function docs(options: SchemaOptions | undefined): JsonSchema {
  const out: JsonSchema = {};
  if (options?.description !== undefined) out.description = options.description;
  if (options?.title !== undefined) out.title = options.title;
  return out;
}

const INTEGER_TEXT = /^\s*[-+]?\d+\s*$/;
const NUMBER_TEXT = /^\s*[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?\s*$/;

const SAFE_RANGE = `an integer from ${-Number.MAX_SAFE_INTEGER} to ${Number.MAX_SAFE_INTEGER}`;

/**
 * After a refused integer that a JavaScript number would round: the way to
 * pass it (PROTOCOL.md, "Argument checking").
 */
const ROUNDED = " (a JavaScript number would round it; an any() argument takes it exactly)";

/**
 * An integer, exactly: within ±(2^53−1), the integers a JavaScript number
 * holds without rounding. Also taken: a string of decimal digits with an
 * optional sign and surrounding blanks (`"3"`, `" -12 "`), and a `bigint`
 * in that range. Refused: fractions (`2.5`), other text (`"abc"`, `"2.5"`,
 * `"1e3"`, `""`), booleans, and integers beyond the range (a number there
 * may already be rounded; a `bigint` or digits there would be), with a
 * message that says so.
 */
export function integer(options?: SchemaOptions): Schema<number, false> {
  const expected = "an integer";
  return new BaseSchema<number, false>({
    kind: "integer",
    expected,
    json: () => ({ ...docs(options), type: "integer" }),
    parse: (v) => {
      if (typeof v === "number" && Number.isInteger(v)) {
        // Shown as the double's exact value, which tells of the rounding.
        return Number.isSafeInteger(v) ? ok(v) : refuse(SAFE_RANGE, BigInt(v), ROUNDED);
      }
      if (typeof v === "bigint") {
        const n = Number(v);
        return Number.isSafeInteger(n) ? ok(n) : refuse(SAFE_RANGE, v, ROUNDED);
      }
      if (typeof v === "string" && INTEGER_TEXT.test(v)) {
        const n = Number(v);
        return Number.isSafeInteger(n) ? ok(n) : refuse(SAFE_RANGE, v, ROUNDED);
      }
      return refuse(expected, v);
    },
    accepts: (v) => typeof v === "number" && Number.isSafeInteger(v),
  }, false);
}

/**
 * A finite number. Also taken: a string holding a decimal number, with
 * optional sign, fraction and exponent (`"2.5"`, `"-1e3"`), and a `bigint`
 * that a number holds exactly. Refused: NaN, infinities, other text
 * (`"0x10"`, `"Infinity"`, `""`), booleans, a `bigint` that would round.
 */
export function number(options?: SchemaOptions): Schema<number, false> {
  const expected = "a number";
  return new BaseSchema<number, false>({
    kind: "number",
    expected,
    json: () => ({ ...docs(options), type: "number" }),
    parse: (v) => {
      if (typeof v === "number" && Number.isFinite(v)) return ok(v);
      if (typeof v === "bigint") {
        // Beyond the doubles, Number() is Infinity, which BigInt() refuses.
        const n = Number(v);
        return Number.isFinite(n) && BigInt(n) === v ? ok(n) : refuse(expected, v, ROUNDED);
      }
      if (typeof v === "string" && NUMBER_TEXT.test(v)) {
        const n = Number(v);
        if (Number.isFinite(n)) return ok(n);
      }
      return refuse(expected, v);
    },
    accepts: (v) => typeof v === "number" && Number.isFinite(v),
  }, false);
}

/** A string. Nothing else converts: `7` is refused. */
export function string(options?: SchemaOptions): Schema<string, false> {
  const expected = "a string";
  return new BaseSchema<string, false>({
    kind: "string",
    expected,
    json: () => ({ ...docs(options), type: "string" }),
    parse: (v) => typeof v === "string" ? ok(v) : refuse(expected, v),
    accepts: (v) => typeof v === "string",
  }, false);
}

/**
 * A boolean. Also taken: the numbers `1` and `0`, and the strings `"true"`,
 * `"false"`, `"1"`, `"0"` in any case with surrounding blanks.
 */
export function boolean(options?: SchemaOptions): Schema<boolean, false> {
  const expected = "a boolean";
  return new BaseSchema<boolean, false>({
    kind: "boolean",
    expected,
    json: () => ({ ...docs(options), type: "boolean" }),
    parse: (v) => {
      if (typeof v === "boolean") return ok(v);
      if (v === 1 || v === 0) return ok(v === 1);
      if (typeof v === "string") {
        const s = v.trim().toLowerCase();
        if (s === "true" || s === "1") return ok(true);
        if (s === "false" || s === "0") return ok(false);
      }
      return refuse(expected, v);
    },
    accepts: (v) => typeof v === "boolean",
  }, false);
}

/** A JSON scalar usable in an enum. */
export type Literal = string | number | boolean | null;

function jsonType(v: Literal): string {
  if (v === null) return "null";
  if (typeof v === "number") return Number.isInteger(v) ? "integer" : "number";
  return typeof v;
}

/**
 * One of a fixed set of values. Also taken: a string holding JSON (`"3"`)
 * whose parsed value is in the set (when the string itself is not).
 * A refusal lists every allowed value.
 * @throws {TypeError} when `values` is empty
 */
export function enumOf<const V extends readonly Literal[]>(
  values: V,
  options?: SchemaOptions,
): Schema<V[number], false> {
  if (!Array.isArray(values) || values.length === 0) {
    throw new TypeError("Cannot create enum schema: values must be a non-empty array");
  }
  const types = [...new Set(values.map(jsonType))];
  const expected = `one of ${values.map((v) => JSON.stringify(v)).join(", ")}`;
  const has = (v: unknown) => values.includes(v as Literal);
  return new BaseSchema<V[number], false>({
    kind: "enum",
    expected,
    json: () => {
      const out: JsonSchema = { ...docs(options), enum: [...values] };
      if (types.length === 1) out.type = types[0];
      return out;
    },
    parse: (v) => {
      if (has(v)) return ok(v);
      const parsed = parseJsonText(v);
      return has(parsed) ? ok(parsed) : refuse(expected, v);
    },
    accepts: has,
  }, false);
}

/** Exactly one value (a one-member enum, published as `const`). */
export function literal<const V extends Literal>(
  value: V,
  options?: SchemaOptions,
): Schema<V, false> {
  const expected = `exactly ${JSON.stringify(value)}`;
  return new BaseSchema<V, false>({
    kind: "enum",
    expected,
    json: () => ({
      ...docs(options),
      const: value,
      ...(value === null ? {} : { type: jsonType(value) }),
    }),
    parse: (v) => {
      if (v === value) return ok(v);
      return parseJsonText(v) === value ? ok(value) : refuse(expected, v);
    },
    accepts: (v) => v === value,
  }, false);
}

/**
 * An array of `items`. Also taken: a string holding a JSON array. Each item
 * is checked (and converted) by `items`; refusals name the item's index.
 */
export function array<S extends AnySchema>(
  items: S,
  options?: SchemaOptions,
): Schema<Infer<S>[], false> {
  const expected = "an array";
  return new BaseSchema<Infer<S>[], false>({
    kind: "array",
    expected,
    json: () => ({ ...docs(options), items: items.toJsonSchema(), type: "array" }),
    parse: (v) => {
      const parsed = parseJsonText(v);
      if (!Array.isArray(parsed)) return refuse(expected, v);
      const out: unknown[] = [];
      const issues: SchemaIssue[] = [];
      parsed.forEach((x, i) => {
        const r = items.parse(x);
        if (r.ok) out.push(r.value);
        else for (const issue of r.issues) issues.push({ ...issue, path: `[${i}]${issue.path}` });
      });
      return issues.length > 0 ? { ok: false, issues } : ok(out);
    },
    coerce: (v) => {
      const parsed = parseJsonText(v);
      return Array.isArray(parsed) ? parsed.map((x) => items.coerce(x)) : v;
    },
    accepts: (v) => Array.isArray(v) && v.every((x) => items.accepts(x)),
  }, false);
}

/** What {@linkcode parseShape} found in an arguments object. */
export interface ShapeResult {
  /** The checked arguments: converted, defaults filled in, optional `null`s left out. */
  value: Record<string, unknown>;
  /** Names given that the shape does not declare (when extras are refused). */
  unknown: string[];
  /** Required names not given. */
  missing: string[];
  /** Values refused, each with the argument's name leading its path. */
  issues: SchemaIssue[];
}

/**
 * Checks an arguments object against a shape, looking names up as own
 * properties only (`constructor` and `__proto__` are names like any other).
 * With `strict`, values go through {@linkcode Schema.parse}; without, through
 * {@linkcode Schema.coerce} and are never refused. With `extra`, names the
 * shape does not declare are kept unchanged instead of being reported.
 */
export function parseShape(
  shape: ArgsShape,
  given: Record<string, unknown>,
  options: { strict: boolean; extra: boolean },
): ShapeResult {
  const result: ShapeResult = { value: {}, unknown: [], missing: [], issues: [] };
  for (const [name, schema] of Object.entries(shape)) {
    const present = Object.hasOwn(given, name) && given[name] !== undefined;
    if (!present) {
      if (schema.hasDefault) setOwn(result.value, name, structuredClone(schema.defaultValue));
      else if (!schema.optional) result.missing.push(name);
      continue;
    }
    const raw = given[name];
    let value: unknown;
    if (options.strict) {
      const parsed = schema.parse(raw);
      if (!parsed.ok) {
        for (const issue of parsed.issues) {
          result.issues.push({ ...issue, path: `${name}${issue.path}` });
        }
        continue;
      }
      value = parsed.value;
    } else {
      value = schema.coerce(raw);
    }
    if (value !== undefined) setOwn(result.value, name, value);
  }
  for (const [name, raw] of Object.entries(given)) {
    if (Object.hasOwn(shape, name)) continue;
    if (options.extra) setOwn(result.value, name, raw);
    else result.unknown.push(name);
  }
  return result;
}

function quoteNames(names: string[]): string {
  return names.map((n) => JSON.stringify(n)).join(", ");
}

/**
 * An object with the given properties, or any object when `shape` is
 * omitted. Also taken: a string holding a JSON object. With a shape, its
 * properties are checked as template arguments are: unknown and missing
 * properties are refused, defaults filled in, optional `null`s left out.
 */
export function object<S extends ArgsShape>(
  shape?: S,
  options?: SchemaOptions,
): Schema<InferArgs<S>, false> {
  const expected = "an object";
  return new BaseSchema<InferArgs<S>, false>({
    kind: "object",
    expected,
    json: () => {
      if (shape === undefined) {
        return { ...docs(options), additionalProperties: true, type: "object" };
      }
      return { ...docs(options), ...shapeToJsonSchema(shape, false) };
    },
    parse: (v) => {
      const parsed = parseJsonText(v);
      if (!isRecord(parsed)) return refuse(expected, v);
      if (shape === undefined) return ok(parsed);
      const r = parseShape(shape, parsed, { strict: true, extra: false });
      const issues = [...r.issues.map((i) => ({ ...i, path: `.${i.path}` }))];
      for (const name of r.missing) issues.push({ path: `.${name}`, message: "is required" });
      for (const name of r.unknown) {
        issues.push({
          path: `.${name}`,
          message: `is not a known property (known: ${quoteNames(Object.keys(shape)) || "none"})`,
        });
      }
      return issues.length > 0 ? { ok: false, issues } : ok(r.value);
    },
    coerce: (v) => {
      const parsed = parseJsonText(v);
      if (!isRecord(parsed)) return v;
      if (shape === undefined) return parsed;
      return parseShape(shape, parsed, { strict: false, extra: true }).value;
    },
    accepts: (v) =>
      isRecord(v) && (shape === undefined ||
        Object.entries(shape).every(([k, s]) =>
          !Object.hasOwn(v, k) || v[k] === undefined ? s.optional || s.hasDefault : s.accepts(v[k])
        )),
  }, false);
}

/** Any JSON value, published as a property with no `type`. */
export function any(options?: SchemaOptions): Schema<unknown, false> {
  return new BaseSchema<unknown, false>({
    kind: "any",
    expected: "any value",
    json: () => docs(options),
    parse: (v) => ok(v),
    accepts: () => true,
  }, false);
}

/**
 * The same type, but the argument may be left out; `null` counts as left
 * out (the template sees no such key).
 */
export function optional<T>(schema: Schema<T, boolean>): Schema<T | undefined, true> {
  return (schema as BaseSchema<T, boolean>).derive(true) as Schema<T | undefined, true>;
}

/** The same type, filled in with `value` when left out. Defaults are not validated. */
export function withDefault<T>(schema: Schema<T, boolean>, value: T): DefaultedSchema<T> {
  return (schema as BaseSchema<T, boolean>).derive(false, { value }) as DefaultedSchema<T>;
}

/** `max_steps` becomes `Max Steps`, as pydantic titles fields. */
export function titleOf(name: string): string {
  // Python's str.title(): upper-case a letter that follows a non-letter.
  const titled = name.replace(
    /[A-Za-z]+/g,
    (word) => word[0].toUpperCase() + word.slice(1).toLowerCase(),
  );
  return titled.replaceAll("_", " ");
}

/** The JSON Schema of an arguments object, in the shape `tasks.list` publishes. */
export function shapeToJsonSchema(shape: ArgsShape, additionalProperties: boolean): JsonSchema {
  const properties: Record<string, JsonSchema> = {};
  const required: string[] = [];
  for (const [name, schema] of Object.entries(shape)) {
    const json = schema.toJsonSchema();
    const { default: def, ...rest } = json;
    setOwn(properties, name, {
      ...("default" in json ? { default: def } : {}),
      title: titleOf(name),
      ...rest,
    });
    if (!schema.optional && !schema.hasDefault) required.push(name);
  }
  const out: JsonSchema = { properties };
  if (required.length > 0) out.required = required;
  out.type = "object";
  out.additionalProperties = additionalProperties;
  return out;
}
