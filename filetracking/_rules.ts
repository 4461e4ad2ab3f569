// What the file tracker skips, what it treats as a credential, and what it
// captures as an artifact: .gitignore rules, noise directories, credential
// and artifact file names.

/** Directories never walked: VCS data, dependencies, caches, build output. */
export const NOISE_DIRS: ReadonlySet<string> = new Set([
  ".git",
  ".hg",
  ".svn",
  ".bzr",
  "_darcs",
  ".jj",
  "node_modules",
  "bower_components",
  ".pnpm-store",
  ".yarn",
  "jspm_packages",
  "vendor",
  "__pycache__",
  ".venv",
  "venv",
  ".virtualenv",
  ".conda",
  ".tox",
  ".nox",
  ".mypy_cache",
  ".pytest_cache",
  ".ruff_cache",
  ".hypothesis",
  ".ipynb_checkpoints",
  ".eggs",
  ".cache",
  ".parcel-cache",
  ".turbo",
  ".gradle",
  "dist",
  "build",
  "target",
  ".next",
  ".nuxt",
  ".svelte-kit",
  ".angular",
  ".terraform",
  ".deno",
  "coverage",
  ".nyc_output",
]);

/** Files never tracked: desktop metadata. */
export const NOISE_FILES: ReadonlySet<string> = new Set([".DS_Store", "Thumbs.db", "desktop.ini"]);

/** Directories whose whole content is credential-shaped (compared in lower case). */
const CREDENTIAL_DIRS = new Set([
  ".ssh",
  ".aws",
  ".gnupg",
  ".kube",
  ".azure",
  ".docker",
  ".gcloud",
  ".kaggle",
  ".password-store",
  ".vault",
]);

/** `parent/name` pairs that hold credentials (lower case). */
const CREDENTIAL_PAIRS = new Set([
  ".config/gcloud",
  ".config/gh",
  ".config/hub",
  ".config/rclone",
  ".config/op",
  ".m2/settings.xml",
  ".m2/settings-security.xml",
  ".gradle/gradle.properties",
  ".cargo/credentials",
  ".cargo/credentials.toml",
  ".terraform.d/credentials.tfrc.json",
]);

const CREDENTIAL_NAME =
  /^(?:\.env.*|kubeconfig.*|application_default_credentials\.json|\.?[a-z0-9_]+_history|\.yarnrc(?:\.yml)?|\.s3cfg|\.boto|.*\.tfstate(?:\.backup)?|authkey_.*\.p8|.*\.p8|\.my\.cnf|auth\.json|kaggle\.json|rclone\.conf|\.git-credentials|\.lesshst|\.rnd|.*\.(?:pem|key|p12|pfx|jks|keystore|ppk|der|crt|cer|kdbx|tfstate|tfvars)|id_(?:rsa|dsa|ecdsa|ed25519)(?:_sk)?.*|\.netrc|_netrc|\.pgpass|\.git-credentials|\.htpasswd|\.npmrc|\.pypirc|\.dockercfg|credentials.*|.*secrets?\.(?:json|ya?ml|toml|env|ini|txt)|service[-_]?account.*\.json|token\.json|\.vault-token)$/i;

/**
 * Whether a file is credential-shaped: tracked by size and time only, its
 * content never read. `path` is relative to the root, `/`-separated.
 */
export function isCredentialPath(path: string): boolean {
  const parts = path.toLowerCase().split("/");
  const name = parts[parts.length - 1];
  if (CREDENTIAL_NAME.test(name)) return true;
  for (let i = 0; i < parts.length - 1; i++) {
    if (CREDENTIAL_DIRS.has(parts[i])) return true;
    if (CREDENTIAL_PAIRS.has(`${parts[i]}/${parts[i + 1]}`)) return true;
  }
  return false;
}

const ARTIFACT_TYPES: Readonly<Record<string, string>> = {
  pdf: "application/pdf",
  doc: "application/msword",
  docx: "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
  odt: "application/vnd.oasis.opendocument.text",
  rtf: "application/rtf",
  md: "text/markdown",
  xls: "application/vnd.ms-excel",
  xlsx: "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
  ods: "application/vnd.oasis.opendocument.spreadsheet",
  csv: "text/csv",
  tsv: "text/tab-separated-values",
  ppt: "application/vnd.ms-powerpoint",
  pptx: "application/vnd.openxmlformats-officedocument.presentationml.presentation",
  odp: "application/vnd.oasis.opendocument.presentation",
  html: "text/html",
  htm: "text/html",
  png: "image/png",
  jpg: "image/jpeg",
  jpeg: "image/jpeg",
  gif: "image/gif",
  webp: "image/webp",
  svg: "image/svg+xml",
  bmp: "image/bmp",
  tif: "image/tiff",
  tiff: "image/tiff",
};

