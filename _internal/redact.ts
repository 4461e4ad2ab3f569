// Secrets in text: a private key pasted into a config, a token in a script,
// a command's output, a model's message. The file tracker runs every text
// file it diffs through it (credential-shaped file names are never read at
// all: filetracking/_rules.ts), and a trace every step it records, so that
// one redactor decides what a results file may hold.

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
 * `name = value` / `name: value` where the name says secret. The value is
 * replaced; the name stays so that the diff still shows which setting
 * changed. Found from each keyword forwards with a sticky, bounded pattern,
 * so that the work stays linear in the text.
 */
const SECRET_NAME =
  /secret|password|passwd|api[_-]?key|access[_-]?key|auth[_-]?token|access[_-]?token|private[_-]?key/gi;
const ASSIGNED_VALUE = /[A-Za-z0-9_.-]{0,64}["']?[ \t]{0,8}[:=][ \t]{0,8}["']?([^\s"'#,;]{8,512})/y;

function redactAssignments(text: string): string {
  let out = "";
  let copied = 0;
  SECRET_NAME.lastIndex = 0;
  for (let m = SECRET_NAME.exec(text); m !== null; m = SECRET_NAME.exec(text)) {
    const from = m.index + m[0].length;
    if (from < copied) continue;
    ASSIGNED_VALUE.lastIndex = from;
    const v = ASSIGNED_VALUE.exec(text);
    if (v === null) continue;
    const value = v[1];
    const end = ASSIGNED_VALUE.lastIndex;
    SECRET_NAME.lastIndex = end;
    // Already redacted, or a reference to a variable: kept.
    if (value.startsWith("[REDACTED") || /^\$\{?[A-Za-z_]/.test(value)) continue;
    out += text.slice(copied, end - value.length) + marker("value");
    copied = end;
  }
  return copied === 0 ? text : out + text.slice(copied);
}

/** `text` with private keys and tokens replaced by `[REDACTED kind]`. */
export function redactSecrets(text: string): string {
  let out = text.replace(PRIVATE_KEY, (_m, kind: string) => marker(kind));
  for (const [kind, pattern] of TOKENS) out = out.replace(pattern, marker(kind));
  return redactAssignments(out);
}

/**
 * `value` with every string in it (object keys too) through
 * {@linkcode redactSecrets}: a copy where something changed, the same value
 * where nothing did. What is walked is what `JSON.stringify` would write (an
 * object's `toJSON()`, own enumerable properties); nesting deeper than
 * `depth` is replaced by a note.
 */
export function redactDeep(value: unknown, depth = 64): unknown {
  if (typeof value === "string") return redactSecrets(value);
  if (typeof value !== "object" || value === null) return value;
  if (depth <= 0) return "[REDACTED nesting too deep]";
  if (Array.isArray(value)) {
    let out: unknown[] | null = null;
    for (let i = 0; i < value.length; i++) {
      const v = redactDeep(value[i], depth - 1);
      if (v !== value[i]) (out ??= value.slice())[i] = v;
    }
    return out ?? value;
  }
  // What JSON.stringify would write is what is walked: toJSON() first.
  const toJson = (value as { toJSON?: unknown }).toJSON;
  if (typeof toJson === "function") {
    const json = toJson.call(value);
    const redacted = redactDeep(json, depth - 1);
    return redacted === json ? value : redacted;
  }
  let changed = false;
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(value)) {
    const key = redactSecrets(k);
    const redacted = redactDeep(v, depth - 1);
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
