// A network policy: "none", "public", or an allowlist of names, wildcard
// domains and address ranges with deny entries that win over allow. Parsed
// once into rules, then matched by the egress proxy (`_egress.ts`) for each
// connection and each DNS question. Names are matched as names: a CIDR entry
// applies to a request for an address, never to what a name resolves to, so
// the proxy never resolves a name the list does not name (a DNS question is
// itself a way out).

/**
 * What commands may reach: nothing ("none"), this host's network ("public"),
 * or an allowlist.
 */
export type NetworkPolicy = "none" | "public" | NetworkAllowlist;

/** An allowlist: what {@linkcode NetworkPolicy} lets through, by name or address. */
export interface NetworkAllowlist {
  /**
   * Entries let through: `pypi.org` (any port), `pypi.org:443`,
   * `*.pypi.example` (its subdomains, not itself), `10.1.2.3`,
   * `[fd00::1]:8080`, `10.0.0.0/8`, `fd00::/8`.
   */
  allow: readonly string[];
  /**
   * Entries refused even when `allow` names them (same forms); an address
   * range here also refuses names that resolve into it.
   * @default []
   */
  deny?: readonly string[];
  /**
   * The DNS server names are resolved with, as `address` or `address:port`.
   * @default this host's (/etc/resolv.conf)
   */
  nameServer?: string;
}

/** One entry, parsed. */
type Rule =
  | { kind: "name"; name: string; port: number | null; text: string }
  | { kind: "suffix"; suffix: string; port: number | null; text: string }
  | { kind: "cidr"; bytes: Uint8Array; bits: number; port: number | null; text: string };

/** A policy checked once, for matching. */
export interface ParsedPolicy {
  readonly mode: "none" | "public" | "allowlist";
  readonly allow: readonly Rule[];
  readonly deny: readonly Rule[];
  /** The DNS server, or null for this host's. */
  readonly nameServer: { ipAddr: string; port: number } | null;
}

const LABEL = /^(?!-)[a-z0-9_-]{1,63}(?<!-)$/;

/** `name` lower-cased without its trailing dot, or null when it is no DNS name. */
export function normalizeName(name: string): string | null {
  const n = name.toLowerCase().replace(/\.$/, "");
  if (n.length === 0 || n.length > 253) return null;
  return n.split(".").every((l) => LABEL.test(l)) ? n : null;
}

/** The 4 bytes of a dotted IPv4 address, or null. */
function parseIPv4(text: string): Uint8Array | null {
  const parts = text.split(".");
  if (parts.length !== 4 || !parts.every((p) => /^(0|[1-9][0-9]{0,2})$/.test(p))) return null;
  const bytes = parts.map(Number);
  return bytes.every((b) => b <= 255) ? new Uint8Array(bytes) : null;
}

/** The 16 bytes of an IPv6 address (`::` and a dotted tail allowed), or null. */
function parseIPv6(text: string): Uint8Array | null {
  if (!/^[0-9a-f:.]+$/i.test(text) || text.split("::").length > 2) return null;
  const words: number[] = [];
  const [head, tail] = text.includes("::") ? text.split("::") : [text, null];
  const groups = (s: string) => (s === "" ? [] : s.split(":"));
  const toWords = (list: string[]): number[] | null => {
    const out: number[] = [];
    for (const [i, g] of list.entries()) {
      if (i === list.length - 1 && g.includes(".")) {
        const v4 = parseIPv4(g);
        if (v4 === null) return null;
        out.push(v4[0] << 8 | v4[1], v4[2] << 8 | v4[3]);
      } else if (/^[0-9a-f]{1,4}$/i.test(g)) out.push(parseInt(g, 16));
      else return null;
    }
    return out;
  };
  const a = toWords(groups(head));
  const b = tail === null ? [] : toWords(groups(tail));
  if (a === null || b === null) return null;
  if (tail === null ? a.length !== 8 : a.length + b.length > 7) return null;
  words.push(...a, ...new Array(8 - a.length - b.length).fill(0), ...b);
  return new Uint8Array(words.flatMap((w) => [w >> 8, w & 0xff]));
}

