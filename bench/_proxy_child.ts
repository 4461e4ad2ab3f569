// The recording model proxy for bench/proxy.ts, in its own process (as it
// runs in the eval's): forwards to UPSTREAM as vLLM, opens N routes whose
// traces it keeps, and prints its url then the N keys, one per line.
import { serveModelProxy } from "../proxy/mod.ts";
import { Trace } from "../eval/trace.ts";

const [upstream, count] = [Deno.args[0], Number(Deno.args[1] ?? 1)];
const proxy = serveModelProxy({ upstream, server: "vllm" });
const routes = Array.from({ length: count }, () => proxy.open({ trace: new Trace() }));
console.log([proxy.url, ...routes.map((r) => r.key)].join("\n"));
