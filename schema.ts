/**
 * A small schema vocabulary for template arguments: one declaration gives
 * the template typed arguments in TypeScript, the JSON Schema published in
 * `tasks.list`, and the lax coercion applied at `tasks.start`.
 *
 * @example Declare arguments
 * ```ts
 * import { integer, optional, string, withDefault } from "./schema.ts";
 * import assert from "node:assert/strict";
 *
 * const difficulty = withDefault(integer(), 1);
 * assert.deepEqual(difficulty.toJsonSchema(), { default: 1, type: "integer" });
 * assert.equal(difficulty.coerce("3"), 3);
 * assert.equal(optional(string()).optional, true);
 * ```
 *
 * @module
 */

import { isRecord } from "./_internal/util.ts";

/** A JSON Schema object, as published on the wire. */
export type JsonSchema = { [key: string]: unknown };

/** Documentation fields every schema factory accepts. */
export interface SchemaOptions {
  /** Shown in the published JSON Schema. */
  description?: string;
  /** Overrides the title derived from the argument name. */
  title?: string;
}

/**
 * An argument type. `T` is the TypeScript type the template sees; `O` says
 * whether the argument may be left out.
 */
export interface Schema<T, O extends boolean = boolean> {
  /** The kind of value: `integer`, `number`, `string`, `boolean`, `enum`, `array`, `object`, `any`. */
  readonly kind: string;
  /** Whether the argument may be left out. */
  readonly optional: O;
  /** Whether a default is filled in when the argument is left out. */
  readonly hasDefault: boolean;
  /** The default value, when {@linkcode Schema.hasDefault}. */
  readonly defaultValue: T | undefined;
  /** The JSON Schema for this type (without a title). */
  toJsonSchema(): JsonSchema;
  /**
   * Lax coercion: `"3"` to `3` for an integer, JSON text to an object or
   * array. A value that cannot be coerced is returned unchanged.
   */
  coerce(value: unknown): unknown;
  /** Whether `value` already has this type (used for `returns` parsing). */
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

/** The arguments object a template receives for a shape of schemas. */
export type InferArgs<S extends ArgsShape> =
  & { [K in RequiredKeys<S>]: Infer<S[K]> }
  & { [K in OptionalKeys<S>]?: Infer<S[K]> };

/** A schema with a default: callers may leave the argument out. */
export type DefaultedSchema<T> = Schema<T, false> & { readonly hasDefault: true };

/** Keys a caller may leave out: optional or defaulted. */
export type OmittableKeys<S extends ArgsShape> = {
  [K in keyof S]: S[K] extends Schema<unknown, true> ? K
    : S[K] extends { readonly hasDefault: true } ? K
    : never;
}[keyof S];

/** The arguments a caller passes: defaulted arguments may be left out too. */
export type InputArgs<S extends ArgsShape> =
  & { [K in Exclude<keyof S, OmittableKeys<S>>]: Infer<S[K]> }
  & { [K in OmittableKeys<S>]?: Infer<S[K]> };

function parseJsonText(value: unknown): unknown {
  if (typeof value !== "string") return value;
  try {
    return JSON.parse(value);
  } catch {
    return value;
  }
}

class BaseSchema<T, O extends boolean> implements Schema<T, O> {
  readonly kind: string;
  readonly optional: O;
  readonly hasDefault: boolean;
  readonly defaultValue: T | undefined;
  readonly #json: () => JsonSchema;
  readonly #coerce: (v: unknown) => unknown;
  readonly #accepts: (v: unknown) => boolean;
  declare readonly __type?: T;

  constructor(
    kind: string,
    json: () => JsonSchema,
    coerce: (v: unknown) => unknown,
    accepts: (v: unknown) => boolean,
    optional: O,
    defaults?: { value: T },
  ) {
    this.kind = kind;
    this.#json = json;
    this.#coerce = coerce;
    this.#accepts = accepts;
    this.optional = optional;
    this.hasDefault = defaults !== undefined;
    this.defaultValue = defaults?.value;
  }

  toJsonSchema(): JsonSchema {
    const schema = this.#json();
    return this.hasDefault ? { default: this.defaultValue, ...schema } : schema;
  }

  coerce(value: unknown): unknown {
    return this.#coerce(value);
  }

  accepts(value: unknown): boolean {
    return this.#accepts(value);
  }

