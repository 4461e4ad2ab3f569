// Files an agent could plant for the verifier of a Harbor task to run, found
// inside its container (harbor/_task_env.ts): the verifier runs in the
// container the agent worked in, so what the agent left on its import path
// or command path runs as the verifier. Preventing that would change what
// honest tasks see (tests import the agent's modules from the workdir and
// the packages it installed), so these are detected instead, by rules that
// honest work does not trip (installing or upgrading packages, adding
// commands and modules of its own), and the rollout is graded 0 as
// `tampered`, naming the files.
//
// A baseline of the places the rules look at is taken when the task starts
// (after its healthcheck, before the agent's first command); at
// verification, once the agent's processes are stopped, the container is
// compared with it, and the places are watched (inotify) while the verifier
// runs. The rules:
// - the shell the verifier runs test.sh with (`bash`, found on its PATH at
//   the start and run by that absolute path) changed or replaced;
// - sitecustomize.py or usercustomize.py, new or changed, in a directory on
//   the import path (Python runs them at start);
// - a new module in the workdir or a PYTHONPATH directory (the workdir is
//   first for `python -m pytest`) named as a module of an installed
//   package (pytest.py over pytest);
// - any changed or removed file of the standard library;
// - conftest.py, pytest.ini, pyproject.toml, tox.ini, setup.cfg or
//   setup.py at / (pytest reads them for tests under /tests), when / is not
//   the workdir;
// - /etc/ld.so.preload (every program loads what it names), and a changed
//   system path at / (/bin, /lib64 ... replaced by a link elsewhere).
// What they do not cover, because honest work does the same (a command
// earlier on PATH than the image's, a .pth file with an import line, a
// changed installed package), SECURITY.md lists.

/** Where the verifier finds what it runs. */
export interface VerifierScope {
  /** The task's workdir (the verifier's cwd). */
  workdir: string;
  /** The verifier's PATH. */
  path: string;
  /** The verifier's PYTHONPATH, or "". */
  pythonPath: string;
  /** The verifier's HOME (its Python user site). */
  home: string;
}

type DirKind = "workdir" | "pythonpath" | "stdlib" | "site";

/** A directory on the import path, in the order Python searches. */
interface ImportDir {
  dir: string;
  kind: DirKind;
}

/** Top-level paths of the system (/bin, /lib64...): changed, they redirect what the verifier runs. */
const SYSTEM_ROOTS = new Set(["bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc"]);
/** Files at / that pytest reads for tests under /tests. */
const PYTEST_FILES = new Set([
  "conftest.py",
  "pytest.ini",
  "pyproject.toml",
  "tox.ini",
  "setup.cfg",
  "setup.py",
]);
const CUSTOMIZE = /^(sitecustomize|usercustomize)(\.py|\.pyc|\.[^.]+\.so)?$/;
/** How many files a deep walk of one directory looks at, at most. */
const WALK_LIMIT = 400_000;
const PRELOAD = "/etc/ld.so.preload";

/** A file's identity and state: changes with any write (ctime), a replacement (ino), a new link. */
function fingerprint(info: Deno.FileInfo, target = ""): string {
  const kind = info.isSymlink ? "l" : info.isDirectory ? "d" : "f";
  return [
    kind,
    info.ino,
    info.size,
    info.mtime?.getTime(),
    info.ctime?.getTime(),
    info.mode,
    info.uid,
    info.nlink,
    target,
  ].join(":");
}

function lstat(path: string): Deno.FileInfo | null {
  try {
    return Deno.lstatSync(path);
  } catch {
    return null;
  }
}

function realDir(path: string): string | null {
  try {
    const real = Deno.realPathSync(path);
    return Deno.statSync(real).isDirectory ? real : null;
  } catch {
    return null;
  }
}

/** A directory's direct entries: name to fingerprint (a missing directory has none). */
function listing(dir: string): Map<string, string> {
  const out = new Map<string, string>();
  let entries: Deno.DirEntry[];
  try {
    entries = [...Deno.readDirSync(dir)];
  } catch {
    return out;
  }
  for (const e of entries) {
    const path = `${dir === "/" ? "" : dir}/${e.name}`;
    const info = lstat(path);
    if (info === null) continue;
    let target = "";
    if (info.isSymlink) {
      try {
        target = Deno.readLinkSync(path);
      } catch {
        // gone meanwhile
      }
    }
    out.set(e.name, fingerprint(info, target));
  }
  return out;
}

