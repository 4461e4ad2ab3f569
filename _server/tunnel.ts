// Capability streams: which published capability a `tunnel.open` reaches
// (decided without a socket), then the reply and the byte splice.

import { parseHostPort } from "../capability.ts";
import type { CapabilityHandler, Environment } from "../env.ts";
import { ErrorCode } from "../errors.ts";
import { closeQuietly, splice } from "../_internal/io.ts";
import { isRecord } from "../_internal/util.ts";
import { errorReply, type Reply } from "./dispatcher.ts";

/** Where a `tunnel.open` goes, or the error reply that refuses it. */
export type TunnelTarget =
  | { name: string; handler: CapabilityHandler }
  | { name: string; hostname: string; port: number }
  | { error: Reply };

/**
 * The target of a `tunnel.open` request: a capability the environment
 * publishes, served in-process by its handler or dialled at its url's host
 * and port. Never an address the client chooses.
 */
export function tunnelTarget(env: Environment, request: Record<string, unknown>): TunnelTarget {
  const id = request.id ?? null;
  const params = isRecord(request.params) ? request.params : {};
  const name = params.capability;
  if (typeof name !== "string") {
    return { error: errorReply(id, ErrorCode.INVALID_PARAMS, "capability must be a string") };
  }
  const capability = env.capability(name);
  if (capability === undefined) {
    return { error: errorReply(id, ErrorCode.SERVER_ERROR, `unknown capability: ${name}`) };
  }
  const handler = env.capabilityHandler(name);
  if (handler !== undefined) return { name, handler };
  const target = parseHostPort(capability.url);
  if (target === null || target.port === null) {
    return {
      error: errorReply(
        id,
        ErrorCode.INVALID_PARAMS,
        `capability ${name} has no host:port in its url`,
      ),
    };
  }
  return { name, hostname: target.hostname, port: target.port };
}

/** What a tunnel needs from the server that runs it. */
export interface TunnelHost {
  /** Writes one reply frame on the client's connection. */
  send(reply: Reply): Promise<void>;
  /** Counts a backend connection against the server's limits until the returned function runs. */
  track(backend: Deno.Conn): () => void;
}

/**
 * Serves a capability stream: reaches the target, replies, then copies
 * bytes both ways until both directions end (`head` first: bytes that came
 * with the preface). Error replies end the stream. A preface without an id
 * (or with id `null`) gets no reply line, as from HUD's server: the bytes
 * start at once, and a refusal is only the close.
 */
export async function runTunnel(
  conn: Deno.Conn,
  request: Record<string, unknown>,
  target: TunnelTarget,
  head: () => Uint8Array,
  host: TunnelHost,
): Promise<void> {
  const id = request.id ?? null;
  const answer = (reply: Reply) => id === null ? Promise.resolve() : host.send(reply);
  if ("error" in target) return await answer(target.error);
  const ok: Reply = { jsonrpc: "2.0", id, result: { capability: target.name } };
  if ("handler" in target) {
    // Served in this process: no dialling, no port of its own.
    await answer(ok);
    await target.handler.attach(conn, head());
    return;
  }
  let backend: Deno.TcpConn;
  try {
    backend = await Deno.connect({ hostname: target.hostname, port: target.port });
  } catch (err) {
    return await answer(
      errorReply(
        id,
        ErrorCode.SERVER_ERROR,
        `cannot reach capability ${target.name}: ${(err as Error).message}`,
      ),
    );
  }
  const untrack = host.track(backend);
  try {
    await answer(ok);
    await splice(conn, backend, head());
  } finally {
    untrack();
    closeQuietly(backend);
  }
}
