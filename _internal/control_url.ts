// Control addresses: `tcp://host:port`, `tcp://:TOKEN@host:port` or
// `host:port`, for the client and the runtimes' readiness probe alike.

import { redactUrl } from "./auth.ts";

/** A control address, parsed. */
export interface ControlAddress {
  /** Host name or address (IPv6 without brackets). */
  hostname: string;
  /** Port. */
  port: number;
  /** The token from the url's password, percent-decoded, when there is one. */
  token?: string;
}

/**
 * Host, port and token of a control address: `tcp://host:port`,
 * `tcp://:TOKEN@host:port` or `host:port`. Messages never show the token.
 * @throws {TypeError} for another scheme, a missing port, or user info
 *   without a `:` before the token
 */
export function parseControlUrl(url: string): ControlAddress {
  if (typeof url !== "string") throw new TypeError("Cannot connect: url must be a string");
  const shown = redactUrl(url);
  const m =
    /^(?:([a-zA-Z][a-zA-Z0-9+.-]*):\/\/)?(?:([^@/?#]*)@)?(?:\[([^\]]+)\]|([^:/?#@]+)):(\d+)\/?$/
      .exec(url.trim());
  if (m && m[1] !== undefined && m[1].toLowerCase() !== "tcp") {
    throw new TypeError(
      `Cannot connect: unsupported scheme "${m[1]}" in "${shown}" (expected tcp://)`,
    );
  }
  if (!m) {
    const scheme = /^([a-zA-Z][a-zA-Z0-9+.-]*):\/\//.exec(url)?.[1];
    if (scheme && scheme.toLowerCase() !== "tcp") {
      throw new TypeError(
        `Cannot connect: unsupported scheme "${scheme}" in "${shown}" (expected tcp://)`,
      );
    }
    throw new TypeError(`Cannot connect: invalid address "${shown}" (expected tcp://host:port)`);
  }
  const port = Number(m[5]);
  if (port < 1 || port > 65535) throw new RangeError(`Cannot connect: invalid port in "${shown}"`);
  const address: ControlAddress = { hostname: m[3] ?? m[4], port };
  if (m[2] !== undefined) {
    const colon = m[2].indexOf(":");
    if (colon < 0) {
      throw new TypeError(
        `Cannot connect: put the token after a colon in "${shown}" (tcp://:TOKEN@host:port)`,
      );
    }
    try {
      address.token = decodeURIComponent(m[2].slice(colon + 1));
    } catch {
      throw new TypeError(`Cannot connect: the token in "${shown}" is not valid percent-encoding`);
    }
  }
  return address;
}
