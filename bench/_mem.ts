// Memory probe for the benchmark's server children: with MEM_PROBE=1 in the
// environment (and `--v8-flags=--expose-gc`), SIGUSR2 runs two full GCs and
// prints one line `MEM {...}` with Deno.memoryUsage() and the process's
// /proc/self/smaps_rollup, so that a driver can split a connection's bytes
// into V8 heap, ArrayBuffer backing stores and the rest (Rust, the
// allocator). Used by bench/memory.ts.

import v8 from "node:v8";

/** Installs the SIGUSR2 handler when MEM_PROBE=1. */
export function probeMemoryOnSignal(): void {
  if (Deno.env.get("MEM_PROBE") !== "1") return;
  const gc = (globalThis as { gc?: () => void }).gc;
  Deno.addSignalListener("SIGUSR2", () => {
    gc?.();
    gc?.();
    const rollup = Deno.readTextFileSync("/proc/self/smaps_rollup");
    const kib = (key: string) => Number(new RegExp(`^${key}:\\s+(\\d+) kB`, "m").exec(rollup)?.[1]);
    const usage = Deno.memoryUsage();
    const line = JSON.stringify({
      ...usage,
      anonymous: kib("Anonymous") * 1024,
      smaps_rss: kib("Rss") * 1024,
      spaces: Object.fromEntries(
        v8.getHeapSpaceStatistics().filter((s) => s.space_size > 0).map((
          s,
        ) => [s.space_name, { size: s.space_size, used: s.space_used_size }]),
      ),
    });
    Deno.stdout.writeSync(new TextEncoder().encode(`MEM ${line}\n`));
  });
}
