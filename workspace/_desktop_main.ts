// The desktop's supervisor: the one process this host starts for a desktop,
// inside its sandbox (the workspace's, or one of its own), as the agent's
// user. It starts the X server and serves everything else over its stdin
// and stdout, in frames (see _desktop_pipe.ts): VNC connections, programs
// started on the display, their exits. There is no port and no socket this
// host connects to: a program on the desktop (the agent's, through the
// screen) could swap any socket path for a link to one of the host's, but
// it cannot reach this pipe.
//
// It runs as `deno eval` of SUPERVISOR_SOURCE: the SDK's files may not be
// readable (or even local) in the sandbox, so the functions below use
// nothing but their arguments, each other (errorMessage() from
// _internal/util.ts among them) and Deno's globals, and their source is
// what Function.prototype.toString gives (Deno strips the types).
//
// VNC servers: TigerVNC's Xvnc is the X server and listens on a unix socket
// in the supervisor's private directory (no TCP port: -rfbport -1); with
// x11vnc, Xvfb is the X server and x11vnc listens on such a socket, and on
// a TCP port it cannot be talked out of (its -inetd mode wants a socket, not
// a pipe), which is why it runs only in a network namespace of its own.

import { errorMessage } from "../_internal/util.ts";

/** Frame types of the desktop pipe, shared by both ends through the config. */
export const FRAME = {
  OPEN: 1,
  DATA: 2,
  EOF: 3,
  CLOSE: 4,
  RUN: 5,
  KILL: 6,
  EXIT: 7,
  READY: 8,
  FATAL: 9,
} as const;

/** What the supervisor is told at start (JSON, its only argument). */
export interface DesktopMainConfig {
  /** "tigervnc": Xvnc; "x11vnc": Xvfb and x11vnc. */
  server: "tigervnc" | "x11vnc";
  /** Absolute paths of the programs it runs. */
  programs: { xvnc?: string; xvfb?: string; x11vnc?: string };
  width: number;
  height: number;
  depth: number;
  /** Its private directory (the X authority file, the VNC socket). */
  dir: string;
  /** Bytes a connection may have queued toward the VNC server before it is closed. */
  maxQueue: number;
  /** Bytes of a program's stdout and of its stderr kept for its exit frame. */
  maxOutput: number;
  frames: typeof FRAME;
}

/** One VNC connection, as the supervisor keeps it. */
interface Conn {
  queue: Uint8Array[];
  queued: number;
  wake: (() => void) | null;
  ended: boolean;
  closed: boolean;
  close(): void;
}

/** What the supervisor's functions share. */
interface Supervisor {
  config: DesktopMainConfig;
  send(type: number, id: number, payload?: Uint8Array): Promise<void>;
  sendJson(type: number, id: number, value: unknown): Promise<void>;
  conns: Map<number, Conn>;
  programs: Map<number, Deno.ChildProcess>;
  /** The X server and x11vnc, once started. */
  children: Deno.ChildProcess[];
  /** The programs' environment: DISPLAY, XAUTHORITY and the supervisor's own. */
  env: Record<string, string>;
  authFile: string;
  socket: string;
}

/** Ends everything it started (unconfined, nothing else would), then itself. */
function shutdown(s: Supervisor, code: number): never {
  const quietly = (f: () => void) => {
    try {
      f();
    } catch {
      // gone already
    }
  };
  for (const child of s.programs.values()) quietly(() => child.kill("SIGKILL"));
  for (const conn of s.conns.values()) conn.close();
  for (const child of s.children) quietly(() => child.kill("SIGKILL"));
  Deno.exit(code);
}

/** Says why it cannot go on, and ends. */
async function fatal(s: Supervisor, message: string): Promise<never> {
  await s.sendJson(s.config.frames.FATAL, 0, { message });
  return shutdown(s, 1);
}

/**
 * The X authority file: one MIT-MAGIC-COOKIE-1 entry for any address
 * (FamilyWild) and `display`; programs on the display get it through
 * XAUTHORITY, and no other client gets in.
 */
