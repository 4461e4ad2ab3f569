// Helpers for the SSH tests: running OpenSSH's ssh, starting sshd, process checks.

import { generateSshKeyPair, type SshKeyPair } from "../../ssh/mod.ts";

export const CIPHERS = [
  "chacha20-poly1305@openssh.com",
  "aes128-ctr",
  "aes256-ctr",
  "aes128-gcm@openssh.com",
  "aes256-gcm@openssh.com",
] as const;
export const MACS = ["hmac-sha2-256", "hmac-sha2-256-etm@openssh.com"] as const;

export interface SshRun {
  code: number;
  stdout: Uint8Array;
  stderr: string;
}

/**
 * OpenSSH client options that read no config file, trust only the host keys
 * in `knownHosts`, offer only `key`, and never prompt.
 */
export function opensshOptions(knownHosts: string, key: string): string[] {
  return [
    "-F",
    "/dev/null",
    "-o",
    "StrictHostKeyChecking=yes",
    "-o",
    `UserKnownHostsFile=${knownHosts}`,
    "-o",
    "GlobalKnownHostsFile=/dev/null",
    "-o",
    "BatchMode=yes",
    "-o",
    "IdentitiesOnly=yes",
    "-i",
    key,
  ];
}

/** Runs OpenSSH's `ssh` with a private known_hosts file and key. */
export async function runSsh(
  opts: { port: number; key: string; knownHosts: string; user?: string },
  args: string[],
  stdin?: Uint8Array | string,
): Promise<SshRun> {
  const cmd = new Deno.Command("ssh", {
    args: [
      ...opensshOptions(opts.knownHosts, opts.key),
      "-o",
      "LogLevel=ERROR",
      "-p",
      String(opts.port),
      ...args.slice(0, -1),
      `${opts.user ?? "agent"}@127.0.0.1`,
      ...args.slice(-1),
    ],
    stdin: stdin === undefined ? "null" : "piped",
    stdout: "piped",
    stderr: "piped",
  });
  const child = cmd.spawn();
  // Read while writing: ssh stops reading stdin when its stdout is not read.
  const output = child.output();
  if (stdin !== undefined) {
    const w = child.stdin.getWriter();
    await w.write(typeof stdin === "string" ? new TextEncoder().encode(stdin) : stdin).catch(
      () => {},
    );
    await w.close().catch(() => {});
  }
  const out = await output;
  return { code: out.code, stdout: out.stdout, stderr: new TextDecoder().decode(out.stderr) };
}

/** Whether a process is gone (or a zombie nobody has reaped yet). */
export function processGone(pid: number): boolean {
  try {
    const stat = Deno.readTextFileSync(`/proc/${pid}/stat`);
    return stat.slice(stat.lastIndexOf(")") + 2).startsWith("Z");
  } catch {
    return true;
  }
}

/** Polls until `pid` is gone; false after `ms`. */
export async function waitGone(pid: number, ms = 3000): Promise<boolean> {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (processGone(pid)) return true;
    await new Promise((r) => setTimeout(r, 25));
  }
  return processGone(pid);
}

export function sha256Hex(data: Uint8Array): Promise<string> {
  return crypto.subtle.digest("SHA-256", data as Uint8Array<ArrayBuffer>).then((d) =>
    Array.from(new Uint8Array(d), (b) => b.toString(16).padStart(2, "0")).join("")
  );
}

/** 16 MiB of pseudo-random bytes (fast, deterministic). */
export function bigData(size = 16 * 1024 * 1024): Uint8Array {
  const out = new Uint8Array(size);
  const words = new Uint32Array(out.buffer);
  let x = 0x9e3779b9;
  for (let i = 0; i < words.length; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    words[i] = x;
  }
  return out;
}

function freePort(): number {
  const l = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (l.addr as Deno.NetAddr).port;
  l.close();
  return port;
}

/** OpenSSH's sshd on a loopback port with its own config and keys. */
export interface Sshd extends AsyncDisposable {
  port: number;
  user: string;
  host: SshKeyPair;
  client: SshKeyPair;
  dir: string;
}

