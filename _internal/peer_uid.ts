// Which local user opened a loopback TCP connection: on Linux the kernel's
// socket tables (/proc/net/tcp and tcp6) give each socket's owner uid, so
// the peer's socket (local = the connection's remote address, remote = its
// local address) names the user. Elsewhere it cannot be told.

/** Whether {@linkcode loopbackPeerUid} can tell the user on this platform. */
const PEER_UID_SUPPORTED: boolean = Deno.build.os === "linux";

const TABLES = ["/proc/net/tcp", "/proc/net/tcp6"];
/** Sockets in TIME_WAIT are listed with uid 0, whoever owned them. */
const TIME_WAIT = "06";
const LISTEN = "0A";

const littleEndian = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

/** This process's user id, or `null` where it cannot be read. */
export function ownUid(): number | null {
  try {
    return Deno.uid();
  } catch {
    // No --allow-sys: /proc/self/status says it too.
  }
  try {
    const m = /^Uid:\s+(\d+)/m.exec(Deno.readTextFileSync("/proc/self/status"));
    return m ? Number(m[1]) : null;
  } catch {
    return null;
  }
}

/**
 * The uid that owns the other end of `conn`, an accepted loopback TCP
 * connection, or `null` when it cannot be found (not Linux, the tables
 * cannot be read, or the peer's socket is gone).
 * @throws {Deno.errors.PermissionDenied} without read access to /proc/net
 */
async function loopbackPeerUid(conn: Deno.Conn): Promise<number | null> {
  if (!PEER_UID_SUPPORTED) return null;
  const local = conn.localAddr as Deno.NetAddr;
  const remote = conn.remoteAddr as Deno.NetAddr;
  if (local.transport !== "tcp" || remote.transport !== "tcp") return null;
  // The peer's socket: its local address is our remote one, and back.
  const want = {
    local: key(remote.hostname, remote.port),
    remote: key(local.hostname, local.port),
  };
  // Each table costs a walk of every socket of its kind (milliseconds on a
  // busy host): the one the peer's address belongs in first (an IPv4 peer
  // may still be an IPv6 socket's mapped address).
  const v4 = !want.local.slice(0, want.local.lastIndexOf(":")).includes(":");
  for (const table of v4 ? TABLES : [...TABLES].reverse()) {
    let text: string;
    try {
      text = await Deno.readTextFile(table);
    } catch (err) {
      if (err instanceof Deno.errors.NotFound) continue;
      throw err;
    }
    for (const line of text.split("\n").slice(1)) {
      const f = line.trim().split(/\s+/);
      if (f.length < 8 || f[3] === TIME_WAIT || f[3] === LISTEN) continue;
      const from = procAddress(f[1]);
      const to = procAddress(f[2]);
      if (from === want.local && to === want.remote) return Number(f[7]);
    }
  }
  return null;
}

/**
 * This process's own open loopback connections, by local address: the
 * address each dialled. A listener here that accepts one of them knows its
 * user without reading the kernel's tables (a walk of every socket of the
 * host, TIME_WAIT ones included: milliseconds once rollouts have run for a
 * minute): while our socket is open, no other socket has its addresses.
 */
const own = new Map<string, string>();

/** This process's dials in flight, by the port dialled. */
const dialling = new Map<number, Set<Promise<unknown>>>();

/** How long a listener waits for this process's dials to its port before it reads the tables. */
const DIAL_WAIT = 2_000;

/**
 * Dials `hostname:port` over TCP and notes the connection as this
 * process's own until it is closed (its `close()` forgets it first, so no
 * later socket is taken for it). For clients that reach this process's
 * loopback listeners (the forwarders): {@linkcode refusePeer} then knows
 * their user at once.
 * @param connect starts the dial (`Deno.connect`), called at once
 */
export function dialOwn(
  port: number,
  connect: () => Promise<Deno.TcpConn>,
): Promise<Deno.TcpConn> {
  const connecting = connect();
  const set = dialling.get(port) ?? new Set();
  dialling.set(port, set);
  const noted = connecting.then(ownConnection);
  const settled = noted.then(() => {}, () => {});
  set.add(settled);
  settled.then(() => {
    set.delete(settled);
    if (set.size === 0 && dialling.get(port) === set) dialling.delete(port);
  });
  return noted;
}

function ownConnection(conn: Deno.TcpConn): Deno.TcpConn {
  const local = conn.localAddr as Deno.NetAddr;
  const remote = conn.remoteAddr as Deno.NetAddr;
  const mine = key(local.hostname, local.port);
  own.set(mine, key(remote.hostname, remote.port));
  const close = conn.close.bind(conn);
  conn.close = () => {
    own.delete(mine);
    close();
  };
  conn[Symbol.dispose] = () => {
    try {
      conn.close();
    } catch {
      // closed already
    }
  };
  return conn;
}

/**
 * This process's uid when `conn`'s peer is one of its own connections
 * (waiting, bounded, for its dials to the listener's port that are still in
 * flight: the accept may come first), else null.
 */
async function ownPeer(conn: Deno.Conn): Promise<number | null> {
  const local = conn.localAddr as Deno.NetAddr;
  const remote = conn.remoteAddr as Deno.NetAddr;
  if (local.transport !== "tcp" || remote.transport !== "tcp") return null;
  const peer = key(remote.hostname, remote.port);
  const listener = key(local.hostname, local.port);
  const mine = () => own.get(peer) === listener;
  if (mine()) return ownUid();
  if (!dialling.has(local.port)) return null;
  let timer: ReturnType<typeof setTimeout> | undefined;
  const bound = new Promise<"late">((r) => timer = setTimeout(() => r("late"), DIAL_WAIT));
  try {
    while (!mine()) {
      const pending = dialling.get(local.port);
      if (pending === undefined) return null;
      if (await Promise.race([bound, ...pending]) === "late") return null;
    }
    return ownUid();
  } finally {
    clearTimeout(timer);
  }
}

