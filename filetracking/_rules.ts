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

/** Directories whose whole content is credential-shaped. */
const CREDENTIAL_DIRS = new Set([
  ".ssh",
  ".aws",
  ".gnupg",
  ".kube",
  ".azure",
  ".docker",
  ".gcloud",
]);

const CREDENTIAL_NAME =
  /^(?:\.env.*|.*\.(?:pem|key|p12|pfx|jks|keystore|ppk|der|crt|cer|kdbx|tfstate|tfvars)|id_(?:rsa|dsa|ecdsa|ed25519)(?:_sk)?.*|\.netrc|_netrc|\.pgpass|\.git-credentials|\.htpasswd|\.npmrc|\.pypirc|\.dockercfg|credentials.*|.*secrets?\.(?:json|ya?ml|toml|env|ini|txt)|service[-_]?account.*\.json|token\.json|\.vault-token)$/i;

/**
 * Whether a file is credential-shaped: tracked by size and time only, its
 * content never read. `path` is relative to the root, `/`-separated.
 */
export function isCredentialPath(path: string): boolean {
  const parts = path.split("/");
  const name = parts[parts.length - 1];
  if (CREDENTIAL_NAME.test(name)) return true;
  for (let i = 0; i < parts.length - 1; i++) {
    if (CREDENTIAL_DIRS.has(parts[i])) return true;
    if (parts[i] === ".config" && parts[i + 1] === "gcloud") return true;
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
  regex: RegExp;
  anchored: boolean;
  negate: boolean;
  dirOnly: boolean;
}

/** Compiles the lines of a `.gitignore` found in directory `base`. */
export function parseGitignore(text: string, base: string): IgnoreRule[] {
  const rules: IgnoreRule[] = [];
  for (let line of text.split("\n")) {
    if (line.endsWith("\r")) line = line.slice(0, -1);
    if (line === "" || line.startsWith("#")) continue;
    // Trailing spaces are dropped unless escaped.
    line = line.replace(/(?<!\\)\s+$/, "");
    if (line === "") continue;
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
    let regex: RegExp;
    try {
      regex = new RegExp(`^${globToRegex(line)}$`, "s");
    } catch {
      continue; // a malformed pattern matches nothing, as in git
    }
    rules.push({ base, regex, anchored, negate, dirOnly });
  }
  return rules;
}

function globToRegex(glob: string): string {
  let out = "";
  let i = 0;
  while (i < glob.length) {
    const c = glob[i];
    if (c === "*") {
      if (glob[i + 1] === "*") {
        const atStart = i === 0 || glob[i - 1] === "/";
        const atEnd = i + 2 === glob.length || glob[i + 2] === "/";
        if (atStart && atEnd) {
          if (i + 2 === glob.length) {
            out += ".*"; // trailing `/**`: everything inside
            i += 2;
          } else {
            out += "(?:.*/)?"; // `**/`: zero or more directories
            i += 3;
          }
          continue;
        }
        while (glob[i] === "*") i++;
        out += "[^/]*";
        continue;
      }
      out += "[^/]*";
      i++;
    } else if (c === "?") {
      out += "[^/]";
      i++;
    } else if (c === "[") {
      const close = glob.indexOf("]", i + 2);
      if (close < 0) {
        out += "\\[";
        i++;
        continue;
      }
      let body = glob.slice(i + 1, close);
      let neg = false;
      if (body.startsWith("!") || body.startsWith("^")) {
        neg = true;
        body = body.slice(1);
      }
      body = body.replace(/[\\\]^]/g, (m) => "\\" + m);
      out += `[${neg ? "^" : ""}${body}]`;
      i = close + 1;
    } else if (c === "\\" && i + 1 < glob.length) {
      out += escapeRegex(glob[i + 1]);
      i += 2;
    } else {
      out += escapeRegex(c);
      i++;
    }
  }
  return out;
}

function escapeRegex(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&");
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
    if (rule.regex.test(subject)) return !rule.negate;
  }
  return false;
}
