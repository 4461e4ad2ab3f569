// What a job may leave behind, looked for after it: processes this process
// started (its descendants), files in a temporary directory of its own
// (workspace keys, homes, grading directories, agents' key and prompt
// files), cgroups and uid leases that name this process, and open file
// descriptors (sockets, listeners) beyond those it began with.
//
// leakSnapshot() points TMPDIR at a fresh directory first, so that what
// other programs on the machine make in /tmp is never counted.

/** What was there before the job. */
export interface LeakSnapshot {
  readonly tmp: string;
  readonly fds: ReadonlySet<string>;
}

/** Starts watching: a private TMPDIR for everything made from now on, and the fds open now. */
export async function leakSnapshot(): Promise<LeakSnapshot> {
  const tmp = await Deno.makeTempDir({ prefix: "hud-leaks-" });
  Deno.env.set("TMPDIR", tmp);
  // The runtime opens a socket pair for signals the first time anything
  // listens for one, and keeps it: opened now, it is not counted.
  const none = () => {};
  Deno.addSignalListener("SIGUSR2", none);
  Deno.removeSignalListener("SIGUSR2", none);
  return { tmp, fds: openFds() };
}

/** This process's open descriptors, `fd -> what` (`7 -> socket:[1234]`). */
function openFds(): Set<string> {
  const out = new Set<string>();
  for (const e of Deno.readDirSync("/proc/self/fd")) {
    try {
      out.add(`${e.name} -> ${Deno.readLinkSync(`/proc/self/fd/${e.name}`)}`);
    } catch {
      // the directory listing's own descriptor, closed by now
    }
  }
  return out;
}

/** The pids whose parent chain leads to this process. */
export function descendants(): number[] {
  const parent = new Map<number, number>();
  for (const e of Deno.readDirSync("/proc")) {
    if (!/^\d+$/.test(e.name)) continue;
    try {
      const stat = Deno.readTextFileSync(`/proc/${e.name}/stat`);
      // The command may hold spaces and parentheses: fields start after the last ")".
      const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
      parent.set(Number(e.name), Number(fields[1]));
    } catch {
      // gone meanwhile
    }
  }
  const out: number[] = [];
  for (const pid of parent.keys()) {
    for (let p = parent.get(pid), hops = 0; p !== undefined && hops < 64; hops++) {
      if (p === Deno.pid) {
        out.push(pid);
        break;
      }
      p = parent.get(p);
    }
  }
  return out;
}

function commandOf(pid: number): string {
  try {
    return Deno.readTextFileSync(`/proc/${pid}/cmdline`).split("\0").join(" ").trim();
  } catch {
    return "?";
  }
}

/** Cgroups named `hud-<our pid>-*` under our own cgroup (cgroup v2). */
function ownCgroups(): string[] {
  const line = Deno.readTextFileSync("/proc/self/cgroup").split("\n").find((l) =>
    l.startsWith("0::")
  );
  if (line === undefined) return [];
  const dir = `/sys/fs/cgroup${line.slice(3).replace(/\/$/, "")}`;
  try {
    return [...Deno.readDirSync(dir)].filter((e) => e.name.startsWith(`hud-${Deno.pid}-`))
      .map((e) => `${dir}/${e.name}`);
  } catch {
    return [];
  }
}

/** Uid leases held in this process's name. */
function ownLeases(): string[] {
  const out: string[] = [];
  for (const dir of ["/run/hud-uids", `${Deno.env.get("TMPDIR") ?? "/tmp"}/hud-uids`]) {
    try {
      for (const e of Deno.readDirSync(dir)) {
        if (!/^\d+$/.test(e.name)) continue;
        const held = Deno.readTextFileSync(`${dir}/${e.name}`);
        if (held.startsWith(`${Deno.pid} `)) out.push(`${dir}/${e.name}`);
      }
    } catch {
      // no lease directory
    }
  }
  return out;
}

/**
 * What workspaces keep for the life of the process, one of each: the SFTP
 * server's staging and the list of temporary directories a watcher removes
 * if the process is killed. Both go when it exits
 * (tests/workspace/episodes_test.ts); a second one of either is a leak.
 */
const PROCESS_WIDE = [/^hud-sftp-/, /^hud-scratch-/];

function walk(dir: string, out: string[], depth = 0): void {
  const kept = new Set<RegExp>();
  for (const e of Deno.readDirSync(dir)) {
    const path = `${dir}/${e.name}`;
    if (e.name === "hud-uids") continue;
    const wide = depth === 0 ? PROCESS_WIDE.find((p) => p.test(e.name)) : undefined;
    if (wide !== undefined && !kept.has(wide)) {
      kept.add(wide);
      continue;
    }
    out.push(path);
    if (e.isDirectory && depth < 2) walk(path, out, depth + 1);
  }
}

/**
 * What the job left: one line per leaked thing (`process 123 bwrap ...`,
 * `file /tmp/.../hud-ssh-x`, `cgroup ...`, `uid lease ...`, `fd 9 -> socket:[123]`).
 * Processes get a few seconds to go (a SIGTERM'd group takes that long).
 * Removes the private TMPDIR when nothing but the process-wide staging is in it.
 */
export async function leaksSince(before: LeakSnapshot, settle = 5_000): Promise<string[]> {
  const until = Date.now() + settle;
  let pids = descendants();
  while (pids.length > 0 && Date.now() < until) {
    await new Promise((r) => setTimeout(r, 100));
    pids = descendants();
  }
  const out = pids.map((p) => `process ${p} ${commandOf(p)}`);
  const files: string[] = [];
  walk(before.tmp, files);
  out.push(...files.map((f) => `file ${f}`));
  out.push(...ownCgroups().map((c) => `cgroup ${c}`));
  out.push(...ownLeases().map((l) => `uid lease ${l}`));
  for (const fd of openFds()) if (!before.fds.has(fd)) out.push(`fd ${fd}`);
  if (files.length === 0) await Deno.remove(before.tmp, { recursive: true }).catch(() => {});
  return out;
}
