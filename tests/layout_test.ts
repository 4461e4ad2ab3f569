// The layout is the architecture: these tests walk the module graph that
// `deno info --json` reports and fail on an import cycle between files, on
// an import against the layer order, and on a light entry point that loads
// a heavy subsystem.

import { test } from "./_test.ts";
import assert from "node:assert/strict";

const ROOT = new URL("../", import.meta.url);

/**
 * Layers, lowest first. A file may import its own unit (a folder, or a
 * top-level file) and units of lower layers only; units of one layer do not
 * import each other, except the protocol core's files, which form one unit
 * (`env.ts` uses `schema.ts` and `capability.ts`; `loader.ts` loads an
 * environment module).
 */
const LAYERS: readonly (readonly string[])[] = [
  ["deno.json"],
  ["errors.ts"],
  ["_internal/"],
  ["schema.ts", "capability.ts", "task.ts", "env.ts", "loader.ts"],
  ["ssh/", "filetracking/", "mcp/", "cdp/", "rfb/"],
  ["_server/", "_client/"],
  ["server.ts", "client.ts"],
  ["workspace/", "runtime/"],
  ["engines/"],
  ["eval/"],
  ["agents/", "viewer/"],
  ["graders/", "proxy/"],
  ["harbor/"],
  ["cli/", "mod.ts"],
  ["cli.ts"],
];
const CORE_FILES = ["schema.ts", "capability.ts", "task.ts", "env.ts", "loader.ts"];

const ENTRY_POINTS = [
  "mod.ts",
  "cli.ts",
  "server.ts",
  "client.ts",
  "ssh/mod.ts",
  "filetracking/mod.ts",
  "workspace/mod.ts",
  "runtime/mod.ts",
  "engines/mod.ts",
  "eval/mod.ts",
  "agents/mod.ts",
  "mcp/mod.ts",
  "cdp/mod.ts",
  "rfb/mod.ts",
  "viewer/mod.ts",
  "harbor/mod.ts",
  "graders/mod.ts",
  "proxy/mod.ts",
];

interface Dependency {
  code?: { specifier: string };
  type?: { specifier: string };
  isDynamic?: boolean;
}
interface ModuleInfo {
  specifier: string;
  dependencies?: Dependency[];
}

/** The file-to-files import graph of `entry`, as paths relative to the root. */
async function importGraph(entry: string): Promise<Map<string, Set<string>>> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["info", "--json", entry],
    cwd: ROOT,
    stdout: "piped",
    stderr: "piped",
    env: { NO_COLOR: "1" },
    signal: AbortSignal.timeout(30_000),
  }).output();
  if (!out.success) {
    throw new Error(`deno info ${entry} failed: ${new TextDecoder().decode(out.stderr)}`);
  }
  const info = JSON.parse(new TextDecoder().decode(out.stdout)) as { modules: ModuleInfo[] };
  const graph = new Map<string, Set<string>>();
  const local = (specifier: string): string | null =>
    specifier.startsWith(ROOT.href) ? specifier.slice(ROOT.href.length) : null;
  for (const module of info.modules) {
    const from = local(module.specifier);
    if (from === null) continue;
    const deps = new Set<string>();
    for (const dep of module.dependencies ?? []) {
      for (const target of [dep.code?.specifier, dep.type?.specifier]) {
        const to = target === undefined ? null : local(target);
        if (to !== null) deps.add(to);
      }
    }
    graph.set(from, deps);
  }
  return graph;
}

async function wholeGraph(): Promise<Map<string, Set<string>>> {
  const graph = new Map<string, Set<string>>();
  for (const entry of ENTRY_POINTS) {
    for (const [from, deps] of await importGraph(entry)) {
      const set = graph.get(from) ?? new Set();
      for (const d of deps) set.add(d);
      graph.set(from, set);
    }
  }
  return graph;
}

