// The egress proxy of a workspace with an allowlist: the one way out of its
// sandboxes, whose network namespaces hold only loopback. It listens on two
// Unix sockets in a directory of its own that only this workspace's
// sandboxes are shown (read-only, at EGRESS_DIR): proxy.sock speaks HTTP
// CONNECT and plain HTTP in absolute form, dns.sock DNS over TCP framing
// (`_egress_dns.ts`). For each request it checks the name (or the address)
// against the policy, resolves the name itself with the policy's name
// server, refuses addresses in denied ranges and connects only then; a
// refusal is a 403 with a one-line reason. The relay inside the sandbox
// (`_egress_relay.ts`) only carries bytes: everything is decided here.
//
// No credential: the sockets are reached by path only, in a directory made
// 0700 for this process's uid and shown to no sandbox but this workspace's
// (a sandbox sees the system's directories, its root, its HOME and the
// author's mounts, never this process's temporary directory). Where commands
// run as a uid of their own (as root), they cannot even open the sockets:
// only the relay, which keeps the sandbox's root uid, can.

import { closeQuietly, concat, isPeerGone, pump, writeAll } from "../_internal/io.ts";
import {
  checkAddress,
  checkHost,
  normalizeName,
  parseAddress,
  type ParsedPolicy,
} from "./_netpolicy.ts";
import { errorMessage } from "../_internal/util.ts";
import { formatHostPort } from "../_internal/net.ts";
import { answerDns } from "./_egress_dns.ts";
import { RELAY_JS } from "./_egress_relay.ts";

/** Bytes of a request head the proxy reads at most. */
const MAX_HEAD = 16 * 1024;
/** Milliseconds to resolve a name and connect to it. */
const DIAL_TIMEOUT = 10_000;
/** Milliseconds a client has for its request head, or its TLS ClientHello. */
const READ_TIMEOUT = 15_000;
/** Connections open at once, client and upstream: past it a new client is closed at once. */
const MAX_CONNECTIONS = 1024;

/** A running egress proxy. */
export interface EgressProxy {
  /** The host directory of its sockets, relay and resolv.conf (show it at EGRESS_DIR). */
  readonly dir: string;
  /** Stops listening, ends every connection and removes the directory. Idempotent. */
  close(): Promise<void>;
}

/** A refusal the client is told about, as an HTTP status and one line. */
class Refusal extends Error {
  readonly status: number;
  constructor(status: number, message: string) {
    super(message);
    this.name = "Refusal";
    this.status = status;
  }
}

/**
 * Starts the egress proxy of `policy` (an allowlist) in a fresh directory.
 * @param onError unexpected errors (never a client's refusal)
 * @param parent where the directory is made (one whose owner's cleanup removes it too)
 */
export async function startEgressProxy(
  policy: ParsedPolicy,
  onError: (error: unknown) => void = () => {},
  parent?: string,
): Promise<EgressProxy> {
  const dir = await Deno.makeTempDir({ prefix: "hud-net-", dir: parent });
  await Deno.chmod(dir, 0o700);
  await Deno.writeTextFile(`${dir}/relay.js`, RELAY_JS, { mode: 0o644 });
  await Deno.writeTextFile(`${dir}/resolv.conf`, "nameserver 127.0.0.1\noptions edns0\n", {
    mode: 0o644,
  });
  const conns = new Set<Deno.Conn>();
  const tasks = new Set<Promise<void>>();
  const listeners = [
    Deno.listen({ transport: "unix", path: `${dir}/proxy.sock` }),
    Deno.listen({ transport: "unix", path: `${dir}/dns.sock` }),
  ];
  const serve = (listener: Deno.Listener, handle: (conn: Deno.Conn) => Promise<void>) =>
    acceptLoop(listener, (conn) => {
      // The agent's commands may open connections without end: this process holds them.
      if (conns.size >= MAX_CONNECTIONS) return closeQuietly(conn);
      conns.add(conn);
      const task = handle(conn).catch((err) => {
        if (!isPeerGone(err) && !(err instanceof Deno.errors.TimedOut)) onError(err);
      }).finally(() => {
        conns.delete(conn);
        tasks.delete(task);
        closeQuietly(conn);
      });
      tasks.add(task);
    });
  const loops = [
    serve(listeners[0], (conn) => proxyConnection(policy, conn, conns)),
    serve(listeners[1], (conn) => dnsConnection(policy, conn)),
  ];
  let closing: Promise<void> | null = null;
  return {
    dir,
    close: () =>
      closing ??= (async () => {
        for (const l of listeners) closeQuietly(l);
        await Promise.allSettled(loops);
        for (const c of conns) closeQuietly(c);
        await Promise.allSettled([...tasks]);
        await Deno.remove(dir, { recursive: true }).catch(() => {});
      })(),
  };
}

