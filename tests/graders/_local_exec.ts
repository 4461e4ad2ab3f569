// The workspace's exec contract (PLAN.md: Workspace.exec) run on this host:
// real processes in a directory, in their own process group, killed as a
// group at the time-out or on abort. The bash grader's tests use it until
// the sandboxed workspace handle lands; it depends on nothing of that.

import type { ExecTarget } from "../../graders/mod.ts";
import type { WorkspaceExecOptions, WorkspaceExecResult } from "../../workspace/mod.ts";
import { killProcessGroup } from "../../_internal/process.ts";

/** Calls that reached `exec`, for the tests to inspect. */
export interface LocalExec extends ExecTarget {
  calls: { argv: string[]; options: WorkspaceExecOptions }[];
}

export function localExec(root: string): LocalExec {
  const calls: LocalExec["calls"] = [];
  return {
    calls,
    async exec(argv: string[], options: WorkspaceExecOptions = {}): Promise<WorkspaceExecResult> {
      calls.push({ argv, options });
      options.signal?.throwIfAborted();
      const started = performance.now();
      const child = new Deno.Command(argv[0], {
        args: argv.slice(1),
        cwd: options.cwd ?? root,
        env: options.env,
        stdin: options.stdin === undefined ? "null" : "piped",
        stdout: "piped",
        stderr: "piped",
        detached: true,
      }).spawn();
      if (options.stdin !== undefined) {
        const writer = child.stdin.getWriter();
        await writer.write(
          typeof options.stdin === "string"
            ? new TextEncoder().encode(options.stdin)
            : options.stdin,
        ).catch(() => {});
        await writer.close().catch(() => {});
      }
      const output = child.output();
      let timedOut = false;
      const kill = () => void killProcessGroup(child.pid, 500, output);
      const timer = options.timeout === undefined ? undefined : setTimeout(() => {
        timedOut = true;
        kill();
      }, options.timeout);
      options.signal?.addEventListener("abort", kill, { once: true });
      try {
        const out = await output;
        options.signal?.throwIfAborted();
        const decode = (b: Uint8Array) => new TextDecoder().decode(b);
        return {
          code: out.signal === null ? out.code : null,
          signal: out.signal,
          stdout: decode(out.stdout),
          stderr: decode(out.stderr),
          timedOut,
          durationMs: performance.now() - started,
        };
      } finally {
        clearTimeout(timer);
        options.signal?.removeEventListener("abort", kill);
      }
    },
  };
}