/**
 * The bytes of an address (IPv4, or IPv6 with or without brackets); an
 * IPv4-mapped IPv6 address gives its IPv4 bytes. Null when it is none.
 */
export function parseAddress(text: string): Uint8Array | null {
  const t = text.startsWith("[") && text.endsWith("]") ? text.slice(1, -1) : text;
  const v4 = parseIPv4(t);
  if (v4 !== null) return v4;
  const v6 = t.includes(":") ? parseIPv6(t) : null;
  if (v6 !== null && v6.slice(0, 10).every((b) => b === 0) && v6[10] === 0xff && v6[11] === 0xff) {
    return v6.slice(12);
  }
  return v6;
}

function inRange(addr: Uint8Array, base: Uint8Array, bits: number): boolean {
  if (addr.length !== base.length) return false;
  for (let i = 0; i < bits; i++) {
    const mask = 0x80 >> (i % 8);
    if ((addr[i >> 3] & mask) !== (base[i >> 3] & mask)) return false;
  }
  return true;
}

/** Splits `host:port` (`[v6]:port` for IPv6); port null when absent. */
function splitPort(entry: string): { host: string; port: number | null } | string {
  const m = /^(\[[^\]]*\]|[^:]*):([^:]*)$/.exec(entry);
  if (m === null) return { host: entry, port: null };
  if (!/^[0-9]{1,5}$/.test(m[2]) || Number(m[2]) < 1 || Number(m[2]) > 65535) {
    return `port "${m[2]}" is not 1-65535`;
  }
  return { host: m[1], port: Number(m[2]) };
}

/** One entry parsed, or a one-line reason it is refused. */
function parseRule(entry: unknown): Rule | string {
  if (typeof entry !== "string") return `${JSON.stringify(entry)} is not a string`;
  const text = entry.trim();
  if (text === "") return "an entry is empty (remove it)";
  const q = `"${text}"`;
  if (text.includes("://")) {
    return `${q} is a URL (give its host, or host:port: "${
      text.replace(/^.*:\/\/([^/]*).*$/, "$1")
    }")`;
  }
  if (text.includes("/")) return parseCidr(text);
  const split = splitPort(text);
  if (typeof split === "string") return `${q}: ${split}`;
  const { host, port } = split;
  const bytes = parseAddress(host);
  if (bytes !== null) return { kind: "cidr", bytes, bits: bytes.length * 8, port, text };
  if (host === "*" || host === "*.") {
    return `${q} allows everything (use network "public", or name the domains: "*.example.com")`;
  }
  if (host.startsWith("*.")) {
    const suffix = normalizeName(host.slice(2));
    if (suffix === null) return `${q} is not a wildcard domain (write "*.example.com")`;
    return { kind: "suffix", suffix, port, text };
  }
  if (host.includes("*")) return `${q}: "*" may only lead a name, as "*.example.com"`;
  const name = normalizeName(host);
  if (name === null) return `${q} is not a host name, host:port, address or CIDR`;
  return { kind: "name", name, port, text };
}

function parseCidr(text: string): Rule | string {
  const q = `"${text}"`;
  const [addr, bits, ...rest] = text.split("/");
  const bytes = parseAddress(addr);
  if (bytes === null || rest.length > 0) {
    return /^[^/]*[a-z][^/]*\//i.test(text) && bytes === null && !addr.includes(":")
      ? `${q} is a path or URL, not a host (give the host alone: "${addr}")`
      : `${q} is not a CIDR (write "10.0.0.0/8" or "fd00::/8")`;
  }
  const n = /^[0-9]{1,3}$/.test(bits) ? Number(bits) : -1;
  if (n < 0 || n > bytes.length * 8) {
    return `${q}: prefix "/${bits}" is not 0-${bytes.length * 8}`;
  }
  return { kind: "cidr", bytes, bits: n, port: null, text };
}