async function acceptLoop(listener: Deno.Listener, onConn: (conn: Deno.Conn) => void) {
  try {
    for await (const conn of listener) onConn(conn);
  } catch (err) {
    if (!(err instanceof Deno.errors.BadResource)) throw err;
  }
}

/** Looks `name` up with the policy's name server. */
function lookup(policy: ParsedPolicy, name: string, type: "A" | "AAAA"): Promise<string[]> {
  return Deno.resolveDns(name, type, {
    ...(policy.nameServer === null ? {} : { nameServer: policy.nameServer }),
    signal: AbortSignal.timeout(DIAL_TIMEOUT),
  });
}

/** Answers the DNS questions of one connection from a sandbox's relay. */
async function dnsConnection(policy: ParsedPolicy, conn: Deno.Conn): Promise<void> {
  for (;;) {
    const len = await readExactly(conn, 2);
    if (len === null) return;
    const query = await readExactly(conn, len[0] << 8 | len[1]);
    if (query === null) return;
    const answer = await answerDns(policy, query, (name, type) => lookup(policy, name, type));
    await writeAll(conn, new Uint8Array([answer.length >> 8, answer.length & 0xff, ...answer]));
  }
}

async function readExactly(conn: Deno.Conn, n: number): Promise<Uint8Array | null> {
  const out = new Uint8Array(n);
  for (let o = 0; o < n;) {
    const got = await conn.read(out.subarray(o));
    if (got === null) return null;
    o += got;
  }
  return out;
}

/** Reads until `done(buffer)` or the peer stops; null when it stopped first. */
async function readUntil(
  conn: Deno.Conn,
  first: Uint8Array,
  done: (buf: Uint8Array) => boolean,
  max: number,
): Promise<Uint8Array | null> {
  let buf = first;
  const chunk = new Uint8Array(4096);
  const timer = setTimeout(() => closeQuietly(conn), READ_TIMEOUT);
  try {
    while (!done(buf)) {
      if (buf.length >= max) throw new Refusal(431, "the request head is too large");
      const n = await conn.read(chunk).catch(() => null);
      if (n === null) return null;
      buf = concat([buf, chunk.subarray(0, n)]);
    }
    return buf;
  } finally {
    clearTimeout(timer);
  }
}

function headEnd(buf: Uint8Array): number {
  for (let i = 3; i < buf.length; i++) {
    if (buf[i] === 10 && buf[i - 1] === 13 && buf[i - 2] === 10 && buf[i - 3] === 13) return i + 1;
  }
  return -1;
}

/** One client connection: its request, then either a refusal or a tunnel. */
async function proxyConnection(
  policy: ParsedPolicy,
  conn: Deno.Conn,
  conns: Set<Deno.Conn>,
): Promise<void> {
  let upstream: Deno.Conn | null = null;
  try {
    const buf = await readUntil(conn, new Uint8Array(0), (b) => headEnd(b) >= 0, MAX_HEAD);
    if (buf === null) return;
    const end = headEnd(buf);
    const head = new TextDecoder().decode(buf.subarray(0, end));
    const rest = buf.subarray(end);
    const [method, target] = head.split("\r\n", 1)[0].split(" ");
    upstream = method === "CONNECT"
      ? await tunnel(policy, conn, target, rest)
      : await forward(policy, head, rest);
    if (upstream === null) return;
    conns.add(upstream);
    await Promise.all([pump(conn, upstream), pump(upstream, conn)]);
  } catch (err) {
    if (!(err instanceof Refusal)) throw err;
    await refuse(conn, err).catch(() => {});
  } finally {
    if (upstream !== null) {
      conns.delete(upstream);
      closeQuietly(upstream);
    }
  }
}

