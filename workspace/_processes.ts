// The agent's processes, as process trees under the children the workspace
// started. Each child is a sandbox with a PID namespace of its own, whose
// init reaps orphans, so every process a command starts stays in the tree
// under its child, whatever it does with sessions or process groups.

/** A process as /proc/PID/stat shows it. */
export interface Proc {
  ppid: number;
  pgrp: number;
  /** `sid`: its session. */
  session: number;
  /** `starttime`, in clock ticks since boot: with the pid, a process's identity. */
  start: string;
  state: string;
}

/** A process's /proc/PID/stat, read; null once it is gone. */
function readStat(pid: number | string): Proc | null {
  let stat: string;
  try {
    stat = Deno.readTextFileSync(`/proc/${pid}/stat`);
  } catch {
    return null; // exited meanwhile
  }
  // pid (comm) state ppid pgrp session ... starttime (field 22); comm may
  // hold spaces and parentheses.
  const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return {
    ppid: Number(f[1]),
    pgrp: Number(f[2]),
    session: Number(f[3]),
    start: f[19],
    state: f[0],
  };
}

/** Every live process of this PID namespace, by pid, from /proc. */
export function processTable(): Map<number, Proc> {
  const table = new Map<number, Proc>();
  for (const e of Deno.readDirSync("/proc")) {
    if (!/^\d+$/.test(e.name)) continue;
    const p = readStat(e.name);
    if (p !== null) table.set(Number(e.name), p);
  }
  return table;
}

/**
 * Whether this kernel lists each thread's children (/proc/PID/task/TID/children,
 * CONFIG_PROC_CHILDREN): a tree is then read from its own processes, not
 * from a scan of every process on the host.
 */
let childrenListed: boolean | null = null;

function listsChildren(): boolean {
  if (childrenListed === null) {
    try {
      Deno.readTextFileSync(`/proc/${Deno.pid}/task/${Deno.pid}/children`);
      childrenListed = true;
    } catch {
      childrenListed = false;
    }
  }
  return childrenListed;
}

/** The children of every thread of `pid`, from the kernel's lists. */
function childrenOf(pid: number): number[] {
  const out: number[] = [];
  let tasks: Iterable<Deno.DirEntry>;
  try {
    tasks = Deno.readDirSync(`/proc/${pid}/task`);
    for (const t of tasks) {
      let text: string;
      try {
        text = Deno.readTextFileSync(`/proc/${pid}/task/${t.name}/children`);
      } catch {
        continue; // the thread ended
      }
      for (const c of text.split(" ")) if (c !== "") out.push(Number(c));
    }
  } catch {
    // gone
  }
  return out;
}

/**
 * The trees under `roots` (the roots included), each process with its
 * stat: walked down the kernel's lists of children where it keeps them,
 * else picked out of a scan of every process.
 */
function walkTrees(roots: Iterable<number>): Map<number, Proc> {
  if (!listsChildren()) {
    const table = processTable();
    return new Map(trees(roots, table).map((pid) => [pid, table.get(pid)!]));
  }
  const out = new Map<number, Proc>();
  const queue = [...roots];
  const seen = new Set<number>();
  while (queue.length > 0) {
    const pid = queue.pop()!;
    if (seen.has(pid)) continue;
    seen.add(pid);
    const p = readStat(pid);
    if (p === null) continue;
    if (p.state !== "Z" && p.state !== "X") out.set(pid, p);
    queue.push(...childrenOf(pid));
  }
  return out;
}

/** The live processes of the trees under `roots` (the roots included), from `table`. */
function trees(roots: Iterable<number>, table: Map<number, Proc>): number[] {
  const children = new Map<number, number[]>();
  for (const [pid, p] of table) {
    const list = children.get(p.ppid);
    if (list) list.push(pid);
    else children.set(p.ppid, [pid]);
  }
  const out: number[] = [];
  const queue = [...roots].filter((pid) => table.has(pid));
  const seen = new Set<number>();
  while (queue.length > 0) {
    const pid = queue.pop()!;
    if (seen.has(pid)) continue;
    seen.add(pid);
    const state = table.get(pid)?.state;
    if (state !== "Z" && state !== "X") out.push(pid);
    queue.push(...(children.get(pid) ?? []));
  }
  return out;
}

/**
 * The live processes of the process groups `pgids` (what a command left in
 * its group after it exited, reparented away from its tree).
 */
export function groupMembers(pgids: ReadonlySet<number>): number[] {
  if (pgids.size === 0 || Deno.build.os !== "linux") return [];
  const out: number[] = [];
  for (const [pid, p] of processTable()) if (pgids.has(p.pgrp)) out.push(pid);
  return out;
}

function signal(pid: number, sig: Deno.Signal): void {
  try {
    Deno.kill(pid, sig);
  } catch {
    // gone
  }
}

/**
 * Stops every process of the trees under `roots` (SIGSTOP, which no process
 * can catch), until a scan finds none still running: a stopped process forks
 * no more, so what a scan misses the next one sees.
 * @returns whether all were stopped within `timeout` ms
 */
export async function stopTrees(
  roots: () => Iterable<number>,
  timeout: number,
): Promise<boolean> {
  if (Deno.build.os !== "linux") return false;
  const deadline = Date.now() + timeout;
  while (true) {
    const running = [...walkTrees(roots())].filter(([, p]) => p.state !== "T" && p.state !== "t")
      .map(([pid]) => pid);
    if (running.length === 0) return true;
    if (Date.now() > deadline) return false;
    for (const pid of running) signal(pid, "SIGSTOP");
    await new Promise((r) => setTimeout(r, 5));
  }
}

/** Lets the trees under `roots` run again. */
export function continueTrees(roots: Iterable<number>): void {
  if (Deno.build.os !== "linux") return;
  for (const pid of walkTrees(roots).keys()) signal(pid, "SIGCONT");
}

/** SIGKILLs the trees under `roots` and each root's process group. */
export function killTrees(roots: Iterable<number>): void {
  const list = [...roots];
  // The trees first: once a parent is gone its children are reparented away.
  const all = Deno.build.os === "linux" ? [...walkTrees(list).keys()] : [];
  for (const pid of list) signal(-pid, "SIGKILL");
  for (const pid of all) signal(pid, "SIGKILL");
}

/** The live processes of the trees under `roots` (the roots included). */
export function treePids(roots: Iterable<number>): number[] {
  return Deno.build.os === "linux" ? [...walkTrees(roots).keys()] : [];
}
