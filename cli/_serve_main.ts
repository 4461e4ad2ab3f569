// `cli.ts serve` once it has given itself its V8 flags: _server/v8_flags.ts
// re-executes the process into this module, the serve command alone,
// because Deno reads the whole module graph of cli.ts's command table as a
// process starts (about 35 ms), which the new image would pay twice.

import { processIo, runModule } from "./_common.ts";
import { execWithServerV8Flags } from "../_server/v8_flags.ts";

if (import.meta.main) {
  // Here it removes DENO_V8_FLAGS again; run directly, it gives them too.
  execWithServerV8Flags();
  Deno.exit(await runModule(() => import("./serve.ts"), Deno.args, processIo()));
}
