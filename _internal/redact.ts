// Secrets in text: a private key pasted into a config, a token in a script,
// a command's output, a model's message. The file tracker runs every text
// file it diffs through it (credential-shaped file names are never read at
// all: filetracking/_rules.ts), and a trace every step it records, so that
// one redactor decides what a results file may hold. It finds secrets by
// their shape, and by their value: those this process holds as secrets
// (secret_values.ts).

import { addSecretValue, MIN_SECRET_LENGTH, redactSecretValues } from "./secret_values.ts";
import { MAX_JSON_DEPTH } from "./framing.ts";

/** What replaces a secret: the kind is kept so that a reader knows what was there. */
function marker(kind: string): string {
  return `[REDACTED ${kind}]`;
}

const PRIVATE_KEY =
  /-----BEGIN ((?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?)-----[\s\S]*?(?:-----END \1-----|$)/g;

/** Token formats with a recognisable prefix, each bounded in length. */
const TOKENS: readonly [string, RegExp][] = [
  ["AWS access key id", /\b(?:AKIA|ASIA)[0-9A-Z]{16}\b/g],
  ["GitHub token", /\b(?:gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{22,255})\b/g],
  ["GitLab token", /\bglpat-[A-Za-z0-9_-]{20,64}\b/g],
  ["Slack token", /\bxox[abposr]-[A-Za-z0-9-]{10,255}\b/g],
  ["Anthropic key", /\bsk-ant-[A-Za-z0-9_-]{20,255}/g],
  ["OpenAI key", /\bsk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{20,255}/g],
  ["Google API key", /\bAIza[0-9A-Za-z_-]{35}\b/g],
  ["Stripe key", /\b(?:sk|rk)_(?:live|test)_[0-9A-Za-z]{16,255}\b/g],
  ["Hugging Face token", /\bhf_[A-Za-z0-9]{30,255}\b/g],
  ["npm token", /\bnpm_[A-Za-z0-9]{36}\b/g],
  // Only at the start of a run of base64url characters, and with atomic
  // runs (a lookahead captured then matched), so that the work stays linear.
  [
    "JSON web token",
    /(?<![A-Za-z0-9_-])eyJ(?=([A-Za-z0-9_-]{8,}))\1\.eyJ(?=([A-Za-z0-9_-]{8,}))\2\.(?=([A-Za-z0-9_-]{8,}))\3/g,
  ],
];

/**
 * `user:password@` in a url (`postgres://app:hunter2@db`, the control url's
 * `tcp://:TOKEN@host`): the password goes, the user stays. Anchored at
 * `://`, each match bounded, so that the work stays linear in the text.
 */
const URL_PASSWORD =
  /(?<=[A-Za-z][A-Za-z0-9+.-]{0,31}):\/\/([^\s:/?#@"'<>]{0,256}):([^\s/?#@"'<>]{1,1024})@/g;

/**
 * An `Authorization` header's credential, with or without its scheme
 * (`Authorization: Bearer ...`, `"Authorization": "Basic ..."`,
 * `Proxy-Authorization: ...`), and a `Bearer` credential anywhere else
 * (`curl -H "Bearer ..."`). The scheme stays.
 */
const AUTHORIZATION =
  /(\b(?:Proxy-)?Authorization\\?["']?[ \t]{0,8}[:=][ \t]{0,8}\\?["']?(?:[A-Za-z][A-Za-z0-9-]{0,20}[ \t]{1,8}(?=[^\s"'\\,;]{8}))?)([^\s"'\\,;]{8,4096})/gi;
const BEARER = /(\bBearer[ \t]{1,8})([A-Za-z0-9._~+/=-]{8,4096})/g;

/**
 * `name = value` / `name: value` / `"name": "value"` where the name says
 * secret. The value is replaced; the name stays so that a diff still shows
 * which setting changed. Two kinds of names: a word that says secret
 * wherever it is in the name (`password`, `api_key`, `client_secret`...; the
 * name may go on: `API_KEY_PROD=`), and a short word that says so only as
 * the name's last part (`*_TOKEN`, `DB_PASS`, `MYSQL_PWD`; not `tokenizer`,
 * `bypass`, `PWD`). Found from each keyword forwards with a sticky, bounded
 * pattern, so that the work stays linear in the text.
 */
const SECRET_NAME =
  /(secret|password|passwd|passphrase|api[_-]?key|access[_-]?key|auth[_-]?token|access[_-]?token|private[_-]?key|credentials?)|(?<![A-Za-z])(tokens?)|(?<![A-Za-z])(pass)|(?<=[_.-])(pwd)/gi;
/** What a value may be made of: a backslash only where it escapes no quote (JSON held as text). */
const VALUE = /((?:[^\s"'\\#,;]|\\(?!["'])){8,512})/.source;
const SEPARATOR = /\\?["']?[ \t]{0,8}[:=][ \t]{0,8}\\?["']?/.source;
/** After a word that may start a longer name. */
const NAME_GOES_ON = new RegExp(`[A-Za-z0-9_.-]{0,64}${SEPARATOR}${VALUE}`, "y");
/** After a word that must end the name. */
const NAME_ENDS = new RegExp(`${SEPARATOR}${VALUE}`, "y");

function redactAssignments(text: string): string {
  let out = "";
  let copied = 0;
  SECRET_NAME.lastIndex = 0;
  for (let m = SECRET_NAME.exec(text); m !== null; m = SECRET_NAME.exec(text)) {
    const from = m.index + m[0].length;
    if (from < copied) continue;
    const after = m[1] !== undefined ? NAME_GOES_ON : NAME_ENDS;
    after.lastIndex = from;
    const v = after.exec(text);
    if (v === null) continue;
    const value = v[1];
    const end = after.lastIndex;
    SECRET_NAME.lastIndex = end;
    // Already redacted, or a reference to a variable: kept. A count of tokens is no token.
    if (value.startsWith("[REDACTED") || /^\$\{?[A-Za-z_]/.test(value)) continue;
    if (m[2] !== undefined && /^[0-9]+$/.test(value)) continue;
    out += text.slice(copied, end - value.length) + marker("value");
    copied = end;
  }
  return copied === 0 ? text : out + text.slice(copied);
}

/**
 * `text` with secrets replaced by `[REDACTED kind]`: first the values this
 * process holds as secrets (its control tokens, its model keys, the values of
 * its secret-named environment variables, what {@linkcode markSecret} was
 * given), whatever their shape; then the shapes of secrets: private key
 * blocks, tokens of known formats, passwords in urls, `Authorization` and
 * `Bearer` credentials, and values assigned to secret-looking names.
 * Applying it twice changes nothing more.
 */
export function redactSecrets(text: string): string {
  let out = redactSecretValues(text, marker);
  out = out.replace(PRIVATE_KEY, (_m, kind: string) => marker(kind));
  for (const [kind, pattern] of TOKENS) out = out.replace(pattern, marker(kind));
  out = out.replace(URL_PASSWORD, (_m, user: string) => `://${user}:${marker("password")}@`);
  out = out.replace(
    AUTHORIZATION,
    (m, head: string, credential: string) =>
      credential.startsWith("[REDACTED") || credential.startsWith("$")
        ? m
        : head + marker("credential"),
  );
  out = out.replace(
    BEARER,
    (m, head: string, credential: string) =>
      credential.startsWith("[REDACTED") ? m : head + marker("credential"),
  );
  return redactAssignments(out);
}

/**
 * Holds `value` as a secret of this process: from now on results files,
 * traces, reports, trajectories and training rows written here never hold
 * it, whatever its shape; each place it was says `[REDACTED kind]`. The
 * SDK already holds its control tokens, its model backends' API keys and
 * the values of environment variables whose names say secret (`*_TOKEN`,
 * `*_SECRET`, `*_PASSWORD`, `*_API_KEY`...) or that `HUD_SECRET_ENV`
 * names (comma-separated); this is for the others.
 *
 * @param value the secret, at least 8 characters
 * @param kind what it is, shown in its place
 * @throws {RangeError} for a value shorter than 8 characters, which could not be hidden without
 *   hiding ordinary text
 *
 * @example
 * ```ts
 * import { markSecret } from "../env.ts";
 * import { Trace } from "../mod.ts";
 * import assert from "node:assert/strict";
 *
 * const key = "v3ry-own-shape-" + crypto.randomUUID();
 * markSecret(key, "weather service key");
 * const trace = new Trace();
 * trace.record("tool", `curl weather.example/today?k=${key}`);
 * assert.equal(trace.steps[0].content, "curl weather.example/today?k=[REDACTED weather service key]");
 * ```
 */
export function markSecret(value: string, kind = "secret"): void {
  if (typeof value !== "string" || value.length < MIN_SECRET_LENGTH) {
    throw new RangeError(
      `Cannot mark a secret: it must be a string of at least ${MIN_SECRET_LENGTH} characters, got ${
        typeof value === "string" ? `${value.length}` : typeof value
      }`,
    );
  }
  addSecretValue(value, kind);
}

/**
 * Members whose name says their value is secret (`token`, `password`,
 * `api_key`, `client_secret`, `*_token`...): their string values are
 * replaced whole, whatever their length. Matched on the whole name.
 */
const SECRET_MEMBER =
  /secret|password|passwd|passphrase|api[_-]?key|access[_-]?key|auth[_-]?token|access[_-]?token|private[_-]?key|credentials?|(?:^|[_.-])(?:token|pass)$|[_.-]pwd$/i;
const AUTHORIZATION_MEMBER = /^(?:proxy-)?authorization$/i;

/** A member's string value, redacted for its name. */
function redactMember(key: string, value: string): string {
  if (value === "" || value.startsWith("[REDACTED")) return value;
  if (AUTHORIZATION_MEMBER.test(key)) {
    const scheme = /^([A-Za-z][A-Za-z0-9-]{0,20}[ \t]+)\S/.exec(value);
    return (scheme?.[1] ?? "") + marker("credential");
  }
  if (SECRET_MEMBER.test(key)) return marker("value");
  return redactSecrets(value);
}

/** How the strings of a value are redacted: free text, and a member's string value. */
interface Redactor {
  text(text: string): string;
  member(key: string, value: string): string;
}

const BY_SHAPE_AND_VALUE: Redactor = { text: redactSecrets, member: redactMember };
const BY_VALUE: Redactor = { text: redactValues, member: (_key, value) => redactValues(value) };

/**
 * `value` with every string in it (object keys too) through
 * {@linkcode redactSecrets}, and the string values of members named like
 * secrets (`token`, `password`, `api_key`...) replaced whole: a copy where
 * something changed, the same value where nothing did. What is walked is
 * what `JSON.stringify` would write (an object's `toJSON()`, own enumerable
 * properties); nesting deeper than `depth` (by default what the wire
 * carries, so that nothing that came over it is cut) is replaced by a note.
 */
export function redactDeep(value: unknown, depth: number = MAX_JSON_DEPTH): unknown {
  return walk(value, BY_SHAPE_AND_VALUE, depth);
}

/** `text` with only the secret values this process holds replaced (no shapes). */
export function redactValues(text: string): string {
  return redactSecretValues(text, marker);
}

/**
 * {@linkcode redactDeep} by value only: what an environment sends out (a
 * grade, a task's error) loses the secrets its process holds, and nothing
 * else of what its author wrote changes.
 */
export function redactValuesDeep(value: unknown, depth: number = MAX_JSON_DEPTH): unknown {
  return walk(value, BY_VALUE, depth);
}

function walk(value: unknown, redactor: Redactor, depth: number): unknown {
  if (typeof value === "string") return redactor.text(value);
  if (typeof value !== "object" || value === null) return value;
  if (depth <= 0) return "[REDACTED nesting too deep]";
  if (Array.isArray(value)) {
    let out: unknown[] | null = null;
    for (let i = 0; i < value.length; i++) {
      const v = walk(value[i], redactor, depth - 1);
      if (v !== value[i]) (out ??= value.slice())[i] = v;
    }
    return out ?? value;
  }
  // What JSON.stringify would write is what is walked: toJSON() first.
  const toJson = (value as { toJSON?: unknown }).toJSON;
  if (typeof toJson === "function") {
    const json = toJson.call(value);
    const redacted = walk(json, redactor, depth - 1);
    return redacted === json ? value : redacted;
  }
  let changed = false;
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(value)) {
    const key = redactor.text(k);
    const redacted = typeof v === "string" ? redactor.member(k, v) : walk(v, redactor, depth - 1);
    if (key !== k || redacted !== v) changed = true;
    // defineProperty, so that a key named __proto__ stays a key.
    Object.defineProperty(out, key, {
      value: redacted,
      enumerable: true,
      writable: true,
      configurable: true,
    });
  }
  return changed ? out : value;
}