/** The users a loopback listener serves: a set of uids, or `"any"`. */
export type PeerUsers = ReadonlySet<number> | "any";

/** How a listener that checks its peers' users names itself in messages. */
export interface PeerUsersNaming {
  /** The start of every message: `Cannot forward`. */
  what: string;
  /** The listener, as a noun: `a forwarder`. */
  listener: string;
  /** The option that lists the users: `forwardUsers`. */
  option: string;
  /** Another way out where the user cannot be told: `forward: false`. */
  orElse: string;
}

function isUid(v: unknown): boolean {
  return typeof v === "number" && Number.isInteger(v) && v >= 0 && v <= 0xffffffff;
}

/**
 * The users a loopback listener serves, from its option: `"any"`, a list of
 * uids, or by default this process's uid. Checked once, before listening,
 * so that a listener that could not tell its peers apart never opens.
 * @throws {TypeError} for a list that is not of uids
 * @throws {Deno.errors.NotSupported} where the user of a connection cannot
 *   be told and `"any"` was not asked for
 * @throws {Deno.errors.PermissionDenied} without read access to /proc/net,
 *   or without this process's uid
 */
export function peerUsers(
  option: readonly number[] | "any" | undefined,
  naming: PeerUsersNaming,
): PeerUsers {
  const { what, listener, option: name, orElse } = naming;
  if (option === "any") return "any";
  if (option !== undefined && (!Array.isArray(option) || !option.every(isUid))) {
    throw new TypeError(
      `${what}: ${name} must be "any" or a list of uids, got ${JSON.stringify(option)}`,
    );
  }
  if (!PEER_UID_SUPPORTED) {
    throw new Deno.errors.NotSupported(
      `${what}: on ${Deno.build.os} ${listener} cannot tell which user a connection comes from; pass ${name}: "any" to serve every local user, or ${orElse}`,
    );
  }
  for (const path of TABLES) {
    if (Deno.permissions.querySync({ name: "read", path }).state !== "granted") {
      throw new Deno.errors.PermissionDenied(
        `${what}: reading ${path} is how ${listener} tells which user a connection comes from; grant --allow-read=/proc/net, or pass ${name}: "any"`,
      );
    }
  }
  if (option !== undefined) return new Set(option);
  const uid = ownUid();
  if (uid === null) {
    throw new Deno.errors.PermissionDenied(
      `${what}: cannot read this process's uid; grant --allow-sys=uid, or pass ${name}`,
    );
  }
  return new Set([uid]);
}

/**
 * Why `conn` (an accepted loopback connection) may not be served, or `null`
 * when its peer is one of `users`. Nothing is read from `conn`.
 * @param who the listener, for the message: `Forwarder for "echo"`
 * @param option the option that lists the users, for the way out
 */
export async function refusePeer(
  conn: Deno.Conn,
  users: PeerUsers,
  who: string,
  option: string,
): Promise<Error | null> {
  if (users === "any") return null;
  const uid = await ownPeer(conn) ?? await loopbackPeerUid(conn);
  if (uid !== null && users.has(uid)) return null;
  return new Error(
    `${who} refused a connection from ${
      uid === null ? "a user it cannot tell" : `uid ${uid}`
    }: it serves uid ${[...users].join(", ")} (add others with ${option})`,
  );
}

/** `address:port` in one canonical form (IPv4-mapped IPv6 as IPv4). */
function key(hostname: string, port: number): string {
  const h = hostname.toLowerCase().replace(/^\[|\]$/g, "");
  const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/.exec(h);
  return `${mapped ? mapped[1] : expandIpv6(h)}:${port}`;
}

/** Full lowercase IPv6 (eight groups of four hex digits); IPv4 as it is. */
function expandIpv6(h: string): string {
  if (!h.includes(":")) return h;
  const [head, tail = ""] = h.split("::");
  const a = head === "" ? [] : head.split(":");
  const b = h.includes("::") ? (tail === "" ? [] : tail.split(":")) : [];
  const groups = h.includes("::") ? [...a, ...Array(8 - a.length - b.length).fill("0"), ...b] : a;
  return groups.map((g) => g.padStart(4, "0")).join(":");
}

/** A `/proc/net/tcp{,6}` address (`0100007F:1F90`) as {@linkcode key} writes it. */
function procAddress(field: string): string | null {
  const [hex, portHex] = field.split(":");
  if (portHex === undefined) return null;
  const port = parseInt(portHex, 16);
  // Each 32-bit word is printed as a number in the host's byte order.
  const bytes: number[] = [];
  for (let i = 0; i < hex.length; i += 8) {
    const word = parseInt(hex.slice(i, i + 8), 16);
    const be = [(word >>> 24) & 255, (word >>> 16) & 255, (word >>> 8) & 255, word & 255];
    bytes.push(...(littleEndian ? be.reverse() : be));
  }
  if (bytes.length === 4) return `${bytes.join(".")}:${port}`;
  if (bytes.length !== 16) return null;
  const mapped = bytes.slice(0, 10).every((b) => b === 0) && bytes[10] === 255 &&
    bytes[11] === 255;
  if (mapped) return `${bytes.slice(12).join(".")}:${port}`;
  const groups: string[] = [];
  for (let i = 0; i < 16; i += 2) {
    groups.push(((bytes[i] << 8) | bytes[i + 1]).toString(16).padStart(4, "0"));
  }
  return `${groups.join(":")}:${port}`;
}
