// The tunnel figure's traffic: sends <bytes> to 127.0.0.1:<port> while
// reading them back (full duplex), then prints one JSON line with the
// seconds taken and this process's CPU time. A separate process, like an
// agent's tool would be, so the SDK client's forwarder has its own thread.
//
//   deno run -A bench/_transfer.ts <port> <bytes>

const port = Number(Deno.args[0]);
const total = Number(Deno.args[1]);
const CHUNK = 64 * 1024;

function cpuMs(): number {
  const stat = Deno.readTextFileSync("/proc/self/stat");
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return (Number(fields[11]) + Number(fields[12])) * 10;
}

const conn = await Deno.connect({ hostname: "127.0.0.1", port });
const out = new Uint8Array(CHUNK).fill(0x61);
const inBuf = new Uint8Array(CHUNK);
const cpu0 = cpuMs();
const t0 = performance.now();
const send = (async () => {
  for (let sent = 0; sent < total; sent += CHUNK) {
    const chunk = out.subarray(0, Math.min(CHUNK, total - sent));
    let off = 0;
    while (off < chunk.length) off += await conn.write(chunk.subarray(off));
  }
  await conn.closeWrite();
})();
let received = 0;
while (true) {
  const n = await conn.read(inBuf);
  if (n === null) break;
  received += n;
}
await send;
const secs = (performance.now() - t0) / 1000;
conn.close();
console.log(JSON.stringify({ secs, cpu_ms: cpuMs() - cpu0, received, ok: received === total }));
