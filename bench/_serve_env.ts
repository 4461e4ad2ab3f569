// Serves the benchmark environment in a child process: prints
// `HUD_SERVE_PORT=<port>` and serves until SIGTERM.
//
//   ECHO_PORT=<port> [HUD_SERVE_TOKEN=<token>] [AUTH=0] deno run -A bench/_serve_env.ts
//
// Figure 3 holds 10,000 sessions against the default connection cap, which
// follows the open-files limit.

import { serve } from "../mod.ts";
import { env } from "./_bench_env.ts";
import { probeMemoryOnSignal } from "./_mem.ts";

probeMemoryOnSignal();

await serve(env, { auth: Deno.env.get("AUTH") !== "0" });
