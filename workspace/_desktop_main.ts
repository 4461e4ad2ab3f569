// The desktop's supervisor: the one process this host starts for a desktop,
// inside its sandbox (the workspace's, or one of its own), as the agent's
// user. It starts the X server and serves everything else over its stdin
// and stdout, in frames (see _desktop_pipe.ts): VNC connections, programs
// started on the display, their exits. There is no port and no socket this
// host connects to: a program on the desktop (the agent's, through the
// screen) could swap any socket path for a link to one of the host's, but
// it cannot reach this pipe.
//
// It runs as `deno eval "(<this function>)(config)"`: the SDK's files may
// not be readable (or even local) in the sandbox, so the function uses
// nothing but its argument and Deno's globals, and its source is what
// Function.prototype.toString gives (Deno strips the types).
//
// VNC servers: TigerVNC's Xvnc is the X server and listens on a unix socket
// in the supervisor's private directory (no TCP port: -rfbport -1); with
// x11vnc, Xvfb is the X server and x11vnc listens on such a socket, and on
// a TCP port it cannot be talked out of (its -inetd mode wants a socket, not
// a pipe), which is why it runs only in a network namespace of its own.

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

/** The supervisor itself. Self-contained: see the module comment. */
export async function desktopMain(config: DesktopMainConfig): Promise<void> {
  const F = config.frames;
  const encoder = new TextEncoder();
  interface Conn {
    queue: Uint8Array[];
    queued: number;
    wake: (() => void) | null;
    ended: boolean;
    closed: boolean;
    close(): void;
  }
  const conns = new Map<number, Conn>();
  const programs = new Map<number, Deno.ChildProcess>();
  let x: Deno.ChildProcess | null = null;
  let vnc: Deno.ChildProcess | null = null;
  const quietly = (f: () => unknown) => {
    try {
      f();
    } catch {
      // gone already
    }
  };
  // Unconfined (isolation "none") nothing else ends what this started when
  // this host goes away: the X server and the programs end with it.
  const shutdown = (code = 0): never => {
    for (const child of programs.values()) quietly(() => child.kill("SIGKILL"));
    for (const conn of conns.values()) conn.close();
    for (const p of [x, vnc]) if (p !== null) quietly(() => p.kill("SIGKILL"));
    Deno.exit(code);
  };
  const stdout = Deno.stdout.writable.getWriter();
  let writing: Promise<void> = Promise.resolve();
  const send = (type: number, id: number, payload: Uint8Array = new Uint8Array()) => {
    const frame = new Uint8Array(9 + payload.length);
    const v = new DataView(frame.buffer);
    v.setUint8(0, type);
    v.setUint32(1, id);
    v.setUint32(5, payload.length);
    frame.set(payload, 9);
    writing = writing.then(() => stdout.write(frame)).catch(() => shutdown());
    return writing;
  };
  const sendJson = (type: number, id: number, value: unknown) =>
    send(type, id, encoder.encode(JSON.stringify(value)));
  const fatal = async (message: string) => {
    await sendJson(F.FATAL, 0, { message });
    return shutdown(1);
  };

  // The X authority file: one MIT-MAGIC-COOKIE-1 entry for any address
  // (FamilyWild) and display `n`; programs on the display get it through
  // XAUTHORITY, and no other client gets in.
  const cookie = crypto.getRandomValues(new Uint8Array(16));
  const authFile = `${config.dir}/Xauthority`;
  const writeAuth = (display: string) => {
    const field = (b: Uint8Array) => [b.length >> 8, b.length & 0xff, ...b];
    const bytes = new Uint8Array([
      0xff,
      0xff,
      ...field(new Uint8Array()),
      ...field(encoder.encode(display)),
      ...field(encoder.encode("MIT-MAGIC-COOKIE-1")),
      ...field(cookie),
    ]);
    Deno.writeFileSync(authFile, bytes, { mode: 0o600 });
  };
  Deno.mkdirSync(config.dir, { recursive: true, mode: 0o700 });
  writeAuth("0");

  // The X server, with -displayfd 1: it picks a free display and prints its number.
  const socket = `${config.dir}/rfb.sock`;
  const common = ["-displayfd", "1", "-nolisten", "tcp", "-nolisten", "local", "-auth", authFile];
  const xArgs = config.server === "tigervnc"
    ? [
      ...common,
      "-geometry",
      `${config.width}x${config.height}`,
      "-depth",
      String(config.depth),
      "-rfbunixpath",
      socket,
      "-rfbunixmode",
      "0600",
      "-rfbport",
      "-1",
      "-SecurityTypes",
      "None",
      "-AlwaysShared",
      "-desktop",
      "hud",
    ]
    : [...common, "-screen", "0", `${config.width}x${config.height}x${config.depth}`];
  const xProgram = config.server === "tigervnc" ? config.programs.xvnc! : config.programs.xvfb!;
  let xChild: Deno.ChildProcess;
  try {
    xChild = new Deno.Command(xProgram, {
      args: xArgs,
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
    }).spawn();
  } catch (err) {
    return await fatal(`cannot run ${xProgram}: ${(err as Error).message}`);
  }
  x = xChild;
  const xLog: string[] = [];
  (async () => {
    const lines = xChild.stderr.pipeThrough(new TextDecoderStream());
    for await (const chunk of lines) {
      xLog.push(...chunk.split("\n").filter((l) => l.trim() !== ""));
      xLog.splice(0, Math.max(0, xLog.length - 20));
    }
  })().catch(() => {});
  let displayText = "";
  const reader = xChild.stdout.pipeThrough(new TextDecoderStream()).getReader();
  while (!displayText.includes("\n")) {
    const { value, done } = await reader.read();
    if (done) {
      await xChild.status;
      return await fatal(`${xProgram} exited at start: ${xLog.slice(-5).join(" / ")}`);
    }
    displayText += value;
  }
  reader.cancel().catch(() => {});
  const display = displayText.trim();
  writeAuth(display);
  xChild.status.then(() => fatal(`the X server exited: ${xLog.slice(-5).join(" / ")}`));

  const baseEnv: Record<string, string> = {};
  for (const key of ["PATH", "HOME", "USER", "LANG"]) {
    const value = Deno.env.get(key);
    if (value !== undefined) baseEnv[key] = value;
  }
  for (const [key, value] of Object.entries(Deno.env.toObject())) {
    if (!key.startsWith("DENO_") && key !== "NO_COLOR") baseEnv[key] = value;
  }
  baseEnv.DISPLAY = `:${display}`;
  baseEnv.XAUTHORITY = authFile;

  // x11vnc is started once the display is up, on the same socket path.
  if (config.server === "x11vnc") {
    try {
      vnc = new Deno.Command(config.programs.x11vnc!, {
        args: [
          "-display",
          `:${display}`,
          "-auth",
          authFile,
          "-unixsock",
          socket,
          // It listens on TCP too, whatever it is told: only in the
          // sandbox's own network namespace (desktop.ts sees to that).
          "-rfbport",
          "0",
          "-listen",
          "127.0.0.1",
          "-no6",
          "-forever",
          "-shared",
          "-nopw",
          "-norc",
          "-noncache",
          "-quiet",
        ],
        env: baseEnv,
        clearEnv: true,
        stdin: "null",
        stdout: "null",
        stderr: "null",
      }).spawn();
    } catch (err) {
      return await fatal(`cannot run x11vnc: ${(err as Error).message}`);
    }
    vnc.status.then(() => fatal("x11vnc exited"));
  }
  // The VNC server makes its socket once it is up; wait for it, bounded.
  for (let i = 0;; i++) {
    try {
      (await Deno.connect({ transport: "unix", path: socket })).close();
      break;
    } catch {
      if (i >= 400) {
        return await fatal(`the VNC server made no socket: ${xLog.slice(-5).join(" / ")}`);
      }
      await new Promise((r) => setTimeout(r, 25));
    }
  }

  // One VNC connection: bytes from the host queue toward the server (closed
  // past maxQueue, so a stalled server cannot hold the pipe), bytes from the
  // server go out as DATA frames.
  const open = async (id: number) => {
    let writable: WritableStreamDefaultWriter<Uint8Array>;
    let readable: ReadableStream<Uint8Array>;
    let closeAll: () => void;
    try {
      const c = await Deno.connect({ transport: "unix", path: socket });
      writable = c.writable.getWriter();
      readable = c.readable;
      closeAll = () => quietly(() => c.close());
    } catch (err) {
      await send(
        F.CLOSE,
        id,
        encoder.encode(`cannot reach the VNC server: ${(err as Error).message}`),
      );
      return;
    }
    const conn: Conn = {
      queue: [],
      queued: 0,
      wake: null,
      ended: false,
      closed: false,
      close() {
        if (conn.closed) return;
        conn.closed = true;
        conns.delete(id);
        closeAll();
        conn.wake?.();
      },
    };
    conns.set(id, conn);
    (async () => {
      try {
        for await (const chunk of readable) await send(F.DATA, id, chunk);
        await send(F.EOF, id);
      } catch {
        if (!conn.closed) await send(F.CLOSE, id);
      }
    })();
    (async () => {
      try {
        while (!conn.closed) {
          const next = conn.queue.shift();
          if (next === undefined) {
            if (conn.ended) {
              await writable.close();
              return;
            }
            await new Promise<void>((r) => conn.wake = r);
            conn.wake = null;
            continue;
          }
          conn.queued -= next.length;
          await writable.write(next);
        }
      } catch {
        if (!conn.closed) await send(F.CLOSE, id);
        conn.close();
      }
    })();
  };

  // A program on the display: its exit (and output, when asked) goes back.
  const run = (
    id: number,
    spec: { argv: string[]; env?: Record<string, string>; cwd?: string; capture?: boolean },
  ) => {
    let child: Deno.ChildProcess;
    try {
      child = new Deno.Command(spec.argv[0], {
        args: spec.argv.slice(1),
        env: { ...baseEnv, ...(spec.env ?? {}) },
        clearEnv: true,
        cwd: spec.cwd,
        stdin: "null",
        stdout: spec.capture ? "piped" : "null",
        stderr: spec.capture ? "piped" : "null",
      }).spawn();
    } catch (err) {
      sendJson(F.EXIT, id, { error: (err as Error).message });
      return;
    }
    programs.set(id, child);
    const collect = async (stream: ReadableStream<Uint8Array> | null) => {
      if (stream === null || !spec.capture) return "";
      const parts: Uint8Array<ArrayBuffer>[] = [];
      let kept = 0;
      for await (const chunk of stream) {
        if (kept < config.maxOutput) {
          parts.push(chunk.slice(0, config.maxOutput - kept));
          kept += Math.min(chunk.length, config.maxOutput - kept);
        }
      }
      return new TextDecoder().decode(await new Blob(parts).bytes());
    };
    Promise.all([
      child.status,
      collect(spec.capture ? child.stdout : null),
      collect(spec.capture ? child.stderr : null),
    ]).then(([status, out, err]) => {
      programs.delete(id);
      sendJson(F.EXIT, id, {
        code: status.signal ? null : status.code,
        signal: status.signal,
        stdout: out,
        stderr: err,
      });
    });
  };

  await sendJson(F.READY, 0, { display: Number(display) });

  // Frames from the host, until it goes away (then everything here ends with the sandbox).
  const input = Deno.stdin.readable.getReader();
  let buf = new Uint8Array(0);
  const need = async (n: number) => {
    while (buf.length < n) {
      const { value, done } = await input.read();
      if (done || value === undefined) return shutdown();
      const next = new Uint8Array(buf.length + value.length);
      next.set(buf);
      next.set(value, buf.length);
      buf = next;
    }
  };
  const decoder = new TextDecoder();
  for (;;) {
    await need(9);
    const v = new DataView(buf.buffer, buf.byteOffset, 9);
    const type = v.getUint8(0);
    const id = v.getUint32(1);
    const length = v.getUint32(5);
    await need(9 + length);
    const payload = buf.slice(9, 9 + length);
    buf = buf.subarray(9 + length);
    const conn = conns.get(id);
    if (type === F.OPEN) await open(id);
    else if (type === F.DATA && conn !== undefined && !conn.ended) {
      conn.queue.push(payload);
      conn.queued += payload.length;
      if (conn.queued > config.maxQueue) {
        conn.close();
        await send(F.CLOSE, id, encoder.encode("the VNC server is not reading"));
      } else conn.wake?.();
    } else if (type === F.EOF && conn !== undefined) {
      conn.ended = true;
      conn.wake?.();
    } else if (type === F.CLOSE && conn !== undefined) conn.close();
    else if (type === F.RUN) run(id, JSON.parse(decoder.decode(payload)));
    else if (type === F.KILL) {
      const child = programs.get(id);
      if (child !== undefined) quietly(() => child.kill(decoder.decode(payload) as Deno.Signal));
    }
  }
}
