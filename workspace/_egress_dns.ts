// The egress proxy's resolver: it answers the sandbox's DNS questions (DNS
// over TCP framing, relayed from the sandbox's 127.0.0.1:53) for names the
// policy allows, with the addresses the configured upstream gives less those
// in denied ranges, and REFUSED for every other name, which it never asks
// upstream about (a question is itself a message out). A and AAAA only;
// other types of an allowed name get an empty answer.

import {
  checkAddress,
  checkHost,
  normalizeName,
  parseAddress,
  type ParsedPolicy,
} from "./_netpolicy.ts";

const RCODE = { ok: 0, formErr: 1, servFail: 2, refused: 5 } as const;
const TYPE_A = 1;
const TYPE_AAAA = 28;
/** Seconds an answer may be cached. */
const TTL = 60;

/** A parsed question: its name, type and where the question section ends. */
interface Question {
  name: string;
  type: number;
  end: number;
}

/** The one question of `msg`, or null when it is malformed. */
export function parseQuestion(msg: Uint8Array): Question | null {
  if (msg.length < 12 || (msg[4] << 8 | msg[5]) !== 1 || (msg[2] & 0x80) !== 0) return null;
  const labels: string[] = [];
  let i = 12;
  while (i < msg.length && msg[i] !== 0) {
    const len = msg[i];
    if (len > 63 || i + 1 + len > msg.length) return null;
    labels.push(new TextDecoder().decode(msg.subarray(i + 1, i + 1 + len)));
    i += 1 + len;
  }
  if (i + 5 > msg.length) return null;
  return { name: labels.join("."), type: msg[i + 1] << 8 | msg[i + 2], end: i + 5 };
}

/** A reply to `query` with `rcode` and the answer records `rdata` (of the question's type). */
function reply(query: Uint8Array, q: Question | null, rcode: number, rdata: Uint8Array[] = []) {
  const qEnd = q?.end ?? 12;
  const records = rdata.map((d) => {
    const rr = new Uint8Array(12 + d.length);
    const v = new DataView(rr.buffer);
    v.setUint16(0, 0xc00c); // the question's name
    v.setUint16(2, q!.type);
    v.setUint16(4, 1); // IN
    v.setUint32(6, TTL);
    v.setUint16(10, d.length);
    rr.set(d, 12);
    return rr;
  });
  const out = new Uint8Array(qEnd + records.reduce((n, r) => n + r.length, 0));
  out.set(query.subarray(0, qEnd));
  const v = new DataView(out.buffer);
  // QR, the query's opcode and RD; RA; the code.
  v.setUint16(2, 0x8000 | (query[2] & 0x79) << 8 | 0x80 | rcode);
  v.setUint16(4, q === null ? 0 : 1);
  v.setUint16(6, records.length);
  v.setUint32(8, 0);
  let o = qEnd;
  for (const r of records) {
    out.set(r, o);
    o += r.length;
  }
  return out;
}

/**
 * The answer to one DNS message from the sandbox.
 * @param resolve looks a name up upstream (Deno.resolveDns with the policy's server)
 */
export async function answerDns(
  policy: ParsedPolicy,
  query: Uint8Array,
  resolve: (name: string, type: "A" | "AAAA") => Promise<string[]>,
): Promise<Uint8Array> {
  const q = parseQuestion(query);
  if (q === null) return reply(query.subarray(0, 12), null, RCODE.formErr);
  const name = normalizeName(q.name);
  if (name === null || checkHost(policy, name, null) !== null) {
    return reply(query, q, RCODE.refused);
  }
  if (q.type !== TYPE_A && q.type !== TYPE_AAAA) return reply(query, q, RCODE.ok);
  try {
    const found = await resolve(name, q.type === TYPE_A ? "A" : "AAAA");
    const size = q.type === TYPE_A ? 4 : 16;
    const kept = found.filter((a) => checkAddress(policy, a, 0) === null)
      .map((a) => parseAddress(a)).filter((b) => b?.length === size) as Uint8Array[];
    return reply(query, q, RCODE.ok, kept);
  } catch (err) {
    // No record of this type (Deno does not tell NXDOMAIN from NODATA): an
    // empty answer, which leaves the other type's standing.
    return reply(query, q, err instanceof Deno.errors.NotFound ? RCODE.ok : RCODE.servFail);
  }
}
