// The hosts of netpolicy_test, run inside the network namespace the test
// makes: an HTTP server on each of the allowed and the denied address (each
// answering its own name, and a body of BULK bytes at /bulk), a TCP echo on
// the allowed address's port 443 (what a CONNECT tunnel reaches), and a DNS
// server on the allowed address answering A questions for names under
// allowed.test and denied.test. Prints "ready" when all listen.
// Arguments: the allowed address, the denied address.

const [allowed, denied] = Deno.args;
const BULK = 64 * 1024 * 1024;
const chunk = new Uint8Array(1024 * 1024).fill(120);

function serve(hostname: string, name: string): void {
  Deno.serve({ hostname, port: 8080, onListen() {} }, (req) => {
    if (new URL(req.url).pathname !== "/bulk") return new Response(`${name} host\n`);
    let sent = 0;
    const body = new ReadableStream<Uint8Array>({
      pull(c) {
        if (sent >= BULK) return c.close();
        sent += chunk.length;
        c.enqueue(chunk);
      },
    });
    return new Response(body, { headers: { "content-length": String(BULK) } });
  });
}

async function echo(hostname: string): Promise<void> {
  for await (const conn of Deno.listen({ hostname, port: 443 })) {
    conn.readable.pipeTo(conn.writable).catch(() => {});
  }
}

/** The address a name resolves to here: sneaky.allowed.test resolves into the denied address. */
function addressOf(name: string): string | null {
  if (name === "sneaky.allowed.test") return denied;
  if (name.endsWith(".allowed.test")) return allowed;
  if (name.endsWith(".denied.test")) return denied;
  return null;
}

function answer(q: Uint8Array): Uint8Array {
  const labels: string[] = [];
  let i = 12;
  while (q[i] !== 0) {
    labels.push(new TextDecoder().decode(q.subarray(i + 1, i + 1 + q[i])));
    i += 1 + q[i];
  }
  const end = i + 5;
  const type = q[i + 1] << 8 | q[i + 2];
  const address = addressOf(labels.join(".").toLowerCase());
  const records = address !== null && type === 1 ? 1 : 0;
  const out = new Uint8Array(end + records * 16);
  out.set(q.subarray(0, end));
  out[2] = 0x81;
  out[3] = address === null ? 0x83 : 0x80; // NXDOMAIN for names of no zone here
  out.set([0, records, 0, 0, 0, 0], 6);
  if (records) {
    out.set([0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 30, 0, 4, ...address!.split(".").map(Number)], end);
  }
  return out;
}

async function dns(hostname: string): Promise<void> {
  const sock = Deno.listenDatagram({ hostname, port: 53, transport: "udp" });
  for (;;) {
    const [msg, from] = await sock.receive();
    await sock.send(answer(msg), from);
  }
}

serve(allowed, "allowed");
serve(denied, "denied");
echo(allowed);
dns(allowed);
console.log("ready");