async function refuse(conn: Deno.Conn, refusal: Refusal): Promise<void> {
  const body = `hud egress proxy: ${refusal.message}\n`;
  const text = refusal.status === 403 ? "Forbidden" : "Refused";
  await writeAll(
    conn,
    new TextEncoder().encode(
      `HTTP/1.1 ${refusal.status} ${text}\r\nContent-Type: text/plain\r\nContent-Length: ${
        new TextEncoder().encode(body).length
      }\r\nConnection: close\r\n\r\n${body}`,
    ),
  );
}

/** `host:port` split (IPv6 in brackets), or a refusal. */
function hostPort(target: string, defaultPort: number | null): { host: string; port: number } {
  const m = /^(\[[0-9a-fA-F:.]+\]|[^:\[\]]+)(?::([0-9]{1,5}))?$/.exec(target ?? "");
  const port = m?.[2] === undefined ? defaultPort : Number(m[2]);
  if (m === null || port === null || port < 1 || port > 65535) {
    throw new Refusal(400, `"${target}" is not host:port`);
  }
  return { host: m[1].replace(/^\[|\]$/g, ""), port };
}

/** Checks `host:port`, resolves it and connects; refuses what the policy does not allow. */
async function dial(policy: ParsedPolicy, host: string, port: number): Promise<Deno.Conn> {
  const why = checkHost(policy, host, port);
  if (why !== null) throw new Refusal(403, why);
  const addresses = await resolveAll(policy, host);
  const allowed = addresses.filter((a) => checkAddress(policy, a, port) === null);
  if (allowed.length === 0) {
    throw new Refusal(
      403,
      addresses.length === 0
        ? `"${host}" does not resolve`
        : checkAddress(policy, addresses[0], port)!,
    );
  }
  try {
    return await Deno.connect(
      {
        hostname: allowed[0],
        port,
        signal: AbortSignal.timeout(DIAL_TIMEOUT),
      },
    );
  } catch (err) {
    throw new Refusal(502, `cannot connect to "${host}:${port}": ${errorMessage(err)}`);
  }
}

async function resolveAll(policy: ParsedPolicy, host: string): Promise<string[]> {
  if (parseAddress(host) !== null) return [host];
  const found = await Promise.allSettled([lookup(policy, host, "A"), lookup(policy, host, "AAAA")]);
  return found.flatMap((r) => r.status === "fulfilled" ? r.value : []);
}

/** CONNECT: the tunnel's upstream, after a 200 (and, to port 443, a matching TLS SNI). */
async function tunnel(
  policy: ParsedPolicy,
  conn: Deno.Conn,
  target: string,
  rest: Uint8Array,
): Promise<Deno.Conn | null> {
  const { host, port } = hostPort(target, null);
  const upstream = await dial(policy, host, port);
  try {
    await writeAll(conn, new TextEncoder().encode("HTTP/1.1 200 Connection established\r\n\r\n"));
    let first = rest;
    if (port === 443) {
      const hello = await readUntil(conn, rest, (b) => clientHelloComplete(b), MAX_HEAD * 4);
      if (hello === null) throw new Deno.errors.UnexpectedEof("no ClientHello");
      checkSni(host, hello);
      first = hello;
    }
    await writeAll(upstream, first);
    return upstream;
  } catch (err) {
    closeQuietly(upstream);
    // After the 200 a refusal can only close the tunnel: nothing went upstream.
    if (err instanceof Refusal) return null;
    throw err;
  }
}

/** Whether `buf` holds a whole first TLS record (or is not TLS at all). */
function clientHelloComplete(buf: Uint8Array): boolean {
  if (buf.length >= 1 && buf[0] !== 0x16) return true;
  return buf.length >= 5 && buf.length >= 5 + (buf[3] << 8 | buf[4]);
}

