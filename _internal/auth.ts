// The control channel's credentials and address, and their forms at the
// edges. A token: made, checked in constant time, kept out of urls that get
// printed. The ControlAddress (host, port, token) that runtimes hand to
// connect() as a record; its url form (`tcp://:TOKEN@host:port`) and the
// environment variables exist only where a person or another process gives
// or takes the address (the CLI's --url, HUD_SERVE_TOKEN, the
// `HUD_SERVE_PORT=` line `serve` prints), and this module is the one place
// that parses and prints those forms and spells those names. Every token
// made, read from the environment, checked or put in an address here is held
// as a secret of this process (secret_values.ts), so that no results file
// written here holds it, whatever surrounds it.

import { formatHostPort } from "./net.ts";
import { addSecretValue } from "./secret_values.ts";

/** Bytes of a generated token: 256 bits. */
const TOKEN_BYTES = 32;
/** Shortest token accepted from a caller: 128 bits written as hex. */
const MIN_TOKEN_LENGTH = 32;
/** Longest token accepted. */
const MAX_TOKEN_LENGTH = 1024;

/** A fresh 256-bit secret, as 64 lowercase hex characters. */
export function generateToken(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(TOKEN_BYTES));
  const token = Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
  addSecretValue(token, "token");
  return token;
}

/**
 * Why `token` cannot serve as a secret, or `null` when it can: between
 * {@linkcode MIN_TOKEN_LENGTH} and {@linkcode MAX_TOKEN_LENGTH} visible ASCII
 * characters (so that it survives urls, environment variables and files).
 */
export function tokenProblem(token: unknown): string | null {
  if (typeof token !== "string") return "the token must be a string";
  if (token.length < MIN_TOKEN_LENGTH) {
    return `the token must be at least ${MIN_TOKEN_LENGTH} characters (use a random 256-bit secret, 64 hex characters)`;
  }
  if (token.length > MAX_TOKEN_LENGTH) {
    return `the token must be at most ${MAX_TOKEN_LENGTH} characters`;
  }
  if (!/^[\x21-\x7e]+$/.test(token)) {
    return "the token must be visible ASCII characters, without spaces";
  }
  return null;
}

const encoder = new TextEncoder();

/**
 * Compares two byte arrays of equal length without an early exit: the time
 * taken does not depend on where they differ.
 */
export function timingSafeEqual(a: Uint8Array, b: Uint8Array): boolean {
  if (a.length !== b.length) return false;
  let diff = 0;
  for (let i = 0; i < a.length; i++) diff |= a[i] ^ b[i];
  return diff === 0;
}

/**
 * Checks presented tokens against the expected one in constant time: an
 * XOR loop over the whole token with no early exit. A presented token of
 * another length is refused after the same loop (over the expected token
 * against itself), so that timing tells only whether the length was right,
 * and the length of a generated token is no secret.
 */
export class TokenVerifier {
  readonly #expected: Uint8Array;

  constructor(token: string) {
    addSecretValue(token, "token");
    this.#expected = encoder.encode(token);
  }

