// The V8 flags a serving process runs with, and how `cli.ts serve` gives
// them to itself when whoever started it chose none.
//
// V8 sizes its young generation when the process starts: a flag set at run
// time (node:v8 setFlagsFromString) has no effect on it, nor on a Worker's
// (both measured), and deno.json has no field for V8 flags. So the command
// line's `serve` replaces its own process image, before it loads anything
// more, with the same program, arguments and environment plus the flags in
// DENO_V8_FLAGS (which Deno reads as it starts): execve(2), through FFI,
// keeps the process id, the standard streams and the signals' target, and
// leaves no parent process behind. What this costs at start-up is one more
// Deno boot (BENCHMARKS.md, "Memory per held session").

/**
 * The V8 flags that servers start with: a young generation capped at 1 MiB
 * a semi-space. V8 otherwise grows it to about 50 MiB while thousands of
 * sessions arrive and keeps it resident, about 5 KiB a session at 10,000
 * held sessions (11 KiB in all, against 7 KiB with the cap); the benchmarks
 * measured no cost to request throughput or SSH (BENCHMARKS.md, "Memory per
 * held session"). V8 sizes its heap at start-up, so they go on the command
 * line: `SubprocessRuntime` and the image of `buildEnvironmentImage` pass
 * them, and `cli.ts serve` re-executes itself with them when it was given
 * no V8 flags (a bare `--v8-flags` keeps V8's defaults). A program that
 * calls `serve()` itself gets them with
 * `deno run -A --v8-flags=--max-semi-space-size=1 ...`.
 */
export const SERVER_V8_FLAGS: readonly string[] = Object.freeze(["--max-semi-space-size=1"]);

/**
 * Set only in the image {@linkcode execWithServerV8Flags} started, whose
 * DENO_V8_FLAGS was unset before.
 */
const APPLIED = "HUD_SERVE_V8_FLAGS_APPLIED";

/** The C library's names, glibc first, then musl (Alpine). */
const LIBC = ["libc.so.6", "libc.musl-x86_64.so.1", "libc.musl-aarch64.so.1"];

const encoder = new TextEncoder();
const decoder = new TextDecoder();

function granted(descriptor: Deno.PermissionDescriptor): boolean {
  return Deno.permissions.querySync(descriptor).state === "granted";
}

/** A /proc/self file of NUL-terminated entries, each kept byte for byte, with its NUL. */
function entries(path: string): Uint8Array[] {
  const bytes = Deno.readFileSync(path);
  const out: Uint8Array[] = [];
  for (let start = 0; start < bytes.length;) {
    const end = bytes.indexOf(0, start);
    const stop = end < 0 ? bytes.length : end;
    out.push(end < 0 ? Uint8Array.of(...bytes.subarray(start), 0) : bytes.subarray(start, end + 1));
    start = stop + 1;
  }
  return out;
}

/**
 * What execve reads, held until it has read it: a pointer into a buffer
 * that the garbage collector freed or moved meanwhile would hand the new
 * image another string.
 */
let handedToExecve: unknown[] = [];

/**
 * The entries copied into one buffer, and the NULL-terminated array of
 * their addresses, as execve takes them. Both are backed by ArrayBuffers,
 * which V8 keeps off its heap and never moves (a small typed array of its
 * own may live on the heap, and move).
 */
function packed(list: Uint8Array[]): BigUint64Array {
  const bytes = new Uint8Array(new ArrayBuffer(list.reduce((n, b) => n + b.length, 0)));
  const table = new BigUint64Array(new ArrayBuffer(8 * (list.length + 1)));
  const base = BigInt(Deno.UnsafePointer.value(Deno.UnsafePointer.of(bytes)));
  let offset = 0;
  list.forEach((b, i) => {
    bytes.set(b, offset);
    table[i] = base + BigInt(offset);
    offset += b.length;
  });
  handedToExecve.push(bytes, table);
  return table;
}

/**
 * Whether V8 flags were chosen for this process: `--v8-flags` among Deno's
 * arguments (a bare `--v8-flags` keeps V8's defaults), or DENO_V8_FLAGS in
 * its environment.
 */
function flagsChosen(argv: string[], environ: string[]): boolean {
  return environ.some((e) => e.startsWith("DENO_V8_FLAGS=")) ||
    argv.some((a) => a === "--v8-flags" || a.startsWith("--v8-flags="));
}

/**
 * Deno's arguments with the script and the first script argument (the
 * command's name) replaced by `entry`, when the arguments end as
 * `Deno.args` do; else unchanged.
 */
function intoEntry(argv: Uint8Array[], args: string[], entry: URL | undefined): Uint8Array[] {
  const script = argv.length - Deno.args.length - 1;
  if (entry?.protocol !== "file:" || script < 1 || args[script + 1] !== Deno.args[0]) return argv;
  return [
    ...argv.slice(0, script),
    encoder.encode(entry.href + "\0"),
    ...argv.slice(script + 2),
  ];
}

/**
 * Re-executes this process with {@linkcode SERVER_V8_FLAGS} when no V8
 * flags were chosen for it; returns when it does not (flags were chosen,
 * not Linux, a permission missing, /proc/self unreadable, the script read
 * from standard input, or execve failed: the process then goes on with
 * V8's defaults). The new
 * image runs `entry` (a local module) in place of the script and its first
 * argument, the command's name, when given, else the same script; the other
 * arguments and the environment go to it byte for byte, plus DENO_V8_FLAGS,
 * which the new image removes again (so that what the environment starts
 * does not inherit it). For the command line's own process only: it
 * replaces the whole process.
 * @param entry the module the new image runs (a `file:` URL), in place of
 *   the script and the command's name; else the same script and arguments
 */
export function execWithServerV8Flags(entry?: URL): void {
  if (Deno.build.os !== "linux" || !granted({ name: "env" })) return;
  if (Deno.env.get(APPLIED) !== undefined) {
    Deno.env.delete(APPLIED);
    Deno.env.delete("DENO_V8_FLAGS");
    return;
  }
  const readable = (path: string) => granted({ name: "read", path });
  if (!granted({ name: "ffi" }) || !readable("/proc/self/cmdline")) return;
  if (!readable("/proc/self/environ")) return;
  let argv, environ;
  try {
    argv = entries("/proc/self/cmdline");
    environ = entries("/proc/self/environ");
  } catch {
    // Deno reads them only under --allow-all, whatever --allow-read grants
    // (NotCapable); or /proc is not there.
    return;
  }
  const text = (list: Uint8Array[]) => list.map((b) => decoder.decode(b.subarray(0, -1)));
  const args = text(argv);
  if (flagsChosen(args, text(environ)) || args.includes("-")) return;
  environ.push(
    encoder.encode(`DENO_V8_FLAGS=${SERVER_V8_FLAGS.join(",")}\0`),
    encoder.encode(`${APPLIED}=1\0`),
  );
  // A buffer argument's own address is taken as the call starts.
  const path = encoder.encode(Deno.execPath() + "\0");
  for (const name of LIBC) {
    let libc;
    try {
      libc = Deno.dlopen(name, {
        execve: { parameters: ["buffer", "buffer", "buffer"], result: "i32" },
      });
    } catch {
      continue;
    }
    // Returns only when it failed.
    libc.symbols.execve(path, packed(intoEntry(argv, args, entry)), packed(environ));
    handedToExecve = [];
    libc.close();
    return;
  }
}
