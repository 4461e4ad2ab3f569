// A byte relay in its own process, for comparing ways to forward a tunnel:
// prints `PORT=<port>`, and joins each connection to 127.0.0.1:<target>
// until SIGTERM.
//
//   deno run -A bench/_relay.ts <target port> splice          _internal/io.ts splice (what the SDK uses)
//   deno run -A bench/_relay.ts <target port> pipeto          readable.pipeTo(writable), both ways
//   deno run -A bench/_relay.ts <target port> single <bytes>  one buffer per direction: read, then write
//   deno run -A bench/_relay.ts <target port> double <bytes>  two buffers per direction: read ahead while writing

import { closeQuietly, splice, writeAll } from "../_internal/io.ts";

const target = Number(Deno.args[0]);
const mode = Deno.args[1] ?? "splice";
const size = Number(Deno.args[2] ?? 65536);

async function single(from: Deno.Conn, to: Deno.Conn): Promise<void> {
  const buf = new Uint8Array(size);
  while (true) {
    const n = await from.read(buf);
    if (n === null) break;
    await writeAll(to, buf.subarray(0, n));
  }
  await to.closeWrite();
}

async function double(from: Deno.Conn, to: Deno.Conn): Promise<void> {
  let buf = new Uint8Array(size);
  let spare = new Uint8Array(size);
  let n = await from.read(buf);
  while (n !== null) {
    const next = from.read(spare);
    await writeAll(to, buf.subarray(0, n));
    n = await next;
    [buf, spare] = [spare, buf];
  }
  await to.closeWrite();
}

async function relay(a: Deno.Conn): Promise<void> {
  const b = await Deno.connect({ hostname: "127.0.0.1", port: target });
  try {
    if (mode === "splice") return await splice(a, b);
    if (mode === "pipeto") {
      await Promise.all([a.readable.pipeTo(b.writable), b.readable.pipeTo(a.writable)]);
      return;
    }
    const step = mode === "single" ? single : double;
    await Promise.all([step(a, b), step(b, a)]);
  } catch {
    // A peer went away.
  } finally {
    closeQuietly(a);
    closeQuietly(b);
  }
}

const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
Deno.addSignalListener("SIGTERM", () => Deno.exit(0));
console.log(`PORT=${listener.addr.port}`);
for await (const conn of listener) void relay(conn);