function writeXauthority(path: string, display: string, cookie: Uint8Array): void {
  const encoder = new TextEncoder();
  const field = (b: Uint8Array) => [b.length >> 8, b.length & 0xff, ...b];
  const bytes = new Uint8Array([
    0xff,
    0xff,
    ...field(new Uint8Array()),
    ...field(encoder.encode(display)),
    ...field(encoder.encode("MIT-MAGIC-COOKIE-1")),
    ...field(cookie),
  ]);
  Deno.writeFileSync(path, bytes, { mode: 0o600 });
}

/**
 * Starts the X server (Xvnc or Xvfb) with -displayfd 1: it picks a free
 * display and prints its number. Keeps the last lines it says on stderr.
 */
async function startX(s: Supervisor, log: string[]): Promise<string> {
  const c = s.config;
  const common = ["-displayfd", "1", "-nolisten", "tcp", "-nolisten", "local", "-auth", s.authFile];
  const args = c.server === "tigervnc"
    ? [
      ...common,
      ...["-geometry", `${c.width}x${c.height}`, "-depth", String(c.depth)],
      ...["-rfbunixpath", s.socket, "-rfbunixmode", "0600", "-rfbport", "-1"],
      ...["-SecurityTypes", "None", "-AlwaysShared", "-desktop", "hud"],
    ]
    : [...common, "-screen", "0", `${c.width}x${c.height}x${c.depth}`];
  const program = c.server === "tigervnc" ? c.programs.xvnc! : c.programs.xvfb!;
  let x: Deno.ChildProcess;
  try {
    x = new Deno.Command(program, { args, stdin: "null", stdout: "piped", stderr: "piped" })
      .spawn();
  } catch (err) {
    return await fatal(s, `cannot run ${program}: ${errorMessage(err)}`);
  }
  s.children.push(x);
  (async () => {
    for await (const chunk of x.stderr.pipeThrough(new TextDecoderStream())) {
      log.push(...chunk.split("\n").filter((l) => l.trim() !== ""));
      log.splice(0, Math.max(0, log.length - 20));
    }
  })().catch(() => {});
  let text = "";
  const reader = x.stdout.pipeThrough(new TextDecoderStream()).getReader();
  while (!text.includes("\n")) {
    const { value, done } = await reader.read();
    if (done) {
      await x.status;
      return await fatal(s, `${program} exited at start: ${log.slice(-5).join(" / ")}`);
    }
    text += value;
  }
  reader.cancel().catch(() => {});
  x.status.then(() => fatal(s, `the X server exited: ${log.slice(-5).join(" / ")}`));
  return text.trim();
}

/** Starts x11vnc on the display, on the same socket path as Xvnc's. */
async function startX11vnc(s: Supervisor, display: string): Promise<void> {
  let vnc: Deno.ChildProcess;
  try {
    vnc = new Deno.Command(s.config.programs.x11vnc!, {
      args: [
        ...["-display", `:${display}`, "-auth", s.authFile, "-unixsock", s.socket],
        // It listens on TCP too, whatever it is told: only in the sandbox's
        // own network namespace (desktop.ts sees to that).
        ...["-rfbport", "0", "-listen", "127.0.0.1", "-no6"],
        ...["-forever", "-shared", "-nopw", "-norc", "-noncache", "-quiet"],
      ],
      env: s.env,
      clearEnv: true,
      stdin: "null",
      stdout: "null",
      stderr: "null",
    }).spawn();
  } catch (err) {
    return await fatal(s, `cannot run x11vnc: ${errorMessage(err)}`);
  }
  s.children.push(vnc);
  vnc.status.then(() => fatal(s, "x11vnc exited"));
}

/** Waits (bounded) until the VNC server's socket takes connections. */
async function waitForSocket(s: Supervisor, log: string[]): Promise<void> {
  for (let i = 0;; i++) {
    try {
      (await Deno.connect({ transport: "unix", path: s.socket })).close();
      return;
    } catch {
      if (i >= 400) {
        return await fatal(s, `the VNC server made no socket: ${log.slice(-5).join(" / ")}`);
      }
      await new Promise((r) => setTimeout(r, 25));
    }
  }
}

