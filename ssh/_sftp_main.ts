// SFTP on stdin and stdout, as OpenSSH's sftp-server: the SSH server's
// `sftpCommand` runs this inside a workspace's sandbox, as the sandbox's
// user, so the file system itself decides what SFTP may touch.
//
//   deno run --allow-read --allow-write --allow-run=stat _sftp_main.ts [ROOT [START]]
//
// ROOT (default "/") confines paths as the in-process server does; START
// (default the working directory) is where relative paths begin. Ends at EOF
// on stdin, once every request has been answered.

import { SftpServer } from "./_sftp.ts";

/**
 * This module, for the workspace to copy into its sandbox: importing it is
 * also what puts it (and what it imports) in the module graph of whatever
 * uses a workspace, so that an image built from that graph holds it.
 */
export const SFTP_MAIN_URL: string = import.meta.url;

/** Bytes read but not yet answered past which reading pauses. */
const MAX_PENDING = 16 * 1024 * 1024;
/** A pipe's default capacity. */
const READ_SIZE = 64 * 1024;

/** Writes to stdout in order; the server hands over bytes it never changes again. */
function stdoutWriter(): { write(data: Uint8Array): Promise<void>; drained(): Promise<void> } {
  let writes: Promise<void> = Promise.resolve();
  return {
    write(data) {
      const sent = writes.then(async () => {
        let off = 0;
        while (off < data.length) off += await Deno.stdout.write(data.subarray(off));
      });
      writes = sent.catch(() => {});
      return sent;
    },
    drained: () => writes,
  };
}

async function main(): Promise<void> {
  const root = Deno.args[0] ?? "/";
  const start = Deno.args[1] ?? Deno.cwd();
  const realRoot = await Deno.realPath(root);
  let pending = 0;
  let wake: (() => void) | null = null;
  let ended = false;
  const out = stdoutWriter();
  const buf = new Uint8Array(READ_SIZE);
  const server = new SftpServer(
    realRoot,
    {
      write: (data) => out.write(data),
      consumed(n) {
        pending -= n;
        if (pending <= MAX_PENDING && wake !== null) {
          const w = wake;
          wake = null;
          w();
        }
      },
      close() {
        ended = true;
        wake?.();
      },
    },
    root,
    start,
  );
  while (!ended) {
    if (pending > MAX_PENDING) {
      await new Promise<void>((resolve) => wake = resolve);
      continue;
    }
    const n = await Deno.stdin.read(buf);
    if (n === null) break;
    pending += n;
    // A copy: the server keeps what it is given until the request is done.
    server.receive(buf.slice(0, n));
  }
  await server.close();
  await out.drained();
}

if (import.meta.main) {
  try {
    await main();
  } catch {
    // The channel went away: nothing to say, nobody to say it to.
    Deno.exit(1);
  }
}
