// The SFTP server's (`_sftp.ts`) view of the file system: attributes and
// `ls -l` lines from Deno's file information, and refusals as SFTP status
// codes, from Deno's errors among others.

import { SshWireError } from "./_wire.ts";
import { FX, type SftpAttrs } from "./_sftp_wire.ts";

const S_IFMT = 0o170000;
const S_IFDIR = 0o040000;
const S_IFREG = 0o100000;
const S_IFLNK = 0o120000;

export function attrsOf(info: Deno.FileInfo): SftpAttrs {
  let type = 0;
  if (info.isFile) type = S_IFREG;
  else if (info.isDirectory) type = S_IFDIR;
  else if (info.isSymlink) type = S_IFLNK;
  const mode = info.mode ?? 0;
  return {
    size: info.size,
    uid: info.uid ?? 0,
    gid: info.gid ?? 0,
    permissions: (mode & S_IFMT) !== 0 ? mode : (mode | type),
    atime: Math.floor((info.atime?.getTime() ?? 0) / 1000),
    mtime: Math.floor((info.mtime?.getTime() ?? 0) / 1000),
  };
}

const MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];

/** An `ls -l` line, which clients show for `ls -l`. */
export function longName(name: string, a: SftpAttrs, nlink: number): string {
  const mode = a.permissions ?? 0;
  const kind = (mode & S_IFMT) === S_IFDIR ? "d" : (mode & S_IFMT) === S_IFLNK ? "l" : "-";
  let perms = "";
  for (let i = 8; i >= 0; i--) perms += (mode >> i) & 1 ? "rwx"[(8 - i) % 3] : "-";
  const d = new Date((a.mtime ?? 0) * 1000);
  const when = `${MONTHS[d.getUTCMonth()]} ${String(d.getUTCDate()).padStart(2)} ${
    String(d.getUTCHours()).padStart(2, "0")
  }:${String(d.getUTCMinutes()).padStart(2, "0")}`;
  return `${kind}${perms} ${String(nlink).padStart(4)} ${String(a.uid).padEnd(8)} ${
    String(a.gid).padEnd(8)
  } ${String(a.size).padStart(8)} ${when} ${name}`;
}

/** A refusal with an SFTP status code. */
export class SftpStatus extends Error {
  constructor(readonly code: number, message: string) {
    super(message);
  }
}

export function statusOf(err: unknown): SftpStatus {
  if (err instanceof SftpStatus) return err;
  if (err instanceof SshWireError) return new SftpStatus(FX.BAD_MESSAGE, "Bad message");
  if (err instanceof Deno.errors.NotFound || err instanceof Deno.errors.NotADirectory) {
    return new SftpStatus(FX.NO_SUCH_FILE, "No such file");
  }
  if (err instanceof Deno.errors.PermissionDenied) {
    return new SftpStatus(FX.PERMISSION_DENIED, "Permission denied");
  }
  const msg = err instanceof Error ? err.message.replace(/ \(os error \d+\).*$/s, "") : "";
  return new SftpStatus(FX.FAILURE, msg || "Failure");
}

export function denied(): SftpStatus {
  return new SftpStatus(FX.PERMISSION_DENIED, "Permission denied: outside the workspace");
}
