// The values of a Harbor task's compose file that need more than a type check
// (harbor/_compose.ts): paths folded, commands split into words, durations,
// and `${VAR}` interpolation. Each refuses what it cannot read through
// `refuse`, which throws.

import { isRecord } from "../_internal/util.ts";

/** Throws the reason given, naming the feature (`ComposeRefusal`). */
export type Refuse = (what: string) => never;

/** `rel` resolved against `dir`, `.` and `..` folded (no file system look-up). */
export function resolveIn(dir: string, rel: string): string {
  const parts: string[] = [];
  for (const part of (rel.startsWith("/") ? rel : `${dir}/${rel}`).split("/")) {
    if (part === "" || part === ".") continue;
    if (part === "..") parts.pop();
    else parts.push(part);
  }
  return `/${parts.join("/")}`;
}

/** Whether `path` is `dir` or lies under it (both folded). */
export function inside(path: string, dir: string): boolean {
  return path === dir || path.startsWith(`${dir}/`);
}

/** A command as a list, a string split as compose splits it (shell words, no shell). */
export function words(v: unknown, key: string, refuse: Refuse): string[] | null {
  if (v === undefined || v === null) return null;
  if (Array.isArray(v)) {
    if (v.some((w) => typeof w === "object")) refuse(`"${key}" must be a list of strings`);
    return v.map(String);
  }
  if (typeof v !== "string") return refuse(`"${key}" must be a string or a list`);
  const out: string[] = [];
  let word: string | null = null;
  let quote = "";
  for (let i = 0; i < v.length; i++) {
    const c = v[i];
    if (quote) {
      if (c === quote) quote = "";
      else if (c === "\\" && quote === '"' && i + 1 < v.length) word += v[++i];
      else word += c;
    } else if (c === '"' || c === "'") {
      quote = c;
      word ??= "";
    } else if (/\s/.test(c)) {
      if (word !== null) out.push(word);
      word = null;
    } else if (c === "\\" && i + 1 < v.length) word = (word ?? "") + v[++i];
    else word = (word ?? "") + c;
  }
  if (quote) refuse(`"${key}": unterminated quote`);
  if (word !== null) out.push(word);
  return out;
}

/** A compose duration ("1m30s", "500ms", "10s") in ms. */
export function duration(v: unknown, key: string, fallback: number, refuse: Refuse): number {
  if (v === undefined || v === null) return fallback;
  const text = String(v);
  const units: Record<string, number> = { h: 3_600_000, m: 60_000, s: 1000, ms: 1, us: 0.001 };
  let ms = 0;
  const rest = text.replace(/(\d+(?:\.\d+)?)(ms|us|h|m|s)/g, (_, n, u) => {
    ms += Number(n) * units[u];
    return "";
  });
  if (rest !== "" || text === "") {
    refuse(`healthcheck "${key}": "${text}" is not a duration like "5s"`);
  }
  return ms;
}

/** `${VAR}`, `${VAR:-default}`, `${VAR-default}` and `$VAR` replaced from `vars`; `$$` is `$`. */
export function interpolate(
  v: unknown,
  vars: Record<string, string>,
  refuse: Refuse,
): unknown {
  if (typeof v === "string") {
    return v.replace(
      /\$(\$|\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?-)([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))/g,
      (all, dollar, braced, op, fallback, bare) => {
        if (dollar === "$") return "$";
        const name = braced ?? bare;
        const value = vars[name];
        if (op === ":-" && !value) return fallback;
        if (op === "-" && value === undefined) return fallback;
        if (value === undefined) {
          return refuse(
            `variable "${all}" is not set ([environment.env] and CONTEXT_DIR are what it may name)`,
          );
        }
        return value;
      },
    );
  }
  if (Array.isArray(v)) return v.map((x) => interpolate(x, vars, refuse));
  if (isRecord(v)) {
    return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, interpolate(x, vars, refuse)]));
  }
  return v;
}