/** Strongly connected components with more than one file (Tarjan). */
function cycles(graph: Map<string, Set<string>>): string[][] {
  let index = 0;
  const indices = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const found: string[][] = [];
  const visit = (v: string): void => {
    indices.set(v, index);
    low.set(v, index);
    index++;
    stack.push(v);
    onStack.add(v);
    for (const w of graph.get(v) ?? []) {
      if (!indices.has(w)) {
        visit(w);
        low.set(v, Math.min(low.get(v)!, low.get(w)!));
      } else if (onStack.has(w)) {
        low.set(v, Math.min(low.get(v)!, indices.get(w)!));
      }
    }
    if (low.get(v) === indices.get(v)) {
      const component: string[] = [];
      let w: string;
      do {
        w = stack.pop()!;
        onStack.delete(w);
        component.push(w);
      } while (w !== v);
      if (component.length > 1) found.push(component.sort());
    }
  };
  for (const v of graph.keys()) if (!indices.has(v)) visit(v);
  return found;
}

/** The unit (folder or top-level file) of a path and its layer, if ruled. */
function unitOf(path: string): { unit: string; layer: number } | null {
  for (let layer = 0; layer < LAYERS.length; layer++) {
    for (const entry of LAYERS[layer]) {
      if (entry.endsWith("/") ? path.startsWith(entry) : path === entry) {
        return { unit: CORE_FILES.includes(entry) ? "core" : entry, layer };
      }
    }
  }
  return null;
}

test("layout: no import cycle between files", async () => {
  const found = cycles(await wholeGraph());
  assert.deepEqual(found, [], `import cycles: ${found.map((c) => c.join(" ⇄ ")).join("; ")}`);
});

test("layout: every library file belongs to a layer", async () => {
  const graph = await wholeGraph();
  const unruled = [...graph.keys()].filter((p) => unitOf(p) === null);
  assert.deepEqual(unruled, [], "add these files' folder to LAYERS in tests/layout_test.ts");
});

test("layout: imports point down the layers", async () => {
  const graph = await wholeGraph();
  const wrong: string[] = [];
  for (const [from, deps] of graph) {
    const a = unitOf(from);
    if (a === null) continue;
    for (const to of deps) {
      const b = unitOf(to);
      if (b === null || a.unit === b.unit) continue;
      if (b.layer >= a.layer) wrong.push(`${from} → ${to}`);
    }
  }
  assert.deepEqual(wrong, []);
});

/**
 * The local files that importing `entry` loads: static imports of code,
 * followed from the entry. Type-only imports load nothing, and a dynamic
 * `import()` loads its module only when it runs.
 */
async function loadedFiles(entry: string): Promise<string[]> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["info", "--json", entry],
    cwd: ROOT,
    stdout: "piped",
    stderr: "piped",
    env: { NO_COLOR: "1" },
    signal: AbortSignal.timeout(30_000),
  }).output();
  assert.ok(out.success, `deno info ${entry} failed: ${new TextDecoder().decode(out.stderr)}`);
  const info = JSON.parse(new TextDecoder().decode(out.stdout)) as { modules: ModuleInfo[] };
  const bySpecifier = new Map(info.modules.map((m) => [m.specifier, m]));
  const seen = new Set<string>();
  const visit = (specifier: string): void => {
    if (seen.has(specifier) || !specifier.startsWith(ROOT.href)) return;
    seen.add(specifier);
    for (const dep of bySpecifier.get(specifier)?.dependencies ?? []) {
      if (!dep.isDynamic && dep.code?.specifier) visit(dep.code.specifier);
    }
  };
  visit(new URL(entry, ROOT).href);
  return [...seen].map((s) => s.slice(ROOT.href.length));
}

/** The folders a light entry point must not load (its own folder aside). */
const HEAVY = [
  "ssh/",
  "filetracking/",
  "mcp/",
  "cdp/",
  "rfb/",
  "workspace/",
  "runtime/",
  "engines/",
  "eval/",
  "agents/",
  "viewer/",
];