  /** Same type with another optionality and default (used by the wrappers). */
  derive<O2 extends boolean>(optional: O2, defaults?: { value: T }): BaseSchema<T, O2> {
    return new BaseSchema(this.kind, this.#json, this.#coerce, this.#accepts, optional, defaults);
  }
}

function docs(options: SchemaOptions | undefined): JsonSchema {
  const out: JsonSchema = {};
  if (options?.description !== undefined) out.description = options.description;
  if (options?.title !== undefined) out.title = options.title;
  return out;
}

/** An integer. `"3"` coerces to `3`. */
export function integer(options?: SchemaOptions): Schema<number, false> {
  return new BaseSchema<number, false>(
    "integer",
    () => ({ ...docs(options), type: "integer" }),
    (v) => {
      if (typeof v === "string" && /^\s*[-+]?\d+\s*$/.test(v)) return Number(v);
      if (typeof v === "number" && Number.isInteger(v)) return v;
      return v;
    },
    (v) => typeof v === "number" && Number.isInteger(v),
    false,
  );
}

/** A number. `"2.5"` coerces to `2.5`. */
export function number(options?: SchemaOptions): Schema<number, false> {
  return new BaseSchema<number, false>(
    "number",
    () => ({ ...docs(options), type: "number" }),
    (v) => {
      if (typeof v === "string" && v.trim() !== "" && Number.isFinite(Number(v))) return Number(v);
      return v;
    },
    (v) => typeof v === "number",
    false,
  );
}

/** A string. */
export function string(options?: SchemaOptions): Schema<string, false> {
  return new BaseSchema<string, false>(
    "string",
    () => ({ ...docs(options), type: "string" }),
    (v) => v,
    (v) => typeof v === "string",
    false,
  );
}

/** A boolean. `"true"`/`"false"` (any case) and `"1"`/`"0"` coerce. */
export function boolean(options?: SchemaOptions): Schema<boolean, false> {
  return new BaseSchema<boolean, false>(
    "boolean",
    () => ({ ...docs(options), type: "boolean" }),
    (v) => {
      if (typeof v !== "string") return v;
      const s = v.trim().toLowerCase();
      if (s === "true" || s === "1") return true;
      if (s === "false" || s === "0") return false;
      return v;
    },
    (v) => typeof v === "boolean",
    false,
  );
}

/** A JSON scalar usable in an enum. */
export type Literal = string | number | boolean | null;

function jsonType(v: Literal): string {
  if (v === null) return "null";
  if (typeof v === "number") return Number.isInteger(v) ? "integer" : "number";
  return typeof v;
}

/**
 * One of a fixed set of values. A string holding JSON (`"3"`) is parsed when
 * the set has no such string but has the parsed value.
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
  return new BaseSchema<V[number], false>(
    "enum",
    () => {
      const out: JsonSchema = { ...docs(options), enum: [...values] };
      if (types.length === 1) out.type = types[0] === "integer" ? "integer" : types[0];
      return out;
    },
    (v) => {
      if (values.includes(v as Literal)) return v;
      const parsed = parseJsonText(v);
      return values.includes(parsed as Literal) ? parsed : v;
    },
    (v) => values.includes(v as Literal),
    false,
  );
}

/** Exactly one value (a one-member enum, published as `const`). */
export function literal<const V extends Literal>(
  value: V,
  options?: SchemaOptions,
): Schema<V, false> {
  const inner = enumOf([value] as const, options);
  return new BaseSchema<V, false>(
    "enum",
    () => ({
      ...docs(options),
      const: value,
      ...(value === null ? {} : { type: jsonType(value) }),
    }),
    (v) => inner.coerce(v),
    (v) => v === value,
    false,
  );
}

/** An array of `items`. JSON text coerces; each item is coerced too. */
export function array<S extends AnySchema>(
  items: S,
  options?: SchemaOptions,
): Schema<Infer<S>[], false> {
  return new BaseSchema<Infer<S>[], false>(
    "array",
    () => ({ ...docs(options), items: items.toJsonSchema(), type: "array" }),
    (v) => {
      const parsed = parseJsonText(v);
      return Array.isArray(parsed) ? parsed.map((x) => items.coerce(x)) : v;
    },
    (v) => Array.isArray(v) && v.every((x) => items.accepts(x)),
    false,
  );
}

/**
 * An object with the given properties, or any object when `shape` is
 * omitted. JSON text coerces; known properties are coerced too.
 */
export function object<S extends ArgsShape>(
  shape?: S,
  options?: SchemaOptions,
): Schema<InferArgs<S>, false> {
  return new BaseSchema<InferArgs<S>, false>(
    "object",
    () => {
      if (shape === undefined) {
        return { ...docs(options), additionalProperties: true, type: "object" };
      }
      return { ...docs(options), ...shapeToJsonSchema(shape, false) };
    },
    (v) => {
      const parsed = parseJsonText(v);
      if (!isRecord(parsed)) return v;
      if (shape === undefined) return parsed;
      const out: Record<string, unknown> = {};
      for (const [k, x] of Object.entries(parsed)) out[k] = shape[k] ? shape[k].coerce(x) : x;
      return out;
    },
    (v) =>
      isRecord(v) && (shape === undefined ||
        Object.entries(shape).every(([k, s]) =>
          v[k] === undefined ? s.optional || s.hasDefault : s.accepts(v[k])
        )),
    false,
  );
}

/** Any JSON value, published as a property with no `type`. */
export function any(options?: SchemaOptions): Schema<unknown, false> {
  return new BaseSchema<unknown, false>(
    "any",
    () => docs(options),
    (v) => v,
    () => true,
    false,
  );
}

/** The same type, but the argument may be left out. */
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
    properties[name] = {
      ...("default" in json ? { default: def } : {}),
      title: titleOf(name),
      ...rest,
    };
    if (!schema.optional && !schema.hasDefault) required.push(name);
  }
  const out: JsonSchema = { properties };
  if (required.length > 0) out.required = required;
  out.type = "object";
  out.additionalProperties = additionalProperties;
  return out;
}
