// Running a client as another local user: as root, `setpriv` drops to uid
// and gid 65534 with no supplementary groups, so that the process really is
// the other uid the kernel sees (for /proc, file modes and socket owners).

/** The uid (and gid) of the other user. */
export const NOBODY = 65534;

/** What a program printed and how it ended. */
export interface Ran {
  code: number;
  stdout: string;
  stderr: string;
}

/**
 * Runs `argv` as {@linkcode NOBODY} (`asNobody`) or as this process's user,
 * bounded to 30 s, with an empty environment but PATH.
 */
export async function runAs(asNobody: boolean, argv: string[]): Promise<Ran> {
  const bounded = ["timeout", "30", ...argv];
  const [program, ...args] = asNobody
    ? ["setpriv", `--reuid=${NOBODY}`, `--regid=${NOBODY}`, "--clear-groups", ...bounded]
    : bounded;
  const out = await new Deno.Command(program, {
    args,
    clearEnv: true,
    env: { PATH: "/usr/local/bin:/usr/bin:/bin" },
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder();
  return { code: out.code, stdout: text.decode(out.stdout), stderr: text.decode(out.stderr) };
}

/**
 * `curl` (no config file, silent) as {@linkcode NOBODY} or as us; the
 * response's status and body. `curlArgs` come before the url.
 */
export async function curlAs(
  asNobody: boolean,
  url: string,
  curlArgs: string[] = [],
): Promise<{ status: number; body: string }> {
  const marker = "\n--hud-status:";
  const ran = await runAs(asNobody, [
    "curl",
    "-q",
    "-sS",
    "--max-time",
    "20",
    "-w",
    `${marker}%{http_code}`,
    ...curlArgs,
    url,
  ]);
  const at = ran.stdout.lastIndexOf(marker);
  if (at < 0) throw new Error(`curl failed (exit ${ran.code}): ${ran.stderr.trim()}`);
  return {
    status: Number(ran.stdout.slice(at + marker.length)),
    body: ran.stdout.slice(0, at),
  };
}
