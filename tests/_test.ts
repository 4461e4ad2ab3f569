// `test()` declares a test as `Deno.test` does, under a bound: TEST_BOUND_MS
// (45 s, `HUD_TEST_BOUND_MS` raises it) unless the body was wrapped in
// withDeadline(ms, fn) (tests/_deadline.ts). Every test file under tests/
// declares its tests with it (tests/layout_test.ts checks that none calls
// `Deno.test` itself, so none escapes its bound); `.ci/use_test.ts` converts
// a file that does.
//
// A test that talks to something besides Deno names it in `needs`
// (tests/_counterparts.ts: Chromium, OpenSSH, a sandbox, an engine...).
// Where one is missing the test is skipped, its name ending with which and
// how to install it, and `deno test` counts it in its summary's "ignored";
// where a missing one is required (HUD_REQUIRE_ALL=1, as .ci/run sets), the
// test fails saying so instead.
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
import type { Counterpart } from "./_counterparts.ts";

/** What a test needs besides Deno: skipped where missing, failed where required. */
export interface Needs {
  /** The counterparts the test talks to. @default [] */
  needs?: readonly Counterpart[];
}

/** What `Deno.test` takes besides the name and the body, and what the test needs. */
export type TestOptions = Omit<Deno.TestDefinition, "name" | "fn"> & Needs;
/** A whole test definition, with what the test needs. */
export type TestDefinition = Deno.TestDefinition & Needs;

/** Declares a bounded test named `name`. */
export function test(name: string, fn: TestFn): void;
/** Declares a bounded test named `name` with `Deno.test`'s options. */
export function test(name: string, options: TestOptions, fn: TestFn): void;
/** Declares a bounded test from a whole `Deno.test` definition. */
export function test(definition: TestDefinition): void;
/** Declares a bounded test from a definition (with its name) and a body. */
export function test(definition: Omit<TestDefinition, "fn">, fn: TestFn): void;
export function test(
  first: string | TestDefinition | Omit<TestDefinition, "fn">,
  second?: TestFn | TestOptions,
  third?: TestFn,
): void {
  let definition: TestDefinition;
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
  const { needs = [], ...rest } = definition;
  const declared = withCounterparts(rest, needs);
  Deno.test({ ...declared, fn: withDefaultDeadline(declared.name, declared.fn) });
}

/**
 * A test's or a step's definition as `needs` leaves it: as it is when every
 * counterpart is here (or it is ignored anyway); skipped, its name saying
 * what is missing and how to install it, when none of the missing ones is
 * required; failing at once, saying so, when one is. For a step:
 * `await t.step(withCounterparts({ name, fn }, [UNSHARE]))`.
 */
export function withCounterparts<D extends Deno.TestDefinition | Deno.TestStepDefinition>(
  definition: D,
  needs: readonly Counterpart[],
): D {
  if (definition.ignore === true) return definition;
  const absent = needs.filter((c) => c.missing !== null);
  if (absent.length === 0) return definition;
  const why = absent.map((c) => `${c.name} (${c.missing}; ${c.install})`).join(", ");
  const required = absent.filter((c) => c.required);
  if (required.length === 0) {
    return { ...definition, name: `${definition.name} [skipped: needs ${why}]`, ignore: true };
  }
  const vars = required.map((c) => c.requireVar).join(", ");
  const fail = () => {
    throw new Error(
      `Missing counterpart, required here (HUD_REQUIRE_ALL=1 or ${vars}): needs ${why}`,
    );
  };
  return { ...definition, fn: fail };
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
