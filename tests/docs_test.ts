// The README and the guides in docs/ stay true: every relative link reaches
// its file (and heading), every TypeScript block type-checks against the
// code, and the README's quick start runs and prints what it says.

import { test, withCounterparts } from "./_test.ts";
import { SANDBOX } from "./_counterparts.ts";
import assert from "node:assert/strict";

const ROOT = new URL("../", import.meta.url);
const DOCS = ["README.md", "PROTOCOL.md", "SECURITY.md", "BENCHMARKS.md"];
for (const entry of Deno.readDirSync(new URL("docs/", ROOT))) {
  if (entry.isFile && entry.name.endsWith(".md")) DOCS.push(`docs/${entry.name}`);
}

/** The document's text outside fenced code blocks. */
function prose(text: string): string {
  return text.replace(/^```[\s\S]*?^```$/gm, "");
}

/** GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes. */
function anchor(heading: string): string {
  return heading.trim().toLowerCase().replace(/[^\p{L}\p{N}_\- ]/gu, "").replaceAll(" ", "-");
}

function anchors(text: string): Set<string> {
  return new Set([...prose(text).matchAll(/^#+ (.*)$/gm)].map((m) => anchor(m[1])));
}

test("docs: every relative link in the README and the guides resolves", () => {
  const broken: string[] = [];
  for (const doc of DOCS) {
    const base = new URL(doc, ROOT);
    const text = Deno.readTextFileSync(base);
    for (const [, target] of prose(text).matchAll(/\]\(([^)\s]+)\)/g)) {
      if (/^[a-z]+:/.test(target)) continue;
      const [path, fragment] = target.split("#", 2);
      const url = path ? new URL(path, base) : base;
      let body: string;
      try {
        body = Deno.statSync(url).isFile ? Deno.readTextFileSync(url) : "";
      } catch {
        broken.push(`${doc}: ${target} (no such file)`);
        continue;
      }
      if (fragment && url.pathname.endsWith(".md") && !anchors(body).has(fragment)) {
        broken.push(`${doc}: ${target} (no such heading)`);
      }
    }
  }
  assert.deepEqual(broken, []);
});

test("docs: every TypeScript block of the README and the guides type-checks", async () => {
  const docs = DOCS.filter((d) => d === "README.md" || d.startsWith("docs/"));
  const { code, stderr } = await new Deno.Command(Deno.execPath(), {
    args: ["check", "--quiet", "--doc-only", ...docs],
    cwd: ROOT,
    stdout: "null",
    stderr: "piped",
  }).output();
  assert.equal(code, 0, new TextDecoder().decode(stderr));
});

test("README: the quick start's programs run and print what their comments say", async (t) => {
  const readme = Deno.readTextFileSync(new URL("README.md", ROOT));
  const section = readme.split(/^## /m).find((s) => s.startsWith("Quick start"));
  assert.ok(section, "README.md has a Quick start section");
  const blocks = [...section.matchAll(/^```ts\n([\s\S]*?)^```$/gm)].map((m) => m[1]);
  assert.equal(blocks.length, 2, "the arithmetic quick start and the workspace one");
  const dir = await Deno.makeTempDir({ prefix: "hud-readme-" });
  /** Runs block `i` as a program; what it printed. */
  const run = async (i: number): Promise<string> => {
    const file = `${dir}/quick_start_${i}.ts`;
    await Deno.writeTextFile(
      file,
      blocks[i].replaceAll('"./mod.ts"', `"${new URL("mod.ts", ROOT)}"`),
    );
    const { code, stdout, stderr } = await new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", file],
      cwd: dir,
      stdout: "piped",
      stderr: "piped",
    }).output();
    assert.equal(code, 0, new TextDecoder().decode(stderr));
    return new TextDecoder().decode(stdout).trim();
  };
  try {
    await t.step("the arithmetic one", async () => {
      assert.equal(await run(0), "1 completed");
    });
    await t.step(withCounterparts({
      name: "the workspace one",
      fn: async () => {
        assert.equal(await run(1), "1");
      },
    }, [SANDBOX]));
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
