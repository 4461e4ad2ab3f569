// A check of ATIF v1.4 trajectories, written from Harbor's RFC
// (docs/rfcs/0001-trajectory-format.md, "II. Schema"): every object's
// fields with their types and whether they are required, no other fields
// (Harbor's reference models forbid extra ones), and the rules the RFC's
// reference validator adds: step ids sequential from 1, fields only an
// agent step may have, observation results that name a tool call of their
// own step, tool call ids unique within a step, ISO 8601 timestamps. The
// RFC has no JSON Schema of its own, so this is the schema.

type Type = "string" | "integer" | "number" | "object" | "array" | "string|number";

interface Field {
  type: Type;
  required?: boolean;
  /** For objects: the fields; for arrays: the item's fields or type. */
  fields?: Record<string, Field>;
  items?: Field;
  enum?: readonly string[];
}

const obj = (fields: Record<string, Field>, required = false): Field => ({
  type: "object",
  fields,
  required,
});
const req = (type: Type, extra: Partial<Field> = {}): Field => ({ type, required: true, ...extra });
const opt = (type: Type, extra: Partial<Field> = {}): Field => ({ type, ...extra });
/** An object whose keys are free (every schema's `extra`). */
const free: Field = { type: "object" };

const TOOL_CALL = obj({
  tool_call_id: req("string"),
  function_name: req("string"),
  arguments: { type: "object", required: true },
});
const SUBAGENT_REF = obj({
  session_id: req("string"),
  trajectory_path: opt("string"),
  extra: free,
});
const OBSERVATION = obj({
  results: req("array", {
    items: obj({
      source_call_id: opt("string"),
      content: opt("string"),
      subagent_trajectory_ref: opt("array", { items: SUBAGENT_REF }),
    }),
  }),
});
const METRICS = obj({
  prompt_tokens: opt("integer"),
  completion_tokens: opt("integer"),
  cached_tokens: opt("integer"),
  cost_usd: opt("number"),
  prompt_token_ids: opt("array", { items: req("integer") }),
  completion_token_ids: opt("array", { items: req("integer") }),
  logprobs: opt("array", { items: req("number") }),
  extra: free,
});
const STEP = obj({
  step_id: req("integer"),
  timestamp: opt("string"),
  source: req("string", { enum: ["system", "user", "agent"] }),
  model_name: opt("string"),
  reasoning_effort: opt("string|number"),
  message: req("string"),
  reasoning_content: opt("string"),
  tool_calls: opt("array", { items: TOOL_CALL }),
  observation: OBSERVATION,
  metrics: METRICS,
  extra: free,
});
/** The root object of ATIF v1.4. */
export const ATIF_V1_4: Field = obj({
  schema_version: req("string", {
    enum: ["ATIF-v1.0", "ATIF-v1.1", "ATIF-v1.2", "ATIF-v1.3", "ATIF-v1.4"],
  }),
  session_id: req("string"),
  agent: obj({
    name: req("string"),
    version: req("string"),
    model_name: opt("string"),
    extra: free,
  }, true),
  steps: req("array", { items: STEP }),
  notes: opt("string"),
  final_metrics: obj({
    total_prompt_tokens: opt("integer"),
    total_completion_tokens: opt("integer"),
    total_cached_tokens: opt("integer"),
    total_cost_usd: opt("number"),
    total_steps: opt("integer"),
    extra: free,
  }),
  extra: free,
}, true);

function typeOk(value: unknown, type: Type): boolean {
  switch (type) {
    case "string":
      return typeof value === "string";
    case "integer":
      return Number.isInteger(value);
    case "number":
      return typeof value === "number" && Number.isFinite(value);
    case "string|number":
      return typeof value === "string" || (typeof value === "number" && Number.isFinite(value));
    case "object":
      return typeof value === "object" && value !== null && !Array.isArray(value);
    case "array":
      return Array.isArray(value);
  }
}

function checkField(value: unknown, field: Field, path: string, errors: string[]): void {
  if (!typeOk(value, field.type)) {
    errors.push(`${path}: expected ${field.type}, got ${JSON.stringify(value)}`);
    return;
  }
  if (field.enum && !field.enum.includes(value as string)) {
    errors.push(`${path}: ${JSON.stringify(value)} is not one of ${field.enum.join(", ")}`);
  }
  if (field.type === "object" && field.fields) {
    const o = value as Record<string, unknown>;
    for (const [name, f] of Object.entries(field.fields)) {
      if (!(name in o)) {
        if (f.required) errors.push(`${path}.${name}: required`);
        continue;
      }
      checkField(o[name], f, `${path}.${name}`, errors);
    }
    for (const name of Object.keys(o)) {
      if (!(name in field.fields)) errors.push(`${path}.${name}: not a field of ATIF v1.4`);
    }
  }
  if (field.type === "array" && field.items) {
    (value as unknown[]).forEach((v, i) => checkField(v, field.items!, `${path}[${i}]`, errors));
  }
}

const ISO_8601 = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:?\d{2})?$/;
const AGENT_ONLY = ["model_name", "reasoning_effort", "reasoning_content", "tool_calls", "metrics"];

/** What is wrong with `value` as an ATIF v1.4 trajectory; `[]` when nothing. */
export function atifProblems(value: unknown): string[] {
  const errors: string[] = [];
  checkField(value, ATIF_V1_4, "$", errors);
  if (errors.length > 0) return errors;
  const steps = (value as { steps: Record<string, unknown>[] }).steps;
  steps.forEach((step, i) => {
    const path = `$.steps[${i}]`;
    if (step.step_id !== i + 1) {
      errors.push(`${path}.step_id: expected ${i + 1} (sequential from 1), got ${step.step_id}`);
    }
    if (typeof step.timestamp === "string") {
      if (!ISO_8601.test(step.timestamp) || Number.isNaN(Date.parse(step.timestamp))) {
        errors.push(`${path}.timestamp: not ISO 8601: ${step.timestamp}`);
      }
    }
    if (step.source !== "agent") {
      for (const f of AGENT_ONLY) {
        if (f in step) errors.push(`${path}.${f}: only an agent step may have it`);
      }
    }
    const ids = new Set<string>();
    for (const call of (step.tool_calls ?? []) as { tool_call_id: string }[]) {
      if (ids.has(call.tool_call_id)) {
        errors.push(`${path}.tool_calls: duplicate tool_call_id ${call.tool_call_id}`);
      }
      ids.add(call.tool_call_id);
    }
    const observation = step.observation as { results: { source_call_id?: string }[] } | undefined;
    for (const [j, r] of (observation?.results ?? []).entries()) {
      if (r.source_call_id !== undefined && !ids.has(r.source_call_id)) {
        errors.push(
          `${path}.observation.results[${j}].source_call_id: ${r.source_call_id} is no tool call of this step`,
        );
      }
    }
  });
  return errors;
}
