// A bare Deno server that holds connections, for the memory floor: prints
// `PORT=<port>`, accepts until SIGTERM and keeps every connection.
//
//   deno run -A bench/_hold.ts none        accept only, no read pending
//   deno run -A bench/_hold.ts read <n>    one read pending per connection, n-byte buffer each
//   deno run -A bench/_hold.ts then <n>    the same, read loop as promise callbacks, no async function
//   deno run -A bench/_hold.ts shared <n>  one read pending per connection, all into one n-byte buffer

import { probeMemoryOnSignal } from "./_mem.ts";

probeMemoryOnSignal();
const mode = Deno.args[0] ?? "none";
const size = Number(Deno.args[1] ?? 4096);
const shared = new Uint8Array(size);
const held: Deno.Conn[] = [];

async function hold(conn: Deno.Conn): Promise<void> {
  const buf = mode === "shared" ? shared : new Uint8Array(size);
  try {
    while ((await conn.read(buf)) !== null) { /* discard */ }
  } catch {
    // The peer went away.
  } finally {
    conn.close();
  }
}

// The same without an async function: one promise reaction per read.
function holdThen(conn: Deno.Conn): void {
  const buf = new Uint8Array(size);
  const fail = () => conn.close();
  const again = (n: number | null) => {
    if (n === null) return conn.close();
    conn.read(buf).then(again, fail);
  };
  conn.read(buf).then(again, fail);
}

const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
Deno.addSignalListener("SIGTERM", () => Deno.exit(0));
console.log(`PORT=${listener.addr.port}`);
for await (const conn of listener) {
  if (mode === "none") held.push(conn);
  else if (mode === "then") holdThen(conn);
  else void hold(conn);
}