function parseList(what: string, list: unknown): Rule[] {
  if (!Array.isArray(list)) {
    throw new TypeError(`Invalid network policy: ${what} must be an array of strings`);
  }
  return list.map((entry) => {
    const rule = parseRule(entry);
    if (typeof rule === "string") throw new TypeError(`Invalid network ${what} entry: ${rule}`);
    return rule;
  });
}

function parseNameServer(text: unknown): { ipAddr: string; port: number } | null {
  if (text === undefined) return null;
  const split = typeof text === "string" ? splitPort(text) : "not a string";
  const bytes = typeof split === "string" ? null : parseAddress(split.host);
  if (typeof split === "string" || bytes === null) {
    throw new TypeError(
      `Invalid network nameServer "${text}": give an address, or address:port ("10.0.0.53:53")`,
    );
  }
  return { ipAddr: split.host.replace(/^\[|\]$/g, ""), port: split.port ?? 53 };
}

/**
 * Checks a policy as given: `true` is "public", `false` "none".
 * @throws {TypeError} naming the bad entry and what to write instead
 */
export function parseNetworkPolicy(policy: NetworkPolicy | boolean): ParsedPolicy {
  if (policy === true || policy === "public" || policy === false || policy === "none") {
    const mode = policy === true || policy === "public" ? "public" : "none";
    return { mode, allow: [], deny: [], nameServer: null };
  }
  if (typeof policy !== "object" || policy === null || Array.isArray(policy)) {
    throw new TypeError(
      `Invalid network policy ${JSON.stringify(policy)}: use "none", "public" or { allow: [...] }`,
    );
  }
  return {
    mode: "allowlist",
    allow: parseList("allow", policy.allow),
    deny: parseList("deny", policy.deny ?? []),
    nameServer: parseNameServer(policy.nameServer),
  };
}

function portMatches(rule: Rule, port: number | null): boolean {
  return rule.port === null || port === null || rule.port === port;
}

/** Whether `rule` names `host` (a normalised name or address bytes) on `port`. */
function matches(rule: Rule, host: string | Uint8Array, port: number | null): boolean {
  if (!portMatches(rule, port)) return false;
  if (typeof host === "string") {
    if (rule.kind === "name") return rule.name === host;
    return rule.kind === "suffix" && host.endsWith(`.${rule.suffix}`);
  }
  return rule.kind === "cidr" && inRange(host, rule.bytes, rule.bits);
}

/**
 * Why a request for `host` on `port` is refused, or null when the policy
 * lets it through (before resolving: see {@linkcode checkAddress}).
 * @param host a name (any case, trailing dot allowed) or an address
 * @param port the port, or null for a DNS question (any port will do)
 */
export function checkHost(policy: ParsedPolicy, host: string, port: number | null): string | null {
  if (policy.mode === "public") return null;
  const bytes = parseAddress(host);
  const key = bytes ?? normalizeName(host);
  const shown = `"${host}${port === null ? "" : `:${port}`}"`;
  if (policy.mode === "none") return `${shown}: the network policy is "none"`;
  if (key === null) return `${shown} is not a host name or address`;
  const denied = policy.deny.find((r) => matches(r, key, port));
  if (denied) return `${shown} is denied by "${denied.text}"`;
  if (!policy.allow.some((r) => matches(r, key, port))) return `${shown} is not on the allowlist`;
  return null;
}

/** Why connecting to resolved `address` is refused (a denied range), or null. */
export function checkAddress(policy: ParsedPolicy, address: string, port: number): string | null {
  const bytes = parseAddress(address);
  if (bytes === null) return `"${address}" is not an address`;
  const denied = policy.deny.find((r) => r.kind === "cidr" && matches(r, bytes, port));
  return denied ? `"${address}" is denied by "${denied.text}"` : null;
}
