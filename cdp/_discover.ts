/**
 * Finding a browser's DevTools WebSocket from its HTTP address.
 *
 * @module
 */

import { isObject } from "./_protocol.ts";

/**
 * Fetches `http://<address>/json/version` and returns the browser `webSocketDebuggerUrl`.
 *
 * The host:port of the returned URL is rewritten to `address`, because Chromium reports its
 * own listening address, which is wrong when reached through a TCP forwarder or proxy.
 * Note: Chromium rejects HTTP requests whose `Host` header is not an IP or `localhost`.
 */
export async function discoverBrowserWsUrl(
  address: string,
  options: { signal?: AbortSignal } = {},
): Promise<string> {
  const base = new URL(/^[a-z]+:\/\//i.test(address) ? address : `http://${address}`);
  if (base.protocol !== "http:" && base.protocol !== "https:") {
    throw new TypeError(`Expected an http(s) address or host:port, got ${address}`);
  }
  const res = await fetch(new URL("/json/version", base), { signal: options.signal });
  if (!res.ok) {
    await res.body?.cancel();
    throw new TypeError(`GET ${base.host}/json/version failed: HTTP ${res.status}`);
  }
  const body: unknown = await res.json();
  if (!isObject(body) || typeof body.webSocketDebuggerUrl !== "string") {
    throw new TypeError(`No webSocketDebuggerUrl in ${base.host}/json/version`);
  }
  const ws = new URL(body.webSocketDebuggerUrl);
  ws.host = base.host;
  ws.protocol = base.protocol === "https:" ? "wss:" : "ws:";
  return ws.href;
}