/**
 * One VNC connection: bytes from the host queue toward the server (the
 * frame reader closes it past maxQueue, so a stalled server cannot hold the
 * pipe), bytes from the server go out as DATA frames.
 */
async function openConn(s: Supervisor, id: number): Promise<void> {
  const F = s.config.frames;
  let socket: Deno.UnixConn;
  try {
    socket = await Deno.connect({ transport: "unix", path: s.socket });
  } catch (err) {
    const why = `cannot reach the VNC server: ${errorMessage(err)}`;
    return await s.send(F.CLOSE, id, new TextEncoder().encode(why));
  }
  const writer = socket.writable.getWriter();
  const conn: Conn = {
    queue: [],
    queued: 0,
    wake: null,
    ended: false,
    closed: false,
    close() {
      if (conn.closed) return;
      conn.closed = true;
      s.conns.delete(id);
      try {
        socket.close();
      } catch {
        // closed
      }
      conn.wake?.();
    },
  };
  s.conns.set(id, conn);
  (async () => {
    try {
      for await (const chunk of socket.readable) await s.send(F.DATA, id, chunk);
      await s.send(F.EOF, id);
    } catch {
      if (!conn.closed) await s.send(F.CLOSE, id);
    }
  })();
  pumpToServer(s, id, conn, writer);
}

/** Writes what the host sent for a connection to the VNC server, in order, as it comes. */
async function pumpToServer(
  s: Supervisor,
  id: number,
  conn: Conn,
  writer: WritableStreamDefaultWriter<Uint8Array>,
): Promise<void> {
  try {
    while (!conn.closed) {
      const next = conn.queue.shift();
      if (next !== undefined) {
        conn.queued -= next.length;
        await writer.write(next);
      } else if (conn.ended) return await writer.close();
      else {
        await new Promise<void>((r) => conn.wake = r);
        conn.wake = null;
      }
    }
  } catch {
    if (!conn.closed) await s.send(s.config.frames.CLOSE, id);
    conn.close();
  }
}

/** Reads a stream to its end, keeping its first `max` bytes as text. */
async function collect(stream: ReadableStream<Uint8Array>, max: number): Promise<string> {
  const parts: Uint8Array<ArrayBuffer>[] = [];
  let kept = 0;
  for await (const chunk of stream) {
    if (kept >= max) continue;
    parts.push(chunk.slice(0, max - kept));
    kept += Math.min(chunk.length, max - kept);
  }
  return new TextDecoder().decode(await new Blob(parts).bytes());
}

/** A program on the display: its exit (and output, when asked) goes back. */
function runProgram(
  s: Supervisor,
  id: number,
  spec: { argv: string[]; env?: Record<string, string>; cwd?: string; capture?: boolean },
): void {
  const F = s.config.frames;
  let child: Deno.ChildProcess;
  try {
    child = new Deno.Command(spec.argv[0], {
      args: spec.argv.slice(1),
      env: { ...s.env, ...(spec.env ?? {}) },
      clearEnv: true,
      cwd: spec.cwd,
      stdin: "null",
      stdout: spec.capture ? "piped" : "null",
      stderr: spec.capture ? "piped" : "null",
    }).spawn();
  } catch (err) {
    s.sendJson(F.EXIT, id, { error: errorMessage(err) });
    return;
  }
  s.programs.set(id, child);
  Promise.all([
    child.status,
    spec.capture ? collect(child.stdout, s.config.maxOutput) : "",
    spec.capture ? collect(child.stderr, s.config.maxOutput) : "",
  ]).then(([status, stdout, stderr]) => {
    s.programs.delete(id);
    const code = status.signal ? null : status.code;
    s.sendJson(F.EXIT, id, { code, signal: status.signal, stdout, stderr });
  });
}

