// The secret values this process knows, so that the redactor can hide them
// whatever their shape: a control token, a model's API key, the values of
// the environment variables whose names say secret (or that
// HUD_SECRET_ENV names), and what the author marks with markSecret().
// Patterns find secrets by their shape; this finds them by their value.

/** Values shorter than this are not held: hiding every "abc" would wreck the text. */
export const MIN_SECRET_LENGTH = 8;

/**
 * Tokens this SDK generates are 64 lowercase hex characters: they are kept
 * apart in a set and found by one scan for hex runs, so that a process that
 * makes a token per rollout (a runtime per placement) pays the same per
 * text for ten thousand of them as for one. The oldest are forgotten past
 * this many: by then the servers they opened are long closed.
 */
const MAX_HEX_TOKENS = 65_536;
const HEX_TOKEN = /^[0-9a-f]{64}$/;
const HEX_RUN = /[0-9a-f]{64,}/g;

/**
 * Environment variables whose values are secrets by their name alone:
 * `*_TOKEN`, `*_SECRET`, `*_PASSWORD`, `*_PASS`, `*_PWD` (not `PWD`),
 * `*_API_KEY`, `*_ACCESS_KEY`, `*_PRIVATE_KEY`, `*_CREDENTIALS`. Checked on
 * the upper-cased name.
 */
const SECRET_ENV_NAME =
  /(?:^|_)(?:[A-Z0-9]*TOKEN|[A-Z0-9]*SECRET|[A-Z0-9]*PASSWORD|PASSWD|PASSPHRASE|PASS|API_?KEY|ACCESS_?KEY|SECRET_?KEY|PRIVATE_?KEY|CREDENTIALS?)$|_PWD$/;
/** Names that look secret and are not: ssh's and git's askpass programs. */
const NOT_SECRET_ENV = /ASKPASS$/;
/** The variable that names more variables whose values are secrets (comma-separated). */
const SECRET_ENV_VARIABLE = "HUD_SECRET_ENV";

/** Whether an environment variable's name says its value is a secret. */
export function isSecretEnvName(name: string): boolean {
  const upper = name.toUpperCase();
  return SECRET_ENV_NAME.test(upper) && !NOT_SECRET_ENV.test(upper);
}

function escapeRegExp(text: string): string {
  return text.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
}

/**
 * A value and the forms it takes in text: percent-encoded (in a url) and
 * escaped as in a JSON string (in JSON held as text).
 */
function formsOf(value: string): string[] {
  const forms = new Set([value]);
  try {
    forms.add(encodeURIComponent(value));
  } catch {
    // A lone surrogate: no url form.
  }
  forms.add(JSON.stringify(value).slice(1, -1));
  return [...forms];
}

/** The registry: values to their kind, and the pattern that finds them. */
class SecretValues {
  readonly #hex = new Map<string, string>();
  readonly #other = new Map<string, string>();
  #pattern: RegExp | null = null;
  #envRead = false;

  /** Holds `value` as a secret of `kind`; `false` when it is too short to hold. */
  add(value: string, kind: string): boolean {
    if (typeof value !== "string" || value.length < MIN_SECRET_LENGTH) return false;
    if (HEX_TOKEN.test(value)) {
      // Re-adding moves it to the newest end.
      this.#hex.delete(value);
      this.#hex.set(value, kind);
      if (this.#hex.size > MAX_HEX_TOKENS) this.#hex.delete(this.#hex.keys().next().value!);
      return true;
    }
    for (const form of formsOf(value)) {
      if (!this.#other.has(form)) {
        this.#other.set(form, kind);
        this.#pattern = null;
      }
    }
    return true;
  }

  /** `text` with every held value replaced by `marker(kind)`. */
  redact(text: string, marker: (kind: string) => string): string {
    this.#readEnv();
    let out = text;
    if (this.#other.size > 0) {
      this.#pattern ??= new RegExp(
        // Longest first, so that a value holding another is replaced whole.
        [...this.#other.keys()].sort((a, b) => b.length - a.length).map(escapeRegExp).join("|"),
        "g",
      );
      out = out.replace(this.#pattern, (m) => marker(this.#other.get(m)!));
    }
    if (this.#hex.size > 0) out = this.#redactHex(out, marker);
    return out;
  }

  /** Every window of 64 in each hex run, looked up in the set. */
  #redactHex(text: string, marker: (kind: string) => string): string {
    return text.replace(HEX_RUN, (run) => {
      let out = "";
      let copied = 0;
      for (let i = 0; i + 64 <= run.length;) {
        const kind = this.#hex.get(run.slice(i, i + 64));
        if (kind === undefined) {
          i++;
          continue;
        }
        out += run.slice(copied, i) + marker(kind);
        i += 64;
        copied = i;
      }
      return copied === 0 ? run : out + run.slice(copied);
    });
  }

  /**
   * Once, at first use: the values of this process's environment variables
   * whose names say secret, and of those HUD_SECRET_ENV names. Without
   * `--allow-env`, none.
   */
  #readEnv(): void {
    if (this.#envRead) return;
    this.#envRead = true;
    let vars: Record<string, string>;
    try {
      vars = Deno.env.toObject();
    } catch {
      return;
    }
    const named = new Set(
      (vars[SECRET_ENV_VARIABLE] ?? "").split(",").map((n) => n.trim()).filter((n) => n !== ""),
    );
    for (const [name, value] of Object.entries(vars)) {
      if (named.has(name) || isSecretEnvName(name)) this.add(value, `value of ${name}`);
    }
  }
}

const registry = new SecretValues();

/**
 * Holds `value` as a secret of this process: the redactor replaces it,
 * wherever it appears and whatever its shape, by `[REDACTED kind]`.
 * Values shorter than {@linkcode MIN_SECRET_LENGTH} are not held.
 * @returns whether the value is held
 */
export function addSecretValue(value: string, kind: string): boolean {
  return registry.add(value, kind);
}

/** `text` with every secret value this process holds replaced by `marker(kind)`. */
export function redactSecretValues(text: string, marker: (kind: string) => string): string {
  return registry.redact(text, marker);
}
