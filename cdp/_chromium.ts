// Starts headless Chromium for CDP over `--remote-debugging-pipe` (Linux):
// no port, no socket, nothing another process could connect to. The pipe is
// the child's stdin and stdout, which a shell moves to the fds 3 and 4 that
// Chromium reads and writes (NUL-delimited JSON); the relay serves clients
// over it. Who starts the process (a sandbox, or nothing) is the caller's
// `spawn`. Private to the SDK: addBrowser() is the public face.

import { acceptLoop } from "../_internal/accept.ts";
import { delay } from "../_internal/async.ts";
import { LineReader } from "../_internal/framing.ts";
import { closeQuietly, isPeerGone, splice } from "../_internal/io.ts";
import { liveGroupMembers } from "../_internal/process.ts";
import type { CdpClient } from "./client.ts";
import { type BrowserVersion, CdpRelay, MAX_MESSAGE } from "./_relay.ts";

/** Default flags for a quiet, offline, headless Chromium driven over the pipe. */
const DEFAULT_CHROMIUM_ARGS: readonly string[] = [
  "--headless",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--no-default-browser-check",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
  "--disable-breakpad",
  "--remote-debugging-pipe",
];

/**
 * Starts the program `argv` with exactly `env`, with piped stdin, stdout and
 * stderr, leading its own process group (the group is what `close` kills).
 */
export type ChromiumSpawner = (
  argv: readonly string[],
  env: Record<string, string>,
) => Deno.ChildProcess | Promise<Deno.ChildProcess>;

/** Options for {@linkcode launchChromium}. */
export interface LaunchOptions {
  /**
   * Executable, looked up on the PATH of the process `spawn` starts.
   * @default "chromium"
   */
  executable?: string;
  /** Flags added to {@linkcode DEFAULT_CHROMIUM_ARGS}. */
  args?: readonly string[];
  /**
   * The browser's own directory (profile, HOME), writable where Chromium
   * runs, as Chromium sees it (a path inside its sandbox's private /tmp,
   * say). Made here, and removed by `close`, when not given.
   */
  dir?: string;
  /**
   * A directory of this host, shown to Chromium at the same path (read-only
   * will do), where the `hostPorts` relay finds its unix sockets; only the
   * browser's uid should be able to enter it. Made here as `<dir>/ports`
   * (0700, owned as `dir` is) when not given.
   */
  portsDir?: string;
  /**
   * Starts Chromium (in a sandbox, say).
   * @default a plain child of this process, in its own session
   */
  spawn?: ChromiumSpawner;
  /**
   * Ports of this host's 127.0.0.1 that pages may reach at the same address
   * from a network namespace of their own: a relay next to Chromium listens
   * on each and forwards through a unix socket in `dir`.
   * @default []
   */
  hostPorts?: readonly number[];
  /**
   * The `deno` executable that runs the `hostPorts` relay.
   * @default this process's executable
   */
  deno?: string;
  /**
   * Whether Chromium uses its own sandbox; `undefined` tries it and starts
   * again with `--no-sandbox` where it cannot work (no user namespaces for
   * its uid, a read-only /proc, root).
   */
  chromiumSandbox?: boolean;
  /** Aborts startup (the browser is killed, a directory made here removed). */
  signal?: AbortSignal;
  /**
   * Number of stderr lines kept for diagnostics.
   * @default 50
   */
  stderrLines?: number;
}

/** A running browser. Dispose it to kill its process group. */
export interface ChromiumProcess extends AsyncDisposable {
  /** Process group of the browser (and of its sandbox). */
  readonly pid: number;
  /** The browser's own directory. */
  readonly dir: string;
  /** What `Browser.getVersion` answered. */
  readonly version: BrowserVersion;
  /** Whether Chromium's own sandbox is on. */
  readonly chromiumSandbox: boolean;
  /** The path of its WebSocket endpoint, `/devtools/browser/<id>`. */
  readonly path: string;
  /** Resolves once the browser has exited. */
  readonly exited: Promise<void>;
  /** Serves one tunnel stream (HTTP and WebSocket) until either side closes. */
  attach(conn: Deno.Conn, head: Uint8Array): Promise<void>;
  /** A client in this process, with its own browser session. */
  connect(): CdpClient;
  /** Last stderr lines (Chromium is noisy: D-Bus errors etc.). */
  stderrTail(): string[];
  /** Kills the process group, waits until it is gone. Idempotent. */
  close(): Promise<void>;
}

