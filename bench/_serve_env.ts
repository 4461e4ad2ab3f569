// Serves the benchmark environment in a child process: prints
// `HUD_SERVE_PORT=<port>` and serves until SIGTERM.
//
//   ECHO_PORT=<port> deno run -A bench/_serve_env.ts

import { serve } from "../mod.ts";
import { env } from "./_bench_env.ts";

await serve(env);
