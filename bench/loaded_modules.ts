// What importing an entry point loads: the local modules reached through
// static code imports (as tests/layout_test.ts's loadedFiles counts them;
// type-only imports load nothing and a dynamic import() loads its module
// only when it runs), with their source bytes, and what `deno info` lists
// in all. Usage: deno run -A bench/loaded_modules.ts [ENTRY...]

interface ModuleInfo {
  specifier: string;
  size?: number;
  dependencies?: { code?: { specifier: string }; isDynamic?: boolean }[];
}

const ROOT = new URL("../", import.meta.url);
const entries = Deno.args.length > 0
  ? Deno.args
  : ["mod.ts", "server.ts", "client.ts", "runtime/mod.ts", "engines/mod.ts"];

for (const entry of entries) {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["info", "--json", entry],
    cwd: ROOT,
    stdout: "piped",
  }).output();
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
  let bytes = 0;
  for (const s of seen) bytes += bySpecifier.get(s)?.size ?? 0;
  const listed = info.modules.filter((m) => m.specifier.startsWith(ROOT.href)).length;
  console.log(
    `${entry}: loads ${seen.size} modules, ${
      Math.round(bytes / 1000)
    } KB (deno info lists ${listed})`,
  );
}