/** The media type of an artifact file (document, image, html, spreadsheet), else `null`. */
export function artifactType(path: string): string | null {
  const dot = path.lastIndexOf(".");
  if (dot < 0 || dot < path.lastIndexOf("/")) return null;
  return ARTIFACT_TYPES[path.slice(dot + 1).toLowerCase()] ?? null;
}

/** One compiled `.gitignore` line. */
export interface IgnoreRule {
  /** Directory of the `.gitignore`, relative to the root (`""` for the root). */
  base: string;
  /** Tested against the path relative to `base` (anchored) or the name. */
  glob: Glob;
  anchored: boolean;
  negate: boolean;
  dirOnly: boolean;
}

/** Patterns longer than this are dropped: no real `.gitignore` line is. */
const MAX_PATTERN_LENGTH = 1024;
/** Paths longer than this never match a rule (the scan reports such paths). */
const MAX_SUBJECT_LENGTH = 4096;

/** Compiles the lines of a `.gitignore` found in directory `base`. */
export function parseGitignore(text: string, base: string): IgnoreRule[] {
  const rules: IgnoreRule[] = [];
  for (let line of text.split("\n")) {
    if (line.endsWith("\r")) line = line.slice(0, -1);
    if (line === "" || line.startsWith("#")) continue;
    // Trailing spaces are dropped unless escaped.
    line = line.replace(/(?<!\\)\s+$/, "");
    if (line === "" || line.length > MAX_PATTERN_LENGTH) continue;
    let negate = false;
    if (line.startsWith("!")) {
      negate = true;
      line = line.slice(1);
    } else if (line.startsWith("\\!") || line.startsWith("\\#")) {
      line = line.slice(1);
    }
    let dirOnly = false;
    if (line.endsWith("/")) {
      dirOnly = true;
      line = line.replace(/\/+$/, "");
    }
    if (line === "") continue;
    const anchored = line.includes("/");
    if (line.startsWith("/")) line = line.slice(1);
    rules.push({ base, glob: compileGlob(line), anchored, negate, dirOnly });
  }
  return rules;
}

// A glob is matched by simulating its automaton over the subject, keeping
// the set of live pattern positions: time O(pattern × subject) whatever the
// pattern, where backtracking (and the regular expressions this replaced)
// can take exponential time on `a*a*a*...b`.
type Node =
  | { kind: "char"; test: (c: string) => boolean }
  /** `*`: any run of characters except `/`. */
  | { kind: "star" }
  /** A trailing `/**`'s `**`: anything, `/` included. */
  | { kind: "all" }
  /** `**\/` at a segment start: zero or more whole directories (two nodes). */
  | { kind: "dirs" }
  | { kind: "dirsInside" };

/** A compiled glob with git's wildmatch semantics (`WM_PATHNAME`). */
export interface Glob {
  readonly nodes: readonly Node[];
}

/** Compiles a glob; a malformed bracket is taken literally, as git does. */
export function compileGlob(glob: string): Glob {
  const nodes: Node[] = [];
  const literal = (ch: string) => nodes.push({ kind: "char", test: (c) => c === ch });
  let i = 0;
  while (i < glob.length) {
    const c = glob[i];
    if (c === "*") {
      let j = i;
      while (glob[j] === "*") j++;
      const double = j - i >= 2;
      const atStart = i === 0 || glob[i - 1] === "/";
      const atEnd = j === glob.length || glob[j] === "/";
      if (double && atStart && atEnd) {
        if (j === glob.length) {
          nodes.push({ kind: "all" });
          i = j;
        } else {
          nodes.push({ kind: "dirs" }, { kind: "dirsInside" });
          i = j + 1; // the `/` belongs to the directories matched
        }
        continue;
      }
      if (nodes.at(-1)?.kind !== "star") nodes.push({ kind: "star" });
      i = j;
    } else if (c === "?") {
      nodes.push({ kind: "char", test: (ch) => ch !== "/" });
      i++;
    } else if (c === "[") {
      const parsed = parseBracket(glob, i);
      if (parsed === null) {
        literal("[");
        i++;
        continue;
      }
      nodes.push({ kind: "char", test: parsed.test });
      i = parsed.end;
    } else if (c === "\\" && i + 1 < glob.length) {
      literal(glob[i + 1]);
      i += 2;
    } else {
      literal(c);
      i++;
    }
  }
  return { nodes };
}

