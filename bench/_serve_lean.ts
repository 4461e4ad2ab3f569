// The start-up figure's lean variant: the same environment served through
// the `./server` subpath only, without loading the rest of the SDK (SSH,
// file tracking, tasksets) that `mod.ts` re-exports.
//
//   deno run -A bench/_serve_lean.ts

import { serve } from "../server.ts";
import { env } from "./_bench_env.ts";

await serve(env);