/** Starts sshd; resolves once it accepts connections. */
export async function startSshd(extraConfig = ""): Promise<Sshd> {
  const dir = await Deno.makeTempDir({ prefix: "sshd-test-" });
  const host = await generateSshKeyPair({ comment: "sshd-host" });
  const client = await generateSshKeyPair({ comment: "sshd-client" });
  await Deno.writeTextFile(`${dir}/host_ed25519`, host.privateKey, { mode: 0o600 });
  await Deno.writeTextFile(`${dir}/authorized_keys`, `${client.publicKey}\n`);
  await Deno.mkdir("/run/sshd", { recursive: true }).catch(() => {});
  const user = new TextDecoder().decode(
    new Deno.Command("id", { args: ["-un"] }).outputSync().stdout,
  )
    .trim();
  let lastErr = "";
  for (let attempt = 0; attempt < 3; attempt++) {
    const port = freePort();
    await Deno.writeTextFile(
      `${dir}/sshd_config`,
      [
        `Port ${port}`,
        "ListenAddress 127.0.0.1",
        `HostKey ${dir}/host_ed25519`,
        `AuthorizedKeysFile ${dir}/authorized_keys`,
        "PidFile none",
        "UsePAM no",
        "StrictModes no",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PermitRootLogin yes",
        "MaxSessions 64",
        "MaxStartups 64",
        "LogLevel ERROR",
        // Sessions get an empty home: the shell sshd starts for a command
        // reads ~/.bashrc (Debian's bash does so even without a terminal),
        // and this machine's root profile runs pyenv, whose rehash lock
        // makes 20 logins at once wait up to a minute each.
        `SetEnv HOME=${dir}`,
        extraConfig,
      ].join("\n") + "\n",
    );
    const proc = new Deno.Command("/usr/sbin/sshd", {
      args: ["-D", "-e", "-f", `${dir}/sshd_config`],
      stdin: "null",
      stdout: "null",
      stderr: "piped",
    }).spawn();
    const errText = proc.stderr.pipeThrough(new TextDecoderStream()).getReader();
    const collected = (async () => {
      let s = "";
      while (true) {
        const { value, done } = await errText.read();
        if (done) return s;
        s += value;
      }
    })();
    let up = false;
    for (let i = 0; i < 100 && !up; i++) {
      try {
        const c = await Deno.connect({ hostname: "127.0.0.1", port });
        c.close();
        up = true;
      } catch {
        await new Promise((r) => setTimeout(r, 20));
      }
    }
    if (up) {
      return {
        port,
        user,
        host,
        client,
        dir,
        async [Symbol.asyncDispose]() {
          try {
            proc.kill("SIGTERM");
          } catch {
            // already gone
          }
          await proc.status;
          await collected;
          await Deno.remove(dir, { recursive: true });
        },
      };
    }
    try {
      proc.kill("SIGKILL");
    } catch {
      // already gone
    }
    await proc.status;
    lastErr = await collected;
  }
  throw new Error(`Cannot start sshd: ${lastErr}`);
}

/**
 * A TCP proxy in front of `target`: `cut()` drops every connection through
 * it (no FIN to either side's peer protocol); `flipAt` flips one bit of the
 * client-to-server stream at that byte offset of each connection.
 */
export class TcpProxy implements AsyncDisposable {
  readonly #listener: Deno.TcpListener;
  readonly #target: number;
  readonly #flipAt: number | undefined;
  readonly #conns = new Set<Deno.Conn>();
  readonly #tasks = new Set<Promise<void>>();
  readonly #accepting: Promise<void>;

  constructor(target: number, options: { flipAt?: number } = {}) {
    this.#target = target;
    this.#flipAt = options.flipAt;
    this.#listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
    this.#accepting = this.#accept();
  }

  get port(): number {
    return this.#listener.addr.port;
  }

