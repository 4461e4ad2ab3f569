// The base image the Terminal-Bench-style tasks in tests/fixtures/harbor-tbstyle/
// start FROM (no registry is reachable here): the shell base of
// engines/_base_image.ts plus, copied from this machine, Debian's Python with
// pytest (their verifiers), gcc (adler32-ctypes), git (git-lost-branch) and
// findutils. .ci/run installs the packages that a fresh machine lacks.

import { buildBaseImage } from "../../engines/_base_image.ts";

/** The tag the fixtures' Dockerfiles name in FROM. */
export const TBSTYLE_BASE = "hud-test-harbor-tbstyle-base:latest";

/** The Debian packages copied in, with the libraries they link. */
export const TBSTYLE_PACKAGES: readonly string[] = [
  "findutils",
  "git",
  // Python 3 and the pytest the verifiers run (Debian's 7.2).
  "python3-minimal",
  "python3.11-minimal",
  "libpython3.11-minimal",
  "libpython3.11-stdlib",
  "python3-pytest",
  "python3-pluggy",
  "python3-iniconfig",
  "python3-packaging",
  "python3-py",
  "python3-attr",
  "python3-more-itertools",
  "python3-pkg-resources",
  // gcc, its assembler and linker, the C library's headers and start files.
  "gcc",
  "gcc-12",
  "cpp",
  "cpp-12",
  "binutils",
  "binutils-x86-64-linux-gnu",
  "libc6-dev",
  "libgcc-12-dev",
  "libgcc-s1",
];

/** Builds {@linkcode TBSTYLE_BASE} on the engine at `socket`; returns its id. */
export async function buildTbstyleBase(socket?: string): Promise<string> {
  return await buildBaseImage(TBSTYLE_BASE, {
    socket,
    packages: TBSTYLE_PACKAGES,
    signal: AbortSignal.timeout(400_000),
  });
}
