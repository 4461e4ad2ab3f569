// The YAML that kubeconfig files (and the compose files of Harbor tasks,
// harbor/_compose.ts) are written in, read without a library:
// block mappings and sequences (including "- key: value" items), plain,
// single- and double-quoted scalars, flow collections ({}, [a, b]) on one
// line, comments and "---". Anchors, tags, multi-line scalars (| and >) and
// multi-document streams are refused with a line number: kubeconfigs
// written by kubectl, kind, gcloud, aws and az use none of them.

interface Line {
  indent: number;
  text: string;
  no: number;
}

/** Parses the YAML subset above; throws `SyntaxError` naming the line. */
export function parseYaml(source: string): unknown {
  const lines: Line[] = [];
  source.split(/\r?\n/).forEach((raw, i) => {
    const text = stripComment(raw).trimEnd();
    if (text.trim() === "" || text === "---") return;
    if (/^\t/.test(raw)) throw new SyntaxError(`YAML line ${i + 1}: tabs are not allowed`);
    lines.push({ indent: text.length - text.trimStart().length, text: text.trim(), no: i + 1 });
  });
  if (lines.length === 0) return null;
  const state = { i: 0 };
  const value = parseBlock(lines, state, lines[0].indent);
  if (state.i < lines.length) {
    throw new SyntaxError(`YAML line ${lines[state.i].no}: unexpected indentation`);
  }
  return value;
}

function stripComment(line: string): string {
  let quote = "";
  for (let i = 0; i < line.length; i++) {
    const c = line[i];
    if (quote) {
      if (c === "\\" && quote === '"') i++;
      else if (c === quote) quote = "";
    } else if (c === '"' || c === "'") {
      quote = c;
    } else if (c === "#" && (i === 0 || /\s/.test(line[i - 1]))) {
      return line.slice(0, i);
    }
  }
  return line;
}

function parseBlock(lines: Line[], state: { i: number }, indent: number): unknown {
  const first = lines[state.i];
  if (first.text === "-" || first.text.startsWith("- ")) return parseSequence(lines, state, indent);
  return parseMapping(lines, state, indent);
}

function parseSequence(lines: Line[], state: { i: number }, indent: number): unknown[] {
  const out: unknown[] = [];
  while (state.i < lines.length) {
    const line = lines[state.i];
    if (line.indent < indent) break;
    if (line.indent > indent) throw new SyntaxError(`YAML line ${line.no}: unexpected indentation`);
    if (!(line.text === "-" || line.text.startsWith("- "))) break;
    const rest = line.text.slice(1).trimStart();
    if (rest === "") {
      state.i++;
      out.push(childOrNull(lines, state, indent));
    } else if (keyOf(rest) !== null) {
      // "- key: value": a mapping whose first key sits after the dash.
      const inner = line.indent + (line.text.length - rest.length);
      lines[state.i] = { indent: inner, text: rest, no: line.no };
      out.push(parseMapping(lines, state, inner));
    } else {
      state.i++;
      out.push(scalar(rest, line.no));
    }
  }
  return out;
}

function parseMapping(
  lines: Line[],
  state: { i: number },
  indent: number,
): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  while (state.i < lines.length) {
    const line = lines[state.i];
    if (line.indent < indent) break;
    if (line.indent > indent) throw new SyntaxError(`YAML line ${line.no}: unexpected indentation`);
    const kv = keyOf(line.text);
    if (kv === null) {
      if (line.text.startsWith("- ") || line.text === "-") break;
      throw new SyntaxError(`YAML line ${line.no}: expected "key: value"`);
    }
    const [key, rest] = kv;
    state.i++;
    if (rest === "") {
      // A sequence may sit at the key's own indentation.
      const next = lines[state.i];
      if (
        next && next.indent === indent && (next.text === "-" || next.text.startsWith("- "))
      ) out[key] = parseSequence(lines, state, indent);
      else out[key] = childOrNull(lines, state, indent);
    } else {
      out[key] = scalar(rest, line.no);
    }
  }
  return out;
}

function childOrNull(lines: Line[], state: { i: number }, indent: number): unknown {
  const next = lines[state.i];
  if (!next || next.indent <= indent) return null;
  return parseBlock(lines, state, next.indent);
}