/** The SNI of a TLS ClientHello record, "" when it names none; null when `buf` is not one. */
export function clientHelloSni(buf: Uint8Array): string | null {
  if (buf.length < 5 || buf[0] !== 0x16 || buf[5] !== 1) return null;
  const end = Math.min(buf.length, 5 + (buf[3] << 8 | buf[4]));
  const u16 = (i: number) => buf[i] << 8 | buf[i + 1];
  let i = 5 + 4 + 2 + 32; // record, handshake header, version, random
  if (i >= end) return null;
  i += 1 + buf[i]; // session id
  i += 2 + u16(i); // cipher suites
  i += 1 + buf[i]; // compression methods
  const extEnd = i + 2 + u16(i);
  for (i += 2; i + 4 <= Math.min(extEnd, end);) {
    const type = u16(i);
    const len = u16(i + 2);
    if (type === 0 && i + 9 <= end && buf[i + 6] === 0) {
      const n = u16(i + 7);
      return new TextDecoder().decode(buf.subarray(i + 9, Math.min(i + 9 + n, end)));
    }
    i += 4 + len;
  }
  return "";
}

/** Refuses a ClientHello whose SNI names another host than CONNECT did. */
function checkSni(host: string, hello: Uint8Array): void {
  const sni = clientHelloSni(hello);
  if (sni === null) throw new Refusal(403, `CONNECT to "${host}:443" carries no TLS`);
  if (sni !== "" && normalizeName(sni) !== normalizeName(host)) {
    throw new Refusal(403, `the TLS server name "${sni}" is not "${host}"`);
  }
}

/** Plain HTTP in absolute form: the request rewritten to origin form, sent upstream. */
async function forward(
  policy: ParsedPolicy,
  head: string,
  rest: Uint8Array,
): Promise<Deno.Conn> {
  const [requestLine, ...headers] = head.slice(0, -4).split("\r\n");
  const [method, target, version] = requestLine.split(" ");
  let url: URL;
  try {
    url = new URL(target);
  } catch {
    throw new Refusal(400, `"${target}" is not an absolute http:// URL`);
  }
  if (url.protocol !== "http:" || !/^HTTP\/1\.[01]$/.test(version ?? "")) {
    throw new Refusal(400, `"${target}" is not an absolute http:// URL (use CONNECT for https)`);
  }
  const { host, port } = hostPort(url.host, 80);
  const kept = checkHostHeader(headers, host, port);
  const upstream = await dial(policy, host, port);
  const out = [`${method} ${url.pathname}${url.search} ${version}`, ...kept, "Connection: close"];
  await writeAll(upstream, new TextEncoder().encode(`${out.join("\r\n")}\r\n\r\n`));
  await writeAll(upstream, rest);
  return upstream;
}

/**
 * The headers to send upstream: without the proxy's own and Connection (one
 * request per connection, so no second request reaches another host), with
 * a Host header naming the URL's host. A Host header naming another is refused.
 */
function checkHostHeader(headers: string[], host: string, port: number): string[] {
  const kept: string[] = [];
  let seen = false;
  for (const line of headers) {
    const name = line.slice(0, line.indexOf(":")).trim().toLowerCase();
    if (["connection", "proxy-connection", "proxy-authorization", "keep-alive"].includes(name)) {
      continue;
    }
    if (name === "host") {
      const value = line.slice(line.indexOf(":") + 1).trim();
      const h = /^(\[[^\]]+\]|[^:]+)(?::([0-9]+))?$/.exec(value);
      const same = h !== null && normalizeName(h[1]) === normalizeName(host) ||
        h?.[1].replace(/^\[|\]$/g, "") === host;
      if (!same || Number(h?.[2] ?? 80) !== port || seen) {
        throw new Refusal(
          403,
          `the Host header "${value}" is not the URL's host "${host}:${port}"`,
        );
      }
      seen = true;
    }
    kept.push(line);
  }
  if (!seen) kept.push(`Host: ${formatHostPort(host, port)}`);
  return kept;
}