// Runs `$1` arguments after it in the background (the port relay, if any:
// its stdin and stdout kept off the pipe, its stderr ours), then Chromium,
// whose pipe is our stdin and stdout moved to the fds 3 and 4 it reads and
// writes; what Chromium prints goes to stderr.
const LAUNCH_SCRIPT = `n=$1; shift
mkdir -p "$HOME" || exit 1
if [ "$n" -gt 0 ]; then "\${@:1:$n}" </dev/null >/dev/null & fi
shift "$n"
exec 3<&0 4>&1 </dev/null >&2
exec "$@"
`;

// Runs beside Chromium (the same sandbox and network namespace): listens on
// 127.0.0.1 at each port, forwards each connection to `<dir>/<port>`, a
// unix socket whose other end is this process, and says on stderr that it
// is ready (or why it failed), after the nonce it was given: `dir` may be
// read-only. Plain JavaScript for `deno eval`: the SDK's own files may not
// be readable (or even local) where the browser runs; so it has its own
// accept loop and copy.
const PORT_RELAY = `const [nonce, dir, ...ports] = Deno.args;
const quietly = (f) => { try { f(); } catch { /* gone */ } };
async function pump(from, to) {
  const buf = new Uint8Array(65536);
  try {
    for (let n; (n = await from.read(buf)) !== null;) {
      for (let off = 0; off < n;) off += await to.write(buf.subarray(off, n));
    }
    await to.closeWrite();
  } catch {
    quietly(() => from.close());
    quietly(() => to.close());
  }
}
async function relay(conn, path) {
  let upstream;
  try {
    upstream = await Deno.connect({ transport: "unix", path });
  } catch {
    quietly(() => conn.close());
    return;
  }
  await Promise.all([pump(conn, upstream), pump(upstream, conn)]);
  quietly(() => conn.close());
  quietly(() => upstream.close());
}
try {
  for (const port of ports) {
    const listener = Deno.listen({ hostname: "127.0.0.1", port: Number(port) });
    (async () => { for await (const conn of listener) relay(conn, dir + "/" + port); })();
  }
} catch (err) {
  console.error("hud-port-relay " + nonce + " failed: " + String(err?.message ?? err));
  Deno.exit(1);
}
console.error("hud-port-relay " + nonce + " ready");
`;

const DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/** The default spawner: a plain child in its own session (setsid: pid == pgid). */
function spawnPlain(argv: readonly string[], env: Record<string, string>): Deno.ChildProcess {
  return new Deno.Command(argv[0], {
    args: argv.slice(1),
    env,
    clearEnv: true,
    detached: true,
    stdin: "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
}

/** Chromium's words when its own sandbox cannot start here. */
const NO_CHROMIUM_SANDBOX = /No usable sandbox|without --no-sandbox/;

/** Reads a byte stream through `read(p)`, as {@linkcode LineReader} wants. */
function byteReader(
  stream: ReadableStream<Uint8Array>,
): { read(p: Uint8Array): Promise<number | null>; cancel(): Promise<void> } {
  const reader = stream.getReader();
  let rest: Uint8Array | null = null;
  return {
    async read(p) {
      if (rest === null) {
        const { value, done } = await reader.read();
        if (done) return null;
        rest = value;
      }
      const n = Math.min(p.length, rest.length);
      p.set(rest.subarray(0, n));
      rest = n === rest.length ? null : rest.subarray(n);
      return n;
    },
    cancel: () => reader.cancel().catch(() => {}),
  };
}

/**
 * Starts Chromium with `--remote-debugging-pipe` through `spawn`, waits
 * until it answers `Browser.getVersion` over the pipe, and returns it with
 * its relay. Chromium exits by itself when the pipe closes (this process
 * died); `close()` kills the whole group.
 * @throws {TypeError} when Chromium exits before it answers (with its stderr)
 */
export async function launchChromium(options: LaunchOptions = {}): Promise<ChromiumProcess> {
  const { signal } = options;
  signal?.throwIfAborted();
  const ownDir = options.dir === undefined;
  const dir = options.dir ?? await Deno.makeTempDir({ prefix: "hud-browser-" });
  let browser: ChromiumProcess;
  try {
    if ((options.hostPorts ?? []).length > 0 && options.portsDir === undefined) {
      const portsDir = `${dir}/ports`;
      await Deno.remove(portsDir, { recursive: true }).catch(() => {});
      await Deno.mkdir(portsDir, { mode: 0o700 });
      const owner = await Deno.stat(dir);
      if (Deno.uid() === 0 && owner.uid !== null && owner.uid !== 0) {
        await Deno.chown(portsDir, owner.uid, owner.gid);
      }
      options = { ...options, portsDir };
    }
    // Unconfined as root, Chromium's sandbox refuses at once: skip the try.
    const known = options.chromiumSandbox ??
      (options.spawn === undefined && Deno.uid() === 0 ? false : undefined);
    if (known !== undefined) {
      browser = await start(options, dir, known);
    } else {
      try {
        browser = await start(options, dir, true);
      } catch (err) {
        if (!(err instanceof ChromiumExitError && NO_CHROMIUM_SANDBOX.test(err.message))) {
          throw err;
        }
        browser = await start(options, dir, false);
      }
    }
  } catch (err) {
    if (ownDir) await removeDir(dir).catch(() => {});
    throw err;
  }
  if (!ownDir) return browser;
  let closing: Promise<void> | undefined;
  const close = () =>
    closing ??= (async () => {
      await browser.close();
      await removeDir(dir);
    })();
  return { ...browser, close, [Symbol.asyncDispose]: close };
}

/** Chromium exited during startup; the message holds its stderr. */
class ChromiumExitError extends TypeError {
  constructor(message: string) {
    super(message);
    this.name = "TypeError";
  }
}

async function start(
  options: LaunchOptions,
  dir: string,
  chromiumSandbox: boolean,
): Promise<ChromiumProcess> {
  const hostPorts = options.hostPorts ?? [];
  const nonce = crypto.randomUUID();
  const bridges = await PortBridges.open(options.portsDir, hostPorts);
  const relayArgv = hostPorts.length === 0 ? [] : [
    options.deno ?? Deno.execPath(),
    "eval",
    "--no-config",
    "-q",
    PORT_RELAY,
    nonce,
    options.portsDir!,
    ...hostPorts.map(String),
  ];
  // The relay starts beside Chromium, not before it: their start-ups overlap.
  const argv = [
    "bash",
    "--noprofile",
    "--norc",
    "-c",
    LAUNCH_SCRIPT,
    "hud-browser",
    String(relayArgv.length),
    ...relayArgv,
    ...browserArgv(options, dir, chromiumSandbox),
  ];
  let child: Deno.ChildProcess;
  try {
    child = await (options.spawn ?? spawnPlain)(argv, launchEnv(dir, hostPorts.length > 0));
  } catch (err) {
    await bridges.stop();
    throw err;
  }
  const browser = new PipeBrowser(child, nonce, options.stderrLines ?? 50, bridges);
  try {
    const version = await browser.handshake(options.signal, hostPorts.length > 0);
    return browser.handle(dir, version, chromiumSandbox);
  } catch (error) {
    await browser.close();
    throw error;
  }
}

/** Chromium's command line: the pipe, the sandbox or not, the profile in `dir`. */
function browserArgv(options: LaunchOptions, dir: string, chromiumSandbox: boolean): string[] {
  return [
    options.executable ?? "chromium",
    ...DEFAULT_CHROMIUM_ARGS,
    ...(chromiumSandbox ? [] : ["--no-sandbox"]),
    ...(options.args ?? []),
    `--user-data-dir=${dir}/profile`,
    "about:blank",
  ];
}

/** The whole environment of the launch: a home in `dir`, and Deno's for the port relay. */
function launchEnv(dir: string, portRelay: boolean): Record<string, string> {
  const home = `${dir}/home`;
  const env: Record<string, string> = {
    PATH: DEFAULT_PATH,
    HOME: home,
    XDG_CONFIG_HOME: `${home}/.config`,
    XDG_CACHE_HOME: `${home}/.cache`,
    LANG: "C.UTF-8",
  };
  if (portRelay) {
    env.DENO_DIR = `${dir}/deno`;
    env.DENO_NO_UPDATE_CHECK = "1";
    env.NO_COLOR = "1";
  }
  return env;
}

/**
 * This host's side of the `hostPorts` relay: a unix socket per port in the
 * ports directory, each connection joined to 127.0.0.1 at that port.
 */
class PortBridges {
  readonly #listeners: Deno.UnixListener[] = [];
  readonly #bridged = new Set<Promise<void>>();

  /** Listens at `<portsDir>/<port>` for each port (none without ports). */
  static async open(portsDir: string | undefined, ports: readonly number[]): Promise<PortBridges> {
    const bridges = new PortBridges();
    for (const port of ports) {
      const path = `${portsDir!}/${port}`;
      await Deno.remove(path).catch(() => {}); // a try before this one
      const listener = Deno.listen({ transport: "unix", path });
      bridges.#listeners.push(listener);
      // Reachable only through the ports directory, which only the browser's uid may enter.
      await Deno.chmod(path, 0o666);
      bridges.#bridged.add(bridge(listener, port));
    }
    return bridges;
  }

  /** Closes the listeners and waits for their connections to end. */
  async stop(): Promise<void> {
    for (const l of this.#listeners) closeQuietly(l);
    await Promise.allSettled([...this.#bridged]);
  }
}

/**
 * A launched browser and the pipe to it: the relay reads Chromium's
 * messages from its stdout and writes to its stdin; its stderr is drained
 * into a tail, where the port relay also says it is up.
 */
class PipeBrowser {
  readonly #child: Deno.ChildProcess;
  readonly #nonce: string;
  readonly #keep: number;
  readonly #bridges: PortBridges;
  readonly #pipeIn: WritableStreamDefaultWriter<Uint8Array>;
  readonly #source: ReturnType<typeof byteReader>;
  readonly #relay: CdpRelay;
  readonly #tail: string[] = [];
  readonly #relayUp = Promise.withResolvers<void>();
  readonly #drained: Promise<void>;
  readonly #reading: Promise<void>;
  #writing: Promise<void> = Promise.resolve();
  #closing: Promise<void> | undefined;

  constructor(child: Deno.ChildProcess, nonce: string, keep: number, bridges: PortBridges) {
    this.#child = child;
    this.#nonce = nonce;
    this.#keep = keep;
    this.#bridges = bridges;
    this.#pipeIn = child.stdin.getWriter();
    const encoder = new TextEncoder();
    this.#relay = new CdpRelay((message) => {
      const bytes = encoder.encode(`${message}\0`);
      this.#writing = this.#writing.then(() => this.#pipeIn.write(bytes)).catch(() => {});
    });
    this.#relayUp.promise.catch(() => {});
    this.#drained = this.#drainStderr().catch(() => {}).finally(() =>
      this.#relayUp.reject(new TypeError("Chromium exited before its port relay was ready"))
    );
    this.#source = byteReader(child.stdout);
    this.#reading = this.#readPipe().catch(() => this.#relay.end());
  }

  /** Chromium must never block on a full stderr pipe: drain it until EOF. */
  async #drainStderr(): Promise<void> {
    let buf = "";
    for await (const chunk of this.#child.stderr.pipeThrough(new TextDecoderStream())) {
      buf += chunk;
      const lines = buf.split("\n");
      buf = lines.pop() ?? "";
      for (const line of lines) this.#stderrLine(line);
    }
    if (buf) this.#tail.push(buf);
  }

  #stderrLine(line: string): void {
    if (line === `hud-port-relay ${this.#nonce} ready`) this.#relayUp.resolve();
    const failed = `hud-port-relay ${this.#nonce} failed: `;
    if (line.startsWith(failed)) {
      this.#relayUp.reject(
        new TypeError(`Cannot start the browser's port relay: ${line.slice(failed.length)}`),
      );
    }
    this.#tail.push(line);
    if (this.#tail.length > this.#keep) this.#tail.shift();
  }

  /** Hands each NUL-delimited message on the pipe to the relay. */
  async #readPipe(): Promise<void> {
    const reader = new LineReader(this.#source, MAX_MESSAGE, undefined, 64 * 1024, 0);
    const decoder = new TextDecoder();
    try {
      while (true) {
        const frame = await reader.read();
        if (frame === null) break;
        // An oversized message is dropped; the reader resynchronises at the next NUL.
        if (frame.kind === "line") this.#relay.receive(decoder.decode(frame.line));
      }
    } catch (err) {
      if (!isPeerGone(err)) throw err;
    } finally {
      this.#relay.end();
    }
  }

  /**
   * Waits until the browser answers `Browser.getVersion` (and the port
   * relay is up, when there is one).
   * @throws {ChromiumExitError} when Chromium exits first, with its stderr
   */
  async handshake(signal: AbortSignal | undefined, portRelay: boolean): Promise<BrowserVersion> {
    const version = await new Promise<Record<string, unknown>>((resolve, reject) => {
      const onAbort = () => reject(signal!.reason);
      signal?.addEventListener("abort", onAbort, { once: true });
      this.#relay.call("Browser.getVersion").then(resolve, async () => {
        const s = await this.#child.status;
        await this.#drained;
        reject(
          new ChromiumExitError(
            `Chromium exited early (code ${s.code}, signal ${s.signal}):\n${this.#tail.join("\n")}`,
          ),
        );
      }).finally(() => signal?.removeEventListener("abort", onAbort));
    });
    if (portRelay) await abortable(this.#relayUp.promise, signal);
    const known = browserVersion(version);
    this.#relay.version = known;
    return known;
  }

  /** The running browser as callers see it. */
  handle(dir: string, version: BrowserVersion, chromiumSandbox: boolean): ChromiumProcess {
    const relay = this.#relay;
    const close = () => this.close();
    return {
      pid: this.#child.pid,
      dir,
      version,
      chromiumSandbox,
      path: relay.path,
      exited: this.#child.status.then(() => {}, () => {}),
      attach: (conn, head) => relay.attach(conn, head),
      connect: () => relay.connect(),
      stderrTail: () => [...this.#tail],
      close,
      [Symbol.asyncDispose]: close,
    };
  }

  /** Kills the process group and waits until it, the pipe and the bridges are done. */
  close(): Promise<void> {
    return this.#closing ??= this.#close();
  }

  async #close(): Promise<void> {
    const pid = this.#child.pid;
    this.#relay.close();
    try {
      Deno.kill(-pid, "SIGKILL");
    } catch (error) {
      if (!(error instanceof Deno.errors.NotFound)) throw error; // ESRCH: already gone
    }
    await this.#child.status;
    await this.#pipeIn.close().catch(() => {});
    await this.#source.cancel();
    await Promise.all([this.#reading, this.#drained]);
    await this.#bridges.stop();
    // Children are reparented to PID 1 and may linger as zombies; only wait for live ones.
    for (let i = 0; i < 200 && liveGroupMembers(pid).length > 0; i++) await delay(10);
  }
}

/** What `Browser.getVersion` answered, every field a string. */
function browserVersion(answer: Record<string, unknown>): BrowserVersion {
  const v = answer as Partial<BrowserVersion>;
  return {
    protocolVersion: String(v.protocolVersion ?? ""),
    product: String(v.product ?? ""),
    revision: String(v.revision ?? ""),
    userAgent: String(v.userAgent ?? ""),
    jsVersion: String(v.jsVersion ?? ""),
  };
}

/** `promise`, or the signal's reason once it aborts. */
function abortable<T>(promise: Promise<T>, signal: AbortSignal | undefined): Promise<T> {
  if (signal === undefined) return promise;
  signal.throwIfAborted();
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(signal.reason);
    signal.addEventListener("abort", onAbort, { once: true });
    promise.then(resolve, reject).finally(() => signal.removeEventListener("abort", onAbort));
  });
}

