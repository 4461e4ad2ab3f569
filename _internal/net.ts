// Host names in urls and the one definition of "loopback", for every
// listener, url and check in the SDK.

/**
 * A host as it goes into a url's authority: an IPv6 address in brackets
 * (`::1` becomes `[::1]`), anything else as it is. Already bracketed hosts
 * stay as they are.
 */
export function formatHost(hostname: string): string {
  return hostname.includes(":") && !hostname.startsWith("[") ? `[${hostname}]` : hostname;
}

/** `host:port` for a url, with an IPv6 host in brackets. */
export function formatHostPort(hostname: string, port: number): string {
  return `${formatHost(hostname)}:${port}`;
}

/**
 * Whether `hostname` names this machine only: `localhost` (and names under
 * `.localhost`, RFC 6761), any address of 127.0.0.0/8, `::1`, and IPv4
 * loopback mapped into IPv6 (`::ffff:127.0.0.1`). Brackets and letter case
 * do not matter; a trailing `:port` does not either when the host is
 * bracketed or is not IPv6 (`[::1]:80`, `127.0.0.2:8080`).
 */
export function isLoopback(hostname: string): boolean {
  let h = String(hostname).trim().toLowerCase();
  if (h.startsWith("[")) {
    const end = h.indexOf("]");
    if (end < 0) return false;
    h = h.slice(1, end);
  } else if (h.split(":").length === 2) {
    // host:port with an IPv4 address or a name
    h = h.slice(0, h.indexOf(":"));
  }
  if (h.endsWith(".")) h = h.slice(0, -1);
  if (h === "localhost" || h.endsWith(".localhost")) return true;
  if (isIpv4Loopback(h)) return true;
  if (h === "::1" || h === "0:0:0:0:0:0:0:1") return true;
  const mapped = /^(?:0*:)*:?ffff:(\d+\.\d+\.\d+\.\d+)$/.exec(h);
  return mapped !== null && isIpv4Loopback(mapped[1]);
}

function isIpv4Loopback(h: string): boolean {
  const m = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/.exec(h);
  return m !== null && Number(m[1]) === 127 && m.slice(2).every((p) => Number(p) <= 255);
}