  /** Whether `presented` is the token; `false` for anything not a string. */
  verify(presented: unknown): boolean {
    if (typeof presented !== "string" || presented.length > MAX_TOKEN_LENGTH) return false;
    const given = encoder.encode(presented);
    if (given.length !== this.#expected.length) {
      timingSafeEqual(this.#expected, this.#expected);
      return false;
    }
    return timingSafeEqual(this.#expected, given);
  }
}

/** The token of an `Authorization: Bearer TOKEN` header value, or `null`. */
export function bearerToken(authorization: string | null): string | null {
  const m = /^Bearer[ \t]+(\S+)[ \t]*$/i.exec(authorization ?? "");
  return m === null ? null : m[1];
}

/** `url` with any `user:password@` removed, for messages. */
export function redactUrl(url: string): string {
  return String(url).replace(/^([a-zA-Z][a-zA-Z0-9+.-]*:\/\/)?[^@/?#]*@/, "$1");
}

/** The environment variable that carries the control token to a server or a client. */
export const SERVE_TOKEN_VAR = "HUD_SERVE_TOKEN";
/** The name of the line `serve` prints once it listens: `HUD_SERVE_PORT=<port>`. */
export const SERVE_PORT_VAR = "HUD_SERVE_PORT";

/**
 * Where an environment's control port is: host, port, and the token the
 * server requires (none without authentication). What runtimes return in
 * their placements and `connect()` takes.
 *
 * Plain TCP today; a `tls` member (the server's name and CA) is the room
 * left for TLS, with `tls://` as its url form, both added here.
 */
export interface ControlAddress {
  /** Host name or address (IPv6 without brackets). */
  readonly hostname: string;
  /** Port. */
  readonly port: number;
  /** The server's token; a secret: never print it. */
  readonly token?: string;
}

const INSPECT = Symbol.for("Deno.customInspect");

/**
 * A control address record. The token is there to read, but `console.log`,
 * `Deno.inspect` and `JSON.stringify` show it as `***`: a placement or
 * address that gets logged does not leak it.
 */
export function controlAddress(hostname: string, port: number, token?: string): ControlAddress {
  if (token !== undefined) addSecretValue(token, "token");
  const address: ControlAddress = token === undefined
    ? { hostname, port }
    : { hostname, port, token };
  const shown = token === undefined ? { hostname, port } : { hostname, port, token: "***" };
  // Not enumerable: spreads, deep equality and Object.keys see the three fields only.
  Object.defineProperty(address, "toJSON", { value: () => shown });
  Object.defineProperty(address, INSPECT, {
    value: (inspect: (value: unknown, options: unknown) => string, options: unknown) =>
      inspect(shown, options),
  });
  return Object.freeze(address);
}

/**
 * The address a client dials to reach a listener bound on `addr`: a
 * wildcard (`0.0.0.0`, `::`) is reached on this machine's loopback.
 */
export function dialableAddress(addr: Deno.NetAddr, token?: string): ControlAddress {
  const host = addr.hostname === "0.0.0.0"
    ? "127.0.0.1"
    : addr.hostname === "::" || addr.hostname === "[::]"
    ? "::1"
    : addr.hostname;
  return controlAddress(host, addr.port, token);
}

/**
 * Host, port and token of a control address: `tcp://host:port`,
 * `tcp://:TOKEN@host:port` or `host:port`. Messages never show the token.
 * @throws {TypeError} for another scheme, a missing port, or user info
 *   without a `:` before the token
 */
export function parseControlUrl(url: string): ControlAddress {
  if (typeof url !== "string") throw new TypeError("Cannot connect: url must be a string");
  const shown = redactUrl(url);
  const m =
    /^(?:([a-zA-Z][a-zA-Z0-9+.-]*):\/\/)?(?:([^@/?#]*)@)?(?:\[([^\]]+)\]|([^:/?#@]+)):(\d+)\/?$/
      .exec(url.trim());
  const scheme = m ? m[1] : /^([a-zA-Z][a-zA-Z0-9+.-]*):\/\//.exec(url)?.[1];
  if (scheme !== undefined && scheme.toLowerCase() !== "tcp") {
    throw new TypeError(
      `Cannot connect: unsupported scheme "${scheme}" in "${shown}" (expected tcp://)`,
    );
  }
  if (!m) {
    throw new TypeError(`Cannot connect: invalid address "${shown}" (expected tcp://host:port)`);
  }
  const port = Number(m[5]);
  if (port < 1 || port > 65535) throw new RangeError(`Cannot connect: invalid port in "${shown}"`);
  return controlAddress(m[3] ?? m[4], port, m[2] === undefined ? undefined : urlToken(m[2], shown));
}

/** The token of a url's user info (`:TOKEN`), percent-decoded. */
function urlToken(userInfo: string, shown: string): string {
  const colon = userInfo.indexOf(":");
  if (colon < 0) {
    throw new TypeError(
      `Cannot connect: put the token after a colon in "${shown}" (tcp://:TOKEN@host:port)`,
    );
  }
  try {
    return decodeURIComponent(userInfo.slice(colon + 1));
  } catch {
    throw new TypeError(`Cannot connect: the token in "${shown}" is not valid percent-encoding`);
  }
}

/**
 * The address as a url that {@linkcode parseControlUrl} reads back:
 * `tcp://:TOKEN@host:port` (the token percent-encoded), `tcp://host:port`
 * without one. It holds the secret: hand it on, never print it.
 */
export function formatControlUrl(address: ControlAddress): string {
  const auth = address.token === undefined ? "" : `:${encodeURIComponent(address.token)}@`;
  return `tcp://${auth}${formatHostPort(address.hostname, address.port)}`;
}

/** The address as a url without the token, `tcp://host:port`: safe to show. */
export function shownControlUrl(address: ControlAddress): string {
  return `tcp://${formatHostPort(address.hostname, address.port)}`;
}

/** The value of `HUD_SERVE_TOKEN`, or `undefined` when unset, empty or not readable. */
export function tokenFromEnv(): string | undefined {
  try {
    const value = Deno.env.get(SERVE_TOKEN_VAR);
    if (value === undefined || value === "") return undefined;
    addSecretValue(value, "token");
    return value;
  } catch {
    // No --allow-env: as if unset.
    return undefined;
  }
}

/**
 * {@linkcode tokenFromEnv}, and `HUD_SERVE_TOKEN` taken out of this
 * process's environment, so that the processes it starts do not inherit it.
 */
export function takeTokenFromEnv(): string | undefined {
  const token = tokenFromEnv();
  try {
    Deno.env.delete(SERVE_TOKEN_VAR);
  } catch {
    // No --allow-env: nothing to take.
  }
  return token;
}

/** `HUD_SERVE_PORT=<port>`: the line `serve` prints once it listens. */
export function portLine(port: number): string {
  return `${SERVE_PORT_VAR}=${port}`;
}

/** `HUD_SERVE_TOKEN=<token>`: the line `serve` prints first when it generated the token. */
export function tokenLine(token: string): string {
  return `${SERVE_TOKEN_VAR}=${token}`;
}

const PORT_LINE = new RegExp(`^${SERVE_PORT_VAR}=(\\d+)$`);

/** What a line of `serve`'s output announces: its port, its token, or nothing. */
export function readAnnouncement(line: string): { port: number } | { token: string } | null {
  const port = PORT_LINE.exec(line)?.[1];
  if (port !== undefined) return { port: Number(port) };
  if (line.startsWith(`${SERVE_TOKEN_VAR}=`)) {
    const token = line.slice(SERVE_TOKEN_VAR.length + 1);
    if (token !== "") return { token };
  }
  return null;
}

/** A line of `serve`'s output with an announced token hidden, for logs and messages. */
export function redactAnnouncement(line: string): string {
  return line.startsWith(`${SERVE_TOKEN_VAR}=`) ? `${SERVE_TOKEN_VAR}=***` : line;
}