  async #accept(): Promise<void> {
    while (true) {
      let a: Deno.Conn;
      try {
        a = await this.#listener.accept();
      } catch {
        return;
      }
      const task = (async () => {
        let b: Deno.Conn;
        try {
          b = await Deno.connect({ hostname: "127.0.0.1", port: this.#target });
        } catch {
          a.close();
          return;
        }
        this.#conns.add(a);
        this.#conns.add(b);
        await Promise.all([this.#pump(a, b, this.#flipAt), this.#pump(b, a, undefined)]);
        for (const c of [a, b]) {
          this.#conns.delete(c);
          try {
            c.close();
          } catch {
            // already closed by cut()
          }
        }
      })();
      this.#tasks.add(task);
      task.finally(() => this.#tasks.delete(task));
    }
  }

  async #pump(from: Deno.Conn, to: Deno.Conn, flipAt: number | undefined): Promise<void> {
    const buf = new Uint8Array(65536);
    let seen = 0;
    try {
      while (true) {
        const n = await from.read(buf);
        if (n === null) break;
        if (flipAt !== undefined && seen <= flipAt && flipAt < seen + n) buf[flipAt - seen] ^= 1;
        seen += n;
        let off = 0;
        while (off < n) off += await to.write(buf.subarray(off, n));
      }
      await to.closeWrite();
    } catch {
      // a side went away, or cut()
    }
  }

  /** Drops every connection through the proxy. */
  cut(): void {
    for (const c of this.#conns) {
      try {
        c.close();
      } catch {
        // already closed
      }
    }
    this.#conns.clear();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    this.#listener.close();
    await this.#accepting;
    this.cut();
    await Promise.allSettled([...this.#tasks]);
  }
}

/** Our server on a temporary root, with a key file and known_hosts for OpenSSH tools. */
export interface TestServer extends AsyncDisposable {
  root: string;
  home: string;
  port: number;
  host: SshKeyPair;
  key: SshKeyPair;
  keyPath: string;
  knownHosts: string;
  /** OpenSSH options logging in to it (add -p/-P yourself). */
  sshOptions: string[];
  /** Errors the server reported through onError. */
  errors: unknown[];
}

/** Starts startSshServer() on a fresh root directory. */
export async function startTestServer(
  options: {
    sftp?: boolean;
    rekeyLimit?: number;
    viaLink?: boolean;
    ciphers?: readonly string[];
    sftpCommand?: readonly string[];
  } = {},
): Promise<TestServer> {
  const { startSshServer } = await import("../../ssh/server.ts");
  const root = await Deno.realPath(await Deno.makeTempDir({ prefix: "ssh-root-" }));
  const home = await Deno.makeTempDir({ prefix: "ssh-home-" });
  const host = await generateSshKeyPair();
  const key = await generateSshKeyPair();
  const errors: unknown[] = [];
  const { viaLink, ...serverOptions } = options;
  let cwd = root;
  if (viaLink) {
    cwd = `${home}/root-link`;
    await Deno.symlink(root, cwd);
  }
  const server = startSshServer({
    hostKey: host.privateKey,
    authorizedKeys: [key.publicKey],
    cwd,
    env: { HOME: home },
    user: "agent",
    onError: (e) => errors.push(e),
    ...serverOptions,
  });
  const port = server.addr.port;
  const keyPath = `${home}/id_ed25519`;
  await Deno.writeTextFile(keyPath, key.privateKey, { mode: 0o600 });
  const knownHosts = `${home}/known_hosts`;
  await Deno.writeTextFile(knownHosts, `[127.0.0.1]:${port} ${host.publicKey}\n`);
  return {
    root,
    home,
    port,
    host,
    key,
    keyPath,
    knownHosts,
    errors,
    sshOptions: [...opensshOptions(knownHosts, keyPath), "-o", "LogLevel=ERROR"],
    async [Symbol.asyncDispose]() {
      await server.shutdown();
      await Deno.remove(root, { recursive: true });
      await Deno.remove(home, { recursive: true });
    },
  };
}

/** Runs a program to completion with a deadline; stdout and stderr as text. */
export async function run(
  program: string,
  args: string[],
  options: {
    stdin?: string | Uint8Array;
    cwd?: string;
    timeout?: number;
    env?: Record<string, string>;
  } = {},
): Promise<{ code: number; stdout: string; stderr: string }> {
  const child = new Deno.Command(program, {
    args,
    cwd: options.cwd,
    env: options.env,
    stdin: options.stdin === undefined ? "null" : "piped",
    stdout: "piped",
    stderr: "piped",
    signal: AbortSignal.timeout(options.timeout ?? 60_000),
  }).spawn();
  const output = child.output();
  if (options.stdin !== undefined) {
    const w = child.stdin.getWriter();
    const data = typeof options.stdin === "string"
      ? new TextEncoder().encode(options.stdin)
      : options.stdin;
    await w.write(data).catch(() => {});
    await w.close().catch(() => {});
  }
  const out = await output;
  const dec = new TextDecoder();
  return { code: out.code, stdout: dec.decode(out.stdout), stderr: dec.decode(out.stderr) };
}

/** Whether a program is on PATH. */
export function have(program: string): boolean {
  try {
    return new Deno.Command("sh", { args: ["-c", `command -v ${program}`], stdout: "null" })
      .outputSync().success;
  } catch {
    return false;
  }
}

/** Dropbear's server on a loopback port (see startDropbear()). */
export interface Dropbear extends AsyncDisposable {
  port: number;
  user: string;
  host: SshKeyPair;
  client: SshKeyPair;
}

/** Starts Dropbear; resolves once it accepts connections. */
export async function startDropbear(): Promise<Dropbear> {
  const dir = await Deno.makeTempDir({ prefix: "dropbear-test-" });
  const host = await generateSshKeyPair({ comment: "dropbear-host" });
  const client = await generateSshKeyPair({ comment: "dropbear-client" });
  await Deno.writeTextFile(`${dir}/host_openssh`, host.privateKey, { mode: 0o600 });
  const conv = await new Deno.Command("dropbearconvert", {
    args: ["openssh", "dropbear", `${dir}/host_openssh`, `${dir}/host_dropbear`],
    stdout: "null",
    stderr: "piped",
  }).output();
  if (!conv.success) {
    throw new Error(`Cannot convert host key: ${new TextDecoder().decode(conv.stderr)}`);
  }
  await Deno.mkdir(`${dir}/dotssh`, { mode: 0o700 });
  await Deno.writeTextFile(`${dir}/dotssh/authorized_keys`, `${client.publicKey}\n`, {
    mode: 0o600,
  });
  const user = new TextDecoder().decode(
    new Deno.Command("id", { args: ["-un"] }).outputSync().stdout,
  ).trim();
  const home = new TextDecoder().decode(
    new Deno.Command("getent", { args: ["passwd", user] }).outputSync().stdout,
  ).trim().split(":")[5];
  const port = freePort();
  const proc = new Deno.Command("unshare", {
    args: [
      "-m",
      "sh",
      "-c",
      `mkdir -p "$1/.ssh" && mount --bind "$2/dotssh" "$1/.ssh" && exec /usr/sbin/dropbear -F -E -s -r "$2/host_dropbear" -p "127.0.0.1:$3"`,
      "sh",
      home,
      dir,
      String(port),
    ],
    stdin: "null",
    stdout: "null",
    stderr: "null",
  }).spawn();
  let up = false;
  for (let i = 0; i < 100 && !up; i++) {
    try {
      const c = await Deno.connect({ hostname: "127.0.0.1", port });
      c.close();
      up = true;
    } catch {
      await new Promise((r) => setTimeout(r, 20));
    }
  }
  const stop = async () => {
    try {
      proc.kill("SIGTERM");
    } catch {
      // already gone
    }
    await proc.status;
    await Deno.remove(dir, { recursive: true });
  };
  if (!up) {
    await stop();
    throw new Error(`Cannot start dropbear on port ${port}`);
  }
  return { port, user, host, client, [Symbol.asyncDispose]: stop };
}
