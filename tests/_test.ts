// `test()` declares a test as `Deno.test` does, under a bound: TEST_BOUND_MS
// (45 s, `HUD_TEST_BOUND_MS` raises it) unless the body was wrapped in
// withDeadline(ms, fn) (tests/_deadline.ts). Every test file under tests/
// declares its tests with it (tests/layout_test.ts checks that none calls
// `Deno.test` itself, so none escapes its bound); `.ci/use_test.ts` converts
// a file that does.
//
// Importing this module also gives the test module a HOME of its own, an
// empty temporary directory removed when the module ends. A login shell (the
// SSH server runs commands with `bash -l`) otherwise sources the host user's
// profile, which on the build machines runs `pyenv init`: seconds per command
// on a loaded machine, and 60 s when a shell killed mid-rehash left pyenv's
// lock behind. Deno's cache stays where it was, so `deno run` children do not
// start cold. Import it first, so that modules that read HOME when they load
// see this one.

import { type TestFn, withDefaultDeadline } from "./_deadline.ts";

/** What `Deno.test` takes besides the name and the body. */
export type TestOptions = Omit<Deno.TestDefinition, "name" | "fn">;

/** Declares a bounded test named `name`. */
export function test(name: string, fn: TestFn): void;
/** Declares a bounded test named `name` with `Deno.test`'s options. */
export function test(name: string, options: TestOptions, fn: TestFn): void;
/** Declares a bounded test from a whole `Deno.test` definition. */
export function test(definition: Deno.TestDefinition): void;
/** Declares a bounded test from a definition (with its name) and a body. */
export function test(definition: Omit<Deno.TestDefinition, "fn">, fn: TestFn): void;
export function test(
  first: string | Deno.TestDefinition | Omit<Deno.TestDefinition, "fn">,
  second?: TestFn | TestOptions,
  third?: TestFn,
): void {
  let definition: Deno.TestDefinition;
  if (typeof first !== "string") {
    if (typeof second === "function") definition = { ...first, fn: second };
    else if ("fn" in first) definition = first;
    else throw new TypeError(`Cannot declare test "${first.name}": no test function`);
  } else if (typeof second === "function") {
    definition = { name: first, fn: second };
  } else if (third !== undefined) {
    definition = { ...second, name: first, fn: third };
  } else {
    throw new TypeError(`Cannot declare test "${first}": no test function`);
  }
  Deno.test({ ...definition, fn: withDefaultDeadline(definition.name, definition.fn) });
}

const realHome = Deno.env.get("HOME");
if (realHome !== undefined && Deno.build.os !== "windows") {
  if (Deno.env.get("DENO_DIR") === undefined) {
    const cache = Deno.env.get("XDG_CACHE_HOME") ?? `${realHome}/.cache`;
    Deno.env.set("DENO_DIR", `${cache}/deno`);
  }
  const home = Deno.makeTempDirSync({ prefix: "hud-test-home-" });
  Deno.env.set("HOME", home);
  globalThis.addEventListener("unload", () => {
    Deno.env.set("HOME", realHome);
    try {
      Deno.removeSync(home, { recursive: true });
    } catch {
      // A test left something locked in it: the OS cleans /tmp.
    }
  });
}