/** Every file under `dir` (symlinks not followed): relative path to fingerprint. */
function deepListing(dir: string): Map<string, string> {
  const out = new Map<string, string>();
  const stack = [""];
  while (stack.length > 0 && out.size < WALK_LIMIT) {
    const rel = stack.pop()!;
    let entries: Deno.DirEntry[];
    try {
      entries = [...Deno.readDirSync(rel === "" ? dir : `${dir}/${rel}`)];
    } catch {
      continue;
    }
    for (const e of entries) {
      const r = rel === "" ? e.name : `${rel}/${e.name}`;
      const info = lstat(`${dir}/${r}`);
      if (info === null) continue;
      if (info.isDirectory) stack.push(r);
      else out.set(r, fingerprint(info));
    }
  }
  return out;
}

/** The module a directory entry is, by its name: `x.py`, `x/`, `x.cpython-311-x86_64-linux-gnu.so`... */
function moduleName(name: string, fp: string): string | null {
  if (name.startsWith(".") || name === "__pycache__") return null;
  if (fp.startsWith("d:")) return /^[A-Za-z_][A-Za-z0-9_]*$/.test(name) ? name : null;
  const m = /^([A-Za-z_][A-Za-z0-9_]*)(\.py|\.pyc|\.so|\.[A-Za-z0-9_-]+\.so|\.pyd)$/.exec(name);
  return m === null ? null : m[1];
}

function modules(entries: Map<string, string>): Set<string> {
  const out = new Set<string>();
  for (const [name, fp] of entries) {
    const m = moduleName(name, fp);
    if (m !== null) out.add(m);
  }
  return out;
}

function join(dir: string, name: string): string {
  return `${dir === "/" ? "" : dir}/${name}`;
}

/** The directories the rules look at, resolved from the verifier's scope. */
export class VerifierLayout {
  /** PATH directories, in order, each once (by real path). */
  readonly pathDirs: readonly string[];
  /** The import path, in order. */
  readonly importDirs: readonly ImportDir[];

  constructor(scope: VerifierScope) {
    this.pathDirs = unique(scope.path.split(":").filter((d) => d.startsWith("/")));
    this.importDirs = importPath(scope, this.pathDirs);
  }

  /** The directories the rules watch while the verifier runs: /, /etc and the import path's. */
  watched(): string[] {
    const dirs = ["/", "/etc", ...this.importDirs.map((d) => d.dir)];
    return unique(dirs).filter((d) => realDir(d));
  }
}

/** `dirs` without repeats, by real path where they exist (the first place kept). */
function unique(dirs: string[]): string[] {
  const seen = new Set<string>();
  const out: string[] = [];
  for (const d of dirs) {
    const key = realDir(d) ?? d;
    if (seen.has(key)) continue;
    seen.add(key);
    out.push(d);
  }
  return out;
}

/**
 * The verifier's import path as Python builds it, from what the container
 * holds: the workdir (sys.path[0] of `python -m`), PYTHONPATH, then for
 * each Python found beside a PATH directory (`ROOT/bin` with
 * `ROOT/lib/python3.N`) its standard library and lib-dynload, the user
 * site, and the site directories (Debian's dist-packages too).
 */