/** `[key, rest]` when the text is "key: rest" or "key:"; null otherwise. */
function keyOf(text: string): [string, string] | null {
  let key: string;
  let after: number;
  if (text[0] === '"' || text[0] === "'") {
    const end = quotedEnd(text, 0);
    if (end < 0) return null;
    key = String(scalar(text.slice(0, end + 1), 0));
    after = end + 1;
    if (text[after] !== ":") return null;
  } else {
    const m = /^([^\s:{}[\],][^:]*?|[^\s:{}[\],]):(\s|$)/.exec(text);
    if (!m) return null;
    key = m[1].trim();
    after = m[1].length;
  }
  return [key, text.slice(after + 1).trim()];
}

function quotedEnd(text: string, start: number): number {
  const q = text[start];
  for (let i = start + 1; i < text.length; i++) {
    if (q === '"' && text[i] === "\\") i++;
    else if (text[i] === q) {
      if (q === "'" && text[i + 1] === "'") i++;
      else return i;
    }
  }
  return -1;
}

function scalar(text: string, no: number): unknown {
  if (/^[&*!|>]/.test(text)) {
    throw new SyntaxError(`YAML line ${no}: anchors, tags and block scalars are not supported`);
  }
  if (text[0] === "{" || text[0] === "[") return flow(text, no);
  if (text[0] === '"') {
    if (quotedEnd(text, 0) !== text.length - 1) {
      throw new SyntaxError(`YAML line ${no}: unterminated string`);
    }
    return JSON.parse(text.replace(/\\x([0-9a-fA-F]{2})/g, "\\u00$1"));
  }
  if (text[0] === "'") {
    if (quotedEnd(text, 0) !== text.length - 1) {
      throw new SyntaxError(`YAML line ${no}: unterminated string`);
    }
    return text.slice(1, -1).replace(/''/g, "'");
  }
  if (/^(null|Null|NULL|~)$/.test(text)) return null;
  if (/^(true|True|TRUE)$/.test(text)) return true;
  if (/^(false|False|FALSE)$/.test(text)) return false;
  if (/^[-+]?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?$/.test(text)) return Number(text);
  return text;
}

/** One-line flow collections: `{}`, `[]`, `[a, "b"]`, `{a: 1, b: [x]}`. */
function flow(text: string, no: number): unknown {
  const reader = new FlowReader(text, no);
  const value = reader.collection();
  reader.end();
  return value;
}

/** A reader of one flow collection's text, left to right. */
class FlowReader {
  readonly #text: string;
  readonly #no: number;
  #i = 0;

  constructor(text: string, no: number) {
    this.#text = text;
    this.#no = no;
  }

  #fail(): never {
    throw new SyntaxError(`YAML line ${this.#no}: cannot read flow collection "${this.#text}"`);
  }

  #spaces(): void {
    while (this.#text[this.#i] === " ") this.#i++;
  }

  /** Fails unless the whole text was read. */
  end(): void {
    this.#spaces();
    if (this.#i !== this.#text.length) this.#fail();
  }

  /** A scalar, quoted or plain, or a nested collection. */
  #item(): unknown {
    this.#spaces();
    const text = this.#text;
    if (text[this.#i] === "{" || text[this.#i] === "[") return this.collection();
    if (text[this.#i] === '"' || text[this.#i] === "'") {
      const end = quotedEnd(text, this.#i);
      if (end < 0) this.#fail();
      const s = text.slice(this.#i, end + 1);
      this.#i = end + 1;
      return scalar(s, this.#no);
    }
    const start = this.#i;
    // A ":" ends a plain scalar only before a space, a flow indicator or the end
    // (YAML 1.2): `[data:/data, "8080:80"]` holds two items.
    while (this.#i < text.length && !",]}".includes(text[this.#i])) {
      if (text[this.#i] === ":" && /^$|^[\s,\]}]/.test(text.slice(this.#i + 1, this.#i + 2))) break;
      this.#i++;
    }
    return scalar(text.slice(start, this.#i).trim(), this.#no);
  }

  /** A `{...}` or `[...]` at the current position. */
  collection(): unknown {
    const text = this.#text;
    const open = text[this.#i++];
    const close = open === "{" ? "}" : "]";
    const map: Record<string, unknown> = {};
    const list: unknown[] = [];
    this.#spaces();
    if (text[this.#i] === close) {
      this.#i++;
      return open === "{" ? map : list;
    }
    while (this.#i < text.length) {
      const value = this.#item();
      this.#spaces();
      if (open === "{") {
        if (text[this.#i] !== ":") this.#fail();
        this.#i++;
        map[String(value)] = this.#item();
        this.#spaces();
      } else {
        list.push(value);
      }
      if (text[this.#i] === ",") {
        this.#i++;
        continue;
      }
      if (text[this.#i] !== close) this.#fail();
      this.#i++;
      return open === "{" ? map : list;
    }
    return this.#fail();
  }
}