function parseBracket(
  glob: string,
  start: number,
): { test: (c: string) => boolean; end: number } | null {
  let i = start + 1;
  let negate = false;
  if (glob[i] === "!" || glob[i] === "^") {
    negate = true;
    i++;
  }
  const singles = new Set<string>();
  const ranges: [string, string][] = [];
  let first = true;
  while (i < glob.length && (glob[i] !== "]" || first)) {
    first = false;
    let ch = glob[i];
    if (ch === "\\" && i + 1 < glob.length) ch = glob[++i];
    if (glob[i + 1] === "-" && i + 2 < glob.length && glob[i + 2] !== "]") {
      let hi = glob[i + 2];
      let skip = 3;
      if (hi === "\\" && i + 3 < glob.length) {
        hi = glob[i + 3];
        skip = 4;
      }
      ranges.push([ch, hi]);
      i += skip;
    } else {
      singles.add(ch);
      i++;
    }
  }
  if (i >= glob.length) return null;
  const test = (c: string) => {
    if (c === "/") return false;
    const inSet = singles.has(c) || ranges.some(([lo, hi]) => lo <= c && c <= hi);
    return inSet !== negate;
  };
  return { test, end: i + 1 };
}

/** Whether `glob` matches all of `subject`. */
export function matchGlob(glob: Glob, subject: string): boolean {
  const nodes = glob.nodes;
  const m = nodes.length;
  if (subject.length > MAX_SUBJECT_LENGTH) return false;
  let live = new Uint8Array(m + 1);
  let next = new Uint8Array(m + 1);
  live[0] = 1;
  close(nodes, live);
  for (let k = 0; k < subject.length; k++) {
    const c = subject[k];
    next.fill(0);
    let any = false;
    for (let p = 0; p < m; p++) {
      if (!live[p]) continue;
      const node = nodes[p];
      switch (node.kind) {
        case "char":
          if (node.test(c)) next[p + 1] = 1;
          break;
        case "star":
          if (c !== "/") next[p] = 1;
          break;
        case "all":
          next[p] = 1;
          break;
        case "dirs":
          // A directory name starts, or an empty one ends at once.
          if (c === "/") next[p] = 1;
          else next[p + 1] = 1;
          break;
        case "dirsInside":
          if (c === "/") next[p - 1] = 1;
          else next[p] = 1;
          break;
      }
      any = true;
    }
    if (!any) return false;
    close(nodes, next);
    [live, next] = [next, live];
  }
  return live[m] === 1;
}

/** Adds the positions reachable without consuming a character. */
function close(nodes: readonly Node[], set: Uint8Array): void {
  for (let p = 0; p < nodes.length; p++) {
    if (!set[p]) continue;
    const kind = nodes[p].kind;
    if (kind === "star" || kind === "all") set[p + 1] = 1;
    // Zero directories: skip both nodes of the pair.
    else if (kind === "dirs") set[p + 2] = 1;
  }
}

/**
 * Whether `path` (relative to the root) is ignored by `rules`, listed from
 * the root's `.gitignore` down to the deepest: the last matching rule wins.
 */
export function isIgnored(
  rules: readonly IgnoreRule[],
  path: string,
  name: string,
  isDir: boolean,
): boolean {
  for (let k = rules.length - 1; k >= 0; k--) {
    const rule = rules[k];
    if (rule.dirOnly && !isDir) continue;
    let subject: string;
    if (rule.anchored) {
      if (rule.base === "") subject = path;
      else if (path.startsWith(rule.base + "/")) subject = path.slice(rule.base.length + 1);
      else continue;
    } else {
      subject = name;
    }
    if (matchGlob(rule.glob, subject)) return !rule.negate;
  }
  return false;
}