function importPath(scope: VerifierScope, pathDirs: readonly string[]): ImportDir[] {
  const stdlib: ImportDir[] = [];
  const site: ImportDir[] = [];
  const versions = new Set<string>();
  for (const bin of pathDirs) {
    const root = bin.replace(/\/s?bin\/?$/, "");
    if (root === bin) continue;
    let names: string[] = [];
    try {
      names = [...Deno.readDirSync(`${root}/lib`)].map((e) => e.name);
    } catch {
      continue;
    }
    for (const name of names.filter((n) => /^python3\.\d+$/.test(n)).sort()) {
      const lib = `${root}/lib/${name}`;
      versions.add(name);
      if (lstat(`${lib}/os.py`) !== null) {
        stdlib.push({ dir: lib, kind: "stdlib" }, { dir: `${lib}/lib-dynload`, kind: "stdlib" });
      }
      site.push({ dir: `${lib}/site-packages`, kind: "site" });
      site.push({ dir: `${lib}/dist-packages`, kind: "site" });
    }
    if (realDir(`${root}/lib/python3/dist-packages`)) {
      site.push({ dir: `${root}/lib/python3/dist-packages`, kind: "site" });
    }
  }
  const user = [...versions].map((v) => ({
    dir: `${scope.home.replace(/\/$/, "")}/.local/lib/${v}/site-packages`,
    kind: "site" as const,
  }));
  const all: ImportDir[] = [
    { dir: scope.workdir, kind: "workdir" },
    ...scope.pythonPath.split(":").filter((d) => d.startsWith("/")).map((dir) => ({
      dir,
      kind: "pythonpath" as const,
    })),
    ...stdlib,
    ...user,
    ...site,
  ];
  const seen = new Set<string>();
  return all.filter((d) => {
    const key = realDir(d.dir) ?? d.dir;
    if (seen.has(key)) return false;
    seen.add(key);
    return true;
  });
}

/** The first `name` on `dirs` that is an executable file, or null. */
function which(name: string, dirs: readonly string[]): string | null {
  for (const dir of dirs) {
    const path = join(dir, name);
    try {
      const info = Deno.statSync(path);
      if (info.isFile && ((info.mode ?? 0) & 0o111) !== 0) return path;
    } catch {
      // not there
    }
  }
  return null;
}

/** A file's fingerprint through links: the file itself and the link's target. */
function resolvedFingerprint(path: string): string {
  try {
    const real = Deno.realPathSync(path);
    return `${real}=${fingerprint(Deno.lstatSync(real))}`;
  } catch {
    return "gone";
  }
}

/** What the rules compare against: the places they look at, as the task started. */
export class TamperBaseline {
  readonly #layout: VerifierLayout;
  readonly #shell: string;
  readonly #shellPrint: string;
  readonly #imports: Map<string, string>[];
  readonly #modules: Set<string>[];
  readonly #deep: (Map<string, string> | null)[];
  readonly #root: Map<string, string>;
  readonly #preload: string | null;
  readonly #rootIsWorkdir: boolean;

  /**
   * Takes the baseline now.
   * @throws {Error} when the verifier's PATH has no `bash`
   */
  constructor(layout: VerifierLayout, workdir: string) {
    this.#layout = layout;
    const shell = which("bash", layout.pathDirs);
    if (shell === null) {
      throw new Error(
        `Cannot start Harbor task: no bash on the verifier's PATH (${
          layout.pathDirs.join(":")
        }) to run tests/test.sh with`,
      );
    }
    this.#shell = shell;
    this.#shellPrint = resolvedFingerprint(shell);
    this.#imports = layout.importDirs.map((d) => listing(d.dir));
    this.#modules = this.#imports.map(modules);
    this.#deep = layout.importDirs.map((d) => d.kind === "stdlib" ? deepListing(d.dir) : null);
    this.#root = listing("/");
    const preload = lstat(PRELOAD);
    this.#preload = preload === null ? null : fingerprint(preload);
    this.#rootIsWorkdir = workdir.replace(/\/+$/, "") === "";
  }

  /** The verifier's shell, found on its PATH when the baseline was taken: run it by this path. */
  get shell(): string {
    return this.#shell;
  }