/**
 * The light entry points. `stillLoads` lists heavy folders an entry point
 * loads today although it should not; the test checks that it still does,
 * so that whoever removes the import must also remove the exception here.
 */
const LIGHT: readonly { entry: string; stillLoads?: readonly string[] }[] = [
  { entry: "env.ts" },
  { entry: "capability.ts" },
  { entry: "loader.ts" },
  { entry: "server.ts" },
  // HudClient.open() loads each protocol client with a dynamic import().
  { entry: "client.ts" },
  { entry: "runtime/mod.ts" },
];

test("layout: the light entry points load no heavy subsystem", async (t) => {
  for (const { entry, stillLoads = [] } of LIGHT) {
    await t.step(entry, async () => {
      const loaded = await loadedFiles(entry);
      const own = entry.includes("/") ? entry.slice(0, entry.indexOf("/") + 1) : null;
      const folders = new Set(loaded.map((p) => p.slice(0, p.indexOf("/") + 1)));
      const heavy = HEAVY.filter((f) => f !== own && !stillLoads.includes(f) && folders.has(f));
      assert.deepEqual(heavy, [], `${entry} loads ${heavy.join(", ")}`);
      const gone = stillLoads.filter((f) => !folders.has(f));
      assert.deepEqual(
        gone,
        [],
        `${entry} no longer loads ${gone.join(", ")}: delete them from its stillLoads`,
      );
    });
  }
});

test("layout: cli.ts loads a command's module only when that command runs", async (t) => {
  await t.step("cli.ts itself loads no command", async () => {
    const loaded = (await loadedFiles("cli.ts")).sort();
    const more = loaded.filter((p) =>
      !["cli.ts", "cli/_common.ts", "deno.json"].includes(p) && !p.startsWith("_internal/")
    );
    assert.deepEqual(more, []);
  });
  await t.step("cli.ts serve loads no client and no heavy subsystem", async () => {
    const loaded = await loadedFiles("cli/serve.ts");
    const heavy = loaded.filter((p) => p === "client.ts" || HEAVY.some((f) => p.startsWith(f)));
    assert.deepEqual(heavy, []);
  });
});

test("layout: each subsystem folder has a mod.ts exported from deno.json", async () => {
  const config = JSON.parse(await Deno.readTextFile(new URL("deno.json", ROOT))) as {
    exports: Record<string, string>;
  };
  const faces = new Set(Object.values(config.exports));
  for (const layer of LAYERS) {
    for (const entry of layer) {
      if (!entry.endsWith("/") || entry.startsWith("_")) continue;
      // cli/ holds the commands of cli.ts, which is its face.
      const face = entry === "cli/" ? "./cli.ts" : `./${entry}mod.ts`;
      assert.ok(faces.has(face), `deno.json exports no ${face}`);
    }
  }
});

test("layout: every test under tests/ is declared with test() from tests/_test.ts", async () => {
  // Deno's own test() would run the test without its bound (tests/_deadline.ts).
  // (The pattern is spelled so that it does not match this file.)
  const bareCall = new RegExp(String.raw`\bDeno\s*\.\s*` + "test\\b");
  const tests = new URL("tests/", ROOT);
  const bare: string[] = [];
  const walk = async (dir: URL): Promise<void> => {
    for await (const entry of Deno.readDir(dir)) {
      const url = new URL(entry.name + (entry.isDirectory ? "/" : ""), dir);
      if (entry.isDirectory) await walk(url);
      else if (entry.name.endsWith(".ts") && url.href !== new URL("_test.ts", tests).href) {
        const code = (await Deno.readTextFile(url))
          .replace(/\/\*[\s\S]*?\*\//g, "")
          .replace(/\/\/.*$/gm, "");
        if (bareCall.test(code)) bare.push(url.href.slice(ROOT.href.length));
      }
    }
  };
  await walk(tests);
  assert.deepEqual(
    bare,
    [],
    "these call Deno's own test(): declare their tests with test() from tests/_test.ts " +
      "(deno run -A .ci/use_test.ts converts them)",
  );
});
