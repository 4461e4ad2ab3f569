// POSIX shell quoting, for the commands the SDK builds (the SSH client's
// and server's, the agents' shell tools).

/** `s` as one single-quoted shell word. */
export function shellQuote(s: string): string {
  return `'${s.replace(/'/g, `'\\''`)}'`;
}