  /** The rules' findings on the container as it is now: one line each. */
  compare(): string[] {
    const found: string[] = [];
    if (resolvedFingerprint(this.#shell) !== this.#shellPrint) {
      found.push(`changed ${this.#shell}: the shell the verifier runs tests/test.sh with`);
    }
    this.#layout.importDirs.forEach((d, i) => {
      for (const [name, fp] of listing(d.dir)) found.push(...this.#importRule(i, name, fp));
      const deep = this.#deep[i];
      if (deep === null) return;
      const now = deepListing(d.dir);
      for (const [rel, fp] of deep) {
        if (now.get(rel) !== fp) {
          found.push(`changed ${d.dir}/${rel}: a file of the standard library`);
        }
      }
    });
    for (const [name, fp] of listing("/")) found.push(...this.#rootRule(name, fp));
    for (const name of this.#root.keys()) {
      if (SYSTEM_ROOTS.has(name) && lstat(`/${name}`) === null) {
        found.push(`removed /${name}: a system path the image had`);
      }
    }
    const preload = lstat(PRELOAD);
    if (preload !== null && fingerprint(preload) !== this.#preload) found.push(preloadLine());
    return found;
  }

  /** The rules' findings on one path that changed while watched (`dir` one of those watched). */
  judge(dir: string, name: string): string[] {
    const path = join(dir, name);
    const info = lstat(path);
    // Planted, then removed again: judged by its name, as if it still were.
    const fp = info === null ? "f:gone" : fingerprint(info);
    const found: string[] = [];
    if (dir === "/") found.push(...this.#rootRule(name, fp));
    if (path === PRELOAD) found.push(preloadLine());
    const m = this.#layout.importDirs.findIndex((d) => d.dir === dir);
    if (m >= 0) found.push(...this.#importRule(m, name, fp));
    return found;
  }

  #importRule(i: number, name: string, fp: string): string[] {
    const d = this.#layout.importDirs[i];
    const path = join(d.dir, name);
    const before = this.#imports[i].get(name);
    if (before === fp) return [];
    if (CUSTOMIZE.test(name)) return [`planted ${path}: Python runs it when it starts`];
    // Only what the agent's own directories hold over an installed package's module:
    // installing packages puts modules over others' too, honestly.
    if (d.kind !== "workdir" && d.kind !== "pythonpath") return [];
    const module = moduleName(name, fp);
    if (module === null || before !== undefined || this.#modules[i].has(module)) return [];
    const later = this.#modules.findIndex((m, j) =>
      j > i && this.#layout.importDirs[j].kind === "site" && m.has(module)
    );
    return later < 0 ? [] : [
      `planted ${path}: shadows the module ${module} of ${this.#layout.importDirs[later].dir}`,
    ];
  }

  #rootRule(name: string, fp: string): string[] {
    const before = this.#root.get(name);
    if (PYTEST_FILES.has(name) && before !== fp && !this.#rootIsWorkdir) {
      return [`planted /${name}: pytest reads it for the tests under /tests`];
    }
    if (!SYSTEM_ROOTS.has(name) || before === undefined) return [];
    // A directory's ctime moves with what is added to it: its kind, inode and link target count.
    const identity = (f: string) => {
      const [kind, ino, , , , , , , target] = f.split(":");
      return `${kind}:${ino}:${target}`;
    };
    return identity(before) === identity(fp)
      ? []
      : [`changed /${name}: a system path the image had`];
  }
}

function preloadLine(): string {
  return `planted ${PRELOAD}: every program the verifier starts loads what it names`;
}

/**
 * Watches `dirs` (each alone, not what lies under them) while the verifier
 * runs; {@linkcode VerificationWatch.stop} judges every path that changed.
 */
export class VerificationWatch {
  readonly #watcher: Deno.FsWatcher;
  readonly #paths = new Set<string>();
  readonly #done: Promise<void>;
  readonly #dirs: readonly string[];

  /** @throws {Error} when the watch cannot be set (too many inotify instances on the host) */
  constructor(dirs: readonly string[]) {
    this.#dirs = dirs;
    const watcher = this.#watcher = Deno.watchFs([...dirs], { recursive: false });
    this.#done = (async () => {
      for await (const event of watcher) for (const p of event.paths) this.#paths.add(p);
    })().catch(() => {});
  }

  /** Stops watching; returns what the rules find on the paths that changed. */
  async stop(baseline: TamperBaseline): Promise<string[]> {
    // Events already queued arrive before the close is seen.
    await new Promise((r) => setTimeout(r, 50));
    this.#watcher.close();
    await this.#done;
    const found: string[] = [];
    for (const path of this.#paths) {
      const at = path.lastIndexOf("/");
      const dir = path.slice(0, at) || "/";
      const name = path.slice(at + 1);
      const owner = this.#dirs.find((d) => (realDir(d) ?? d) === dir || d === dir) ?? dir;
      found.push(...baseline.judge(owner, name));
    }
    return found;
  }
}