/** Accepts on `listener` and joins each connection to 127.0.0.1:`port`. */
async function bridge(listener: Deno.UnixListener, port: number): Promise<void> {
  const tasks = new Set<Promise<void>>();
  const conns = new Set<Deno.Conn>();
  await acceptLoop(listener, (conn) => {
    const task = (async () => {
      conns.add(conn);
      let upstream: Deno.TcpConn | null = null;
      try {
        upstream = await Deno.connect({ hostname: "127.0.0.1", port });
        conns.add(upstream);
        await splice(conn, upstream);
      } catch (err) {
        if (!isPeerGone(err) && !(err instanceof Deno.errors.ConnectionRefused)) throw err;
      } finally {
        closeQuietly(conn);
        conns.delete(conn);
        if (upstream !== null) {
          closeQuietly(upstream);
          conns.delete(upstream);
        }
      }
    })().catch(() => {});
    tasks.add(task);
    task.finally(() => tasks.delete(task));
  });
  for (const c of conns) closeQuietly(c);
  await Promise.allSettled([...tasks]);
}

async function removeDir(dir: string): Promise<void> {
  for (let i = 0;; i++) {
    try {
      await Deno.remove(dir, { recursive: true });
      return;
    } catch (error) {
      if (error instanceof Deno.errors.NotFound) return;
      if (i >= 20) throw error;
      await delay(50);
    }
  }
}
