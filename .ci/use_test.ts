// Converts test files that call `Deno.test` to tests/_test.ts's bounded
// `test()`: every `Deno.test(` becomes `test(`, and the file imports `test`
// from tests/_test.ts first (so that its HOME is set before other modules
// load). Idempotent; prints the files it changed.
//
//   deno run -A .ci/use_test.ts [FILE...]    (default: every .ts under tests/)

const ROOT = new URL("../", import.meta.url);
const TESTS = new URL("tests/", ROOT);
const HELPER = new URL("tests/_test.ts", ROOT).pathname;
const CALL = /\bDeno\.test\(/g;

function* walk(dir: string): Generator<string> {
  for (const entry of [...Deno.readDirSync(dir)].sort((a, b) => a.name.localeCompare(b.name))) {
    const path = `${dir}/${entry.name}`;
    if (entry.isDirectory && entry.name !== "fixtures") yield* walk(path);
    else if (entry.isFile && entry.name.endsWith(".ts")) yield path;
  }
}

function relative(from: string, to: string): string {
  const a = from.split("/").slice(0, -1);
  const b = to.split("/");
  let i = 0;
  while (i < a.length && i < b.length - 1 && a[i] === b[i]) i++;
  const up = a.length - i;
  return (up === 0 ? "./" : "../".repeat(up)) + b.slice(i).join("/");
}

/** The text with `test()` in place of `Deno.test()`, or null if unchanged. */
function convert(path: string, text: string): string | null {
  if (!/\bDeno\.test\(/.test(text)) return null;
  let out = text.replace(CALL, "test(");
  const specifier = relative(path, HELPER);
  const importLine = `import { test } from "${specifier}";\n`;
  const existing = new RegExp(
    `^import \\{([^}]*)\\} from "${specifier.replace(/\./g, "\\.")}";$`,
    "m",
  );
  const found = out.match(existing);
  if (found) {
    const names = found[1].split(",").map((n) => n.trim()).filter((n) => n !== "");
    if (!names.includes("test")) {
      out = out.replace(
        existing,
        `import { ${["test", ...names].join(", ")} } from "${specifier}";`,
      );
    }
    return out;
  }
  // Before the first import, else after the leading comment block.
  const firstImport = out.search(/^import /m);
  if (firstImport >= 0) return out.slice(0, firstImport) + importLine + out.slice(firstImport);
  const lead = out.match(/^(?:\/\/.*\n)*\n?/)![0];
  return lead + importLine + (lead === "" ? "\n" : "") + out.slice(lead.length);
}

const files = Deno.args.length ? Deno.args : [...walk(TESTS.pathname.replace(/\/$/, ""))];
for (const file of files) {
  const path = new URL(file, `file://${Deno.cwd()}/`).pathname;
  if (path === HELPER) continue;
  const text = Deno.readTextFileSync(path);
  const out = convert(path, text);
  if (out !== null && out !== text) {
    Deno.writeTextFileSync(path, out);
    console.log(path.slice(ROOT.pathname.length));
  }
}
