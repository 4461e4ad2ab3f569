// llama.cpp's llama-server with the committed tiny tool-calling model, for
// tests/agents/llama_test.ts and bench/llama.ts. The server binary is
// built outside the tests (.ci/llama/build_llama_server.sh).

import { type Counterpart, counterpart } from "../_counterparts.ts";

const DIR = Deno.env.get("HUD_LLAMA_DIR") ?? "/var/cache/hud-sdk/llama";
/** The llama-server binary. */
export const LLAMA_SERVER = `${DIR}/bin/llama-server`;
/** The committed fixture; its recipe is in .ci/llama/ (README.md there). */
export const LLAMA_MODEL = Deno.env.get("HUD_LLAMA_MODEL") ??
  new URL("../fixtures/llama/tiny-toolcall.gguf", import.meta.url).pathname;
/** How to get the server when it is missing. */
export const LLAMA_BUILD_HINT =
  "build it: bash .ci/llama/build_llama_server.sh /var/cache/hud-sdk/llama";

/** The server binary and the model, those of them that are not there. */
export function missingLlama(): string[] {
  return [LLAMA_SERVER, LLAMA_MODEL].filter((path) => {
    try {
      return !Deno.statSync(path).isFile;
    } catch {
      return true;
    }
  });
}

/** llama-server and the tiny model (.ci/run builds it, and requires it: HUD_REQUIRE_LLAMA=1). */
export const LLAMA: Counterpart = counterpart("llama", LLAMA_BUILD_HINT, () => {
  const missing = missingLlama();
  return missing.length === 0 ? null : `${missing.join(" and ")} not found`;
});

/** A running llama-server: its base url, and how to stop it. */
export interface LlamaServer {
  /** `http://127.0.0.1:PORT`. */
  base: string;
  /** The server's pid. */
  pid: number;
  /** Stops the server and waits for it. */
  [Symbol.asyncDispose](): Promise<void>;
}

/**
 * Starts llama-server with the model on a free loopback port and waits,
 * within `readyMs`, for `/health` to answer. `args` are added (`-np`, `-c`...).
 */
export async function startLlamaServer(args: string[], readyMs: number): Promise<LlamaServer> {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (listener.addr as Deno.NetAddr).port;
  listener.close();
  const child = new Deno.Command(LLAMA_SERVER, {
    args: [
      "-m",
      LLAMA_MODEL,
      "--jinja",
      "--temp",
      "0",
      "--host",
      "127.0.0.1",
      "--port",
      String(port),
      ...args,
    ],
    stdout: "null",
    stderr: "null",
  }).spawn();
  const server: LlamaServer = {
    base: `http://127.0.0.1:${port}`,
    pid: child.pid,
    async [Symbol.asyncDispose]() {
      child.kill("SIGTERM");
      await child.status;
    },
  };
  try {
    const until = Date.now() + readyMs;
    for (;;) {
      const ok = await fetch(`${server.base}/health`).then(async (r) => {
        await r.body?.cancel();
        return r.ok;
      }, () => false);
      if (ok) return server;
      if (Date.now() > until) {
        throw new Error(`llama-server on ${server.base} not healthy after ${readyMs / 1000} s`);
      }
      await new Promise((r) => setTimeout(r, 200));
    }
  } catch (err) {
    await server[Symbol.asyncDispose]();
    throw err;
  }
}
