// File-system checks shared across the SDK (one copy of each).

/**
 * Whether anything is at `path`, a dangling symbolic link included (`lstat`).
 * @throws what `lstat` throws other than NotFound (a permission error, say)
 */
export async function exists(path: string): Promise<boolean> {
  try {
    await Deno.lstat(path);
    return true;
  } catch (err) {
    if (err instanceof Deno.errors.NotFound) return false;
    throw err;
  }
}

/**
 * Whether `path` can be reached, following links (`stat`): false for a
 * missing file, a dangling link, or one behind a directory that cannot be
 * searched. For probes of optional system files (sockets, cgroup files).
 */
export function reachableSync(path: string): boolean {
  try {
    Deno.statSync(path);
    return true;
  } catch {
    return false;
  }
}

/** Whether `path` is `dir` or lies under it (both normalised, absolute). */
export function isUnder(path: string, dir: string): boolean {
  return path === dir || path.startsWith(dir === "/" ? "/" : `${dir}/`);
}
