// The floors: an echo server with nothing of the SDK in it. Prints
// `PORT=<port>` and echoes every connection until SIGTERM.
//
//   deno run -A bench/_echo.ts lines   NDJSON echo: each complete line back
//   deno run -A bench/_echo.ts bytes   byte echo with half-close (the tunnel daemon)

import { probeMemoryOnSignal } from "./_mem.ts";

probeMemoryOnSignal();
const mode = Deno.args[0] ?? "bytes";
const CHUNK = 64 * 1024;
const NEWLINE = 10;

async function writeAll(conn: Deno.Conn, data: Uint8Array): Promise<void> {
  let off = 0;
  while (off < data.length) off += await conn.write(data.subarray(off));
}

async function echoBytes(conn: Deno.Conn): Promise<void> {
  const buf = new Uint8Array(CHUNK);
  try {
    while (true) {
      const n = await conn.read(buf);
      if (n === null) break;
      await writeAll(conn, buf.subarray(0, n));
    }
    await conn.closeWrite();
  } catch {
    // The peer went away.
  } finally {
    conn.close();
  }
}

// Reads lines and writes each complete line back, keeping a partial one.
async function echoLines(conn: Deno.Conn): Promise<void> {
  let buf = new Uint8Array(4096);
  let end = 0;
  try {
    while (true) {
      if (end === buf.length) {
        const next = new Uint8Array(buf.length * 2);
        next.set(buf);
        buf = next;
      }
      const n = await conn.read(buf.subarray(end));
      if (n === null) break;
      end += n;
      const last = buf.subarray(0, end).lastIndexOf(NEWLINE);
      if (last < 0) continue;
      await writeAll(conn, buf.subarray(0, last + 1));
      buf.copyWithin(0, last + 1, end);
      end -= last + 1;
    }
  } catch {
    // The peer went away.
  } finally {
    conn.close();
  }
}

const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
Deno.addSignalListener("SIGTERM", () => Deno.exit(0));
console.log(`PORT=${listener.addr.port}`);
for await (const conn of listener) {
  void (mode === "lines" ? echoLines(conn) : echoBytes(conn));
}