/** Acts on one frame from the host. */
async function onFrame(s: Supervisor, type: number, id: number, payload: Uint8Array) {
  const F = s.config.frames;
  const conn = s.conns.get(id);
  if (type === F.OPEN) await openConn(s, id);
  else if (type === F.DATA && conn !== undefined && !conn.ended) {
    conn.queue.push(payload);
    conn.queued += payload.length;
    if (conn.queued <= s.config.maxQueue) return conn.wake?.();
    conn.close();
    await s.send(F.CLOSE, id, new TextEncoder().encode("the VNC server is not reading"));
  } else if (type === F.EOF && conn !== undefined) {
    conn.ended = true;
    conn.wake?.();
  } else if (type === F.CLOSE && conn !== undefined) conn.close();
  else if (type === F.RUN) runProgram(s, id, JSON.parse(new TextDecoder().decode(payload)));
  else if (type === F.KILL) {
    try {
      s.programs.get(id)?.kill(new TextDecoder().decode(payload) as Deno.Signal);
    } catch {
      // gone already
    }
  }
}

/** Frames from the host, until it goes away (then everything here ends). */
async function readFrames(s: Supervisor): Promise<never> {
  const input = Deno.stdin.readable.getReader();
  let buf = new Uint8Array(0);
  const need = async (n: number) => {
    while (buf.length < n) {
      const { value, done } = await input.read();
      if (done || value === undefined) return shutdown(s, 0);
      const next = new Uint8Array(buf.length + value.length);
      next.set(buf);
      next.set(value, buf.length);
      buf = next;
    }
  };
  for (;;) {
    await need(9);
    const v = new DataView(buf.buffer, buf.byteOffset, 9);
    const [type, id, length] = [v.getUint8(0), v.getUint32(1), v.getUint32(5)];
    await need(9 + length);
    const payload = buf.slice(9, 9 + length);
    buf = buf.subarray(9 + length);
    await onFrame(s, type, id, payload);
  }
}

/** The supervisor's entry point. */
export async function desktopMain(config: DesktopMainConfig): Promise<void> {
  const stdout = Deno.stdout.writable.getWriter();
  let writing: Promise<void> = Promise.resolve();
  const s: Supervisor = {
    config,
    send(type, id, payload = new Uint8Array()) {
      const frame = new Uint8Array(9 + payload.length);
      const v = new DataView(frame.buffer);
      v.setUint8(0, type);
      v.setUint32(1, id);
      v.setUint32(5, payload.length);
      frame.set(payload, 9);
      writing = writing.then(() => stdout.write(frame)).catch(() => shutdown(s, 0));
      return writing;
    },
    sendJson: (type, id, value) =>
      s.send(type, id, new TextEncoder().encode(JSON.stringify(value))),
    conns: new Map(),
    programs: new Map(),
    children: [],
    env: {},
    authFile: `${config.dir}/Xauthority`,
    socket: `${config.dir}/rfb.sock`,
  };
  Deno.mkdirSync(config.dir, { recursive: true, mode: 0o700 });
  const cookie = crypto.getRandomValues(new Uint8Array(16));
  writeXauthority(s.authFile, "0", cookie);
  const log: string[] = [];
  const display = await startX(s, log);
  writeXauthority(s.authFile, display, cookie);
  for (const [key, value] of Object.entries(Deno.env.toObject())) {
    if (!key.startsWith("DENO_") && key !== "NO_COLOR") s.env[key] = value;
  }
  s.env.DISPLAY = `:${display}`;
  s.env.XAUTHORITY = s.authFile;
  if (config.server === "x11vnc") await startX11vnc(s, display);
  await waitForSocket(s, log);
  await s.sendJson(config.frames.READY, 0, { display: Number(display) });
  await readFrames(s);
}

/** The program `deno eval` runs: the functions above, then the entry point on its argument. */
export const SUPERVISOR_SOURCE: string = [
  errorMessage,
  shutdown,
  fatal,
  writeXauthority,
  startX,
  startX11vnc,
  waitForSocket,
  openConn,
  pumpToServer,
  collect,
  runProgram,
  onFrame,
  readFrames,
  desktopMain,
].map(String).join("\n\n") + "\n\ndesktopMain(JSON.parse(Deno.args[0]));\n";
