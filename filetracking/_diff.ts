// Line diff producing unified diff text that matches GNU `diff -u`.
//
// The algorithm follows GNU diffutils (analyze.c and gnulib's diffseq.h):
// trim the identical prefix and suffix, discard lines that cannot match
// ("confusing" lines), run Myers' O(ND) divide and conquer on the rest, then
// slide each run of changes the way `shift_boundaries` does. Matching GNU
// step by step is what makes the hunk ranges identical, not just equally
// short: a line diff usually has many minimal answers.

/** Lines of context around each change, as `diff -u`. */
const CONTEXT = 3;
const NO_NEWLINE = "\\ No newline at end of file\n";

/** Options for {@linkcode unifiedDiff}. */
export interface UnifiedDiffOptions {
  /** Header path of the old side; `null` prints `/dev/null`. */
  oldPath: string | null;
  /** Header path of the new side; `null` prints `/dev/null`. */
  newPath: string | null;
  /**
   * Lines of context.
   * @default 3
   */
  context?: number;
}

/**
 * Splits text into lines that keep their `\n`, so a last line without one
 * differs from the same line with one (as in GNU diff).
 */
export function splitLines(text: string): string[] {
  const lines: string[] = [];
  let start = 0;
  while (start < text.length) {
    const nl = text.indexOf("\n", start);
    if (nl < 0) {
      lines.push(text.slice(start));
      break;
    }
    lines.push(text.slice(start, nl + 1));
    start = nl + 1;
  }
  return lines;
}

/**
 * Unified diff of two texts, `null` meaning the file does not exist. Returns
 * `""` when the texts are equal; headers only for an added or deleted empty
 * file.
 */
export function unifiedDiff(
  oldText: string | null,
  newText: string | null,
  options: UnifiedDiffOptions,
): string {
  if (oldText === newText) return "";
  const a = splitLines(oldText ?? "");
  const b = splitLines(newText ?? "");
  const context = options.context ?? CONTEXT;
  const header = `--- ${options.oldPath === null ? "/dev/null" : options.oldPath}\n` +
    `+++ ${options.newPath === null ? "/dev/null" : options.newPath}\n`;
  const [changedA, changedB] = diffLines(a, b, context);
  return header + formatHunks(a, b, changedA, changedB, context);
}

/**
 * Marks the changed lines of `a` and `b`: `changed[i]` is 1 when line `i` is
 * deleted (in `a`) or inserted (in `b`).
 */
export function diffLines(
  a: string[],
  b: string[],
  horizon: number = CONTEXT,
): [Uint8Array, Uint8Array] {
  const changedA = new Uint8Array(a.length);
  const changedB = new Uint8Array(b.length);
  // Equivalence classes: equal lines share a number.
  const classes = new Map<string, number>();
  const classOf = (line: string): number => {
    let c = classes.get(line);
    if (c === undefined) {
      c = classes.size + 1;
      classes.set(line, c);
    }
    return c;
  };
  let prefix = 0;
  while (prefix < a.length && prefix < b.length && a[prefix] === b[prefix]) prefix++;
  let suffix = 0;
  while (
    suffix < a.length - prefix && suffix < b.length - prefix &&
    a[a.length - 1 - suffix] === b[b.length - 1 - suffix]
  ) suffix++;
  // GNU keeps `horizon` lines of each identical end in the analysed region,
  // so runs of changes can still slide into them.
  prefix = Math.max(0, prefix - horizon);
  suffix = Math.max(0, suffix - horizon);
  const na = a.length - prefix - suffix;
  const nb = b.length - prefix - suffix;
  if (na === 0 && nb === 0) return [changedA, changedB];
  const eqA = new Int32Array(na);
  const eqB = new Int32Array(nb);
  for (let i = 0; i < na; i++) eqA[i] = classOf(a[prefix + i]);
  for (let i = 0; i < nb; i++) eqB[i] = classOf(b[prefix + i]);
  // Middle-region change flags with a zero sentinel on each side.
  const chA = new Uint8Array(na + 2);
  const chB = new Uint8Array(nb + 2);
  analyze(eqA, eqB, chA, chB, classes.size + 1);
  shiftBoundaries(eqA, chA, chB, na);
  shiftBoundaries(eqB, chB, chA, nb);
  for (let i = 0; i < na; i++) changedA[prefix + i] = chA[i + 1];
  for (let i = 0; i < nb; i++) changedB[prefix + i] = chB[i + 1];
  return [changedA, changedB];
}

/** Discards confusing lines, then runs the Myers comparison on the rest. */
function analyze(
  eqA: Int32Array,
  eqB: Int32Array,
  chA: Uint8Array,
  chB: Uint8Array,
  classCount: number,
): void {
  const countA = new Int32Array(classCount);
  const countB = new Int32Array(classCount);
  for (const c of eqA) countA[c]++;
  for (const c of eqB) countB[c]++;
  const discA = discards(eqA, countB);
  const discB = discards(eqB, countA);
  const keep = (eq: Int32Array, disc: Uint8Array, ch: Uint8Array) => {
    const undiscarded: number[] = [];
    const real: number[] = [];
    for (let i = 0; i < eq.length; i++) {
      if (disc[i] === 0) {
        undiscarded.push(eq[i]);
        real.push(i);
      } else {
        ch[i + 1] = 1;
      }
    }
    return { xs: Int32Array.from(undiscarded), real };
  };
  const ka = keep(eqA, discA, chA);
  const kb = keep(eqB, discB, chB);
  new Myers(ka.xs, kb.xs, ka.real, kb.real, chA, chB).run();
}

/**
 * GNU `discard_confusing_lines` for one file: 1 for a line with no match in
 * the other file, 2 (provisional) for a very common line, then provisional
 * marks are kept only in the middle of long runs of discards.
 */
function discards(eq: Int32Array, otherCount: Int32Array): Uint8Array {
  const d = discardMarks(eq, otherCount);
  for (let i = 0; i < d.length; i++) {
    if (d[i] === 2) d[i] = 0;
    else if (d[i] !== 0) i = settleRun(d, i);
  }
  return d;
}

/** 1 for a line with no match in the other file, 2 for one matched very often. */
function discardMarks(eq: Int32Array, otherCount: Int32Array): Uint8Array {
  const end = eq.length;
  const d = new Uint8Array(end);
  let many = 5;
  let tem = Math.floor(end / 64);
  while ((tem = tem >> 2) > 0) many *= 2;
  for (let i = 0; i < end; i++) {
    const n = otherCount[eq[i]];
    if (n === 0) d[i] = 1;
    else if (n > many) d[i] = 2;
  }
  return d;
}

/**
 * Settles the provisional marks of the run of discards starting at `i`
 * (not provisional): all cancelled when a quarter of the run is
 * provisional, else kept only in its middle.
 * @returns where the scan goes on from: the run's last line, or `i` when
 *   the run's provisional marks were all cancelled (as GNU does)
 */
function settleRun(d: Uint8Array, i: number): number {
  let j: number;
  let provisional = 0;
  for (j = i; j < d.length; j++) {
    if (d[j] === 0) break;
    if (d[j] === 2) provisional++;
  }
  // Cancel provisional discards at the end, and shrink the run.
  while (j > i && d[j - 1] === 2) {
    d[--j] = 0;
    provisional--;
  }
  const length = j - i;
  if (provisional * 4 > length) {
    while (j > i) if (d[--j] === 2) d[j] = 0;
    return i;
  }
  let minimum = 1;
  let t = length >> 2;
  while ((t >>= 2) > 0) minimum <<= 1;
  minimum++;
  // Cancel provisional discards in runs shorter than `minimum`.
  let consec = 0;
  for (j = 0; j < length; j++) {
    if (d[i + j] !== 2) consec = 0;
    else if (minimum === ++consec) j -= consec;
    else if (minimum < consec) d[i + j] = 0;
  }
  cancelAtEdge(d, i, length, 1);
  cancelAtEdge(d, i + length - 1, length, -1);
  return i + length - 1;
}

/**
 * Cancels the provisional discards at one edge of a run (from `start`, in
 * the direction `step`), until three real discards in a row, or past the
 * eighth line a line with no match.
 */
function cancelAtEdge(d: Uint8Array, start: number, length: number, step: 1 | -1): void {
  let consec = 0;
  for (let j = 0; j < length; j++) {
    const k = start + step * j;
    if (j >= 8 && d[k] === 1) break;
    if (d[k] === 2) {
      consec = 0;
      d[k] = 0;
    } else if (d[k] === 0) consec = 0;
    else consec++;
    if (consec === 3) break;
  }
}

/**
 * One split search of {@linkcode Myers}: the box it searches, and how far
 * the forward and backward diagonals reach so far.
 */
interface Search {
  readonly xoff: number;
  readonly xlim: number;
  readonly yoff: number;
  readonly ylim: number;
  /** The lowest and highest diagonal in the box. */
  readonly dmin: number;
  readonly dmax: number;
  fmin: number;
  fmax: number;
  bmin: number;
  bmax: number;
  /** Whether the forward and backward middle diagonals differ by an odd number. */
  readonly odd: boolean;
}

/** Myers' bidirectional O(ND) comparison, as gnulib's `diffseq.h`. */
class Myers {
  #xv: Int32Array;
  #yv: Int32Array;
  #xReal: number[];
  #yReal: number[];
  #chA: Uint8Array;
  #chB: Uint8Array;
  #fd: Int32Array;
  #bd: Int32Array;
  #off: number;
  #tooExpensive: number;
  #xmid = 0;
  #ymid = 0;
  #loMinimal = false;
  #hiMinimal = false;

  constructor(
    xv: Int32Array,
    yv: Int32Array,
    xReal: number[],
    yReal: number[],
    chA: Uint8Array,
    chB: Uint8Array,
  ) {
    this.#xv = xv;
    this.#yv = yv;
    this.#xReal = xReal;
    this.#yReal = yReal;
    this.#chA = chA;
    this.#chB = chB;
    const diags = xv.length + yv.length + 3;
    this.#fd = new Int32Array(diags);
    this.#bd = new Int32Array(diags);
    this.#off = yv.length + 1;
    let tooExpensive = 1;
    for (let d = diags; d !== 0; d >>= 2) tooExpensive <<= 1;
    this.#tooExpensive = Math.max(4096, tooExpensive);
  }

  run(): void {
    this.#compare(0, this.#xv.length, 0, this.#yv.length, false);
  }

  #compare(xoff: number, xlim: number, yoff: number, ylim: number, minimal: boolean): void {
    // Iterative on the right half, recursive on the left: bounded stack.
    while (true) {
      const xv = this.#xv, yv = this.#yv;
      while (xoff < xlim && yoff < ylim && xv[xoff] === yv[yoff]) {
        xoff++;
        yoff++;
      }
      while (xlim > xoff && ylim > yoff && xv[xlim - 1] === yv[ylim - 1]) {
        xlim--;
        ylim--;
      }
      if (xoff === xlim) {
        while (yoff < ylim) this.#chB[this.#yReal[yoff++] + 1] = 1;
        return;
      }
      if (yoff === ylim) {
        while (xoff < xlim) this.#chA[this.#xReal[xoff++] + 1] = 1;
        return;
      }
      this.#diag(xoff, xlim, yoff, ylim, minimal);
      const xmid = this.#xmid, ymid = this.#ymid;
      const hi = this.#hiMinimal;
      this.#compare(xoff, xmid, yoff, ymid, this.#loMinimal);
      xoff = xmid;
      yoff = ymid;
      minimal = hi;
    }
  }

  #diag(xoff: number, xlim: number, yoff: number, ylim: number, minimal: boolean): void {
    const fmid = xoff - yoff;
    const bmid = xlim - ylim;
    const s: Search = {
      xoff,
      xlim,
      yoff,
      ylim,
      dmin: xoff - ylim,
      dmax: xlim - yoff,
      fmin: fmid,
      fmax: fmid,
      bmin: bmid,
      bmax: bmid,
      odd: ((fmid - bmid) & 1) !== 0,
    };
    this.#fd[this.#off + fmid] = xoff;
    this.#bd[this.#off + bmid] = xlim;
    for (let c = 1;; c++) {
      if (this.#forward(s) || this.#backward(s)) return;
      if (minimal || c < this.#tooExpensive) continue;
      // Gone well beyond the call of duty: split halfway between the best
      // forward and backward reach so far (GNU's heuristic, non-minimal).
      const [fxybest, fxbest] = this.#bestForward(s);
      const [bxybest, bxbest] = this.#bestBackward(s);
      if (xlim + ylim - bxybest < fxybest - (xoff + yoff)) {
        this.#split(fxbest, fxybest - fxbest, true, false);
      } else {
        this.#split(bxbest, bxybest - bxbest, false, true);
      }
      return;
    }
  }

  /**
   * Extends each forward diagonal by one edit and its snake; true once one
   * overlaps the backward search (the split is then set).
   */
  #forward(s: Search): boolean {
    const fd = this.#fd, bd = this.#bd, o = this.#off;
    const xv = this.#xv, yv = this.#yv;
    const { xlim, ylim } = s;
    if (s.fmin > s.dmin) fd[o + --s.fmin - 1] = -1;
    else s.fmin++;
    if (s.fmax < s.dmax) fd[o + ++s.fmax + 1] = -1;
    else s.fmax--;
    for (let d = s.fmax; d >= s.fmin; d -= 2) {
      const tlo = fd[o + d - 1], thi = fd[o + d + 1];
      const x0 = tlo >= thi ? tlo + 1 : thi;
      let x = x0, y = x0 - d;
      while (x < xlim && y < ylim && xv[x] === yv[y]) {
        x++;
        y++;
      }
      fd[o + d] = x;
      if (s.odd && s.bmin <= d && d <= s.bmax && bd[o + d] <= x) {
        this.#split(x, y, true, true);
        return true;
      }
    }
    return false;
  }

  /** The mirror of `#forward`, from the end of the box. */
  #backward(s: Search): boolean {
    const fd = this.#fd, bd = this.#bd, o = this.#off;
    const xv = this.#xv, yv = this.#yv;
    const { xoff, yoff } = s;
    if (s.bmin > s.dmin) bd[o + --s.bmin - 1] = 0x7fffffff;
    else s.bmin++;
    if (s.bmax < s.dmax) bd[o + ++s.bmax + 1] = 0x7fffffff;
    else s.bmax--;
    for (let d = s.bmax; d >= s.bmin; d -= 2) {
      const tlo = bd[o + d - 1], thi = bd[o + d + 1];
      const x0 = tlo < thi ? tlo : thi - 1;
      let x = x0, y = x0 - d;
      while (xoff < x && yoff < y && xv[x - 1] === yv[y - 1]) {
        x--;
        y--;
      }
      bd[o + d] = x;
      if (!s.odd && s.fmin <= d && d <= s.fmax && x <= fd[o + d]) {
        this.#split(x, y, true, true);
        return true;
      }
    }
    return false;
  }

  /** The forward diagonal that got furthest (largest x + y), clipped to the box: [x + y, x]. */
  #bestForward(s: Search): [number, number] {
    const fd = this.#fd, o = this.#off;
    let fxybest = -1, fxbest = 0;
    for (let d = s.fmax; d >= s.fmin; d -= 2) {
      let x = Math.min(fd[o + d], s.xlim);
      let y = x - d;
      if (s.ylim < y) {
        x = s.ylim + d;
        y = s.ylim;
      }
      if (fxybest < x + y) {
        fxybest = x + y;
        fxbest = x;
      }
    }
    return [fxybest, fxbest];
  }

  /** The backward diagonal that got furthest (smallest x + y), clipped to the box: [x + y, x]. */
  #bestBackward(s: Search): [number, number] {
    const bd = this.#bd, o = this.#off;
    let bxybest = Number.MAX_SAFE_INTEGER, bxbest = 0;
    for (let d = s.bmax; d >= s.bmin; d -= 2) {
      let x = Math.max(s.xoff, bd[o + d]);
      let y = x - d;
      if (y < s.yoff) {
        x = s.yoff + d;
        y = s.yoff;
      }
      if (x + y < bxybest) {
        bxybest = x + y;
        bxbest = x;
      }
    }
    return [bxybest, bxbest];
  }

  #split(x: number, y: number, lo: boolean, hi: boolean): void {
    this.#xmid = x;
    this.#ymid = y;
    this.#loMinimal = lo;
    this.#hiMinimal = hi;
  }
}

/**
 * GNU `shift_boundaries`: slides each run of changes to merge with
 * neighbouring runs, else as far down as possible, then back up to line up
 * with a run of changes in the other file. `ch` and `other` hold line `k` at
 * index `k + 1`, with a zero sentinel at each end.
 */
function shiftBoundaries(eq: Int32Array, ch: Uint8Array, other: Uint8Array, iEnd: number): void {
  const C = (k: number) => ch[k + 1];
  const O = (k: number) => other[k + 1];
  let i = 0, j = 0;
  while (true) {
    while (i < iEnd && !C(i)) {
      while (O(j++)) { /* skip */ }
      i++;
    }
    if (i === iEnd) break;
    let start = i;
    while (C(++i)) { /* skip */ }
    while (O(j)) j++;
    let runlength: number;
    let corresponding: number;
    do {
      runlength = i - start;
      while (start && eq[start - 1] === eq[i - 1]) {
        ch[start--] = 1;
        ch[i--] = 0;
        while (C(start - 1)) start--;
        while (O(--j)) { /* skip */ }
      }
      corresponding = O(j - 1) ? i : iEnd;
      while (i !== iEnd && eq[start] === eq[i]) {
        ch[start++ + 1] = 0;
        ch[i++ + 1] = 1;
        while (C(i)) i++;
        while (O(++j)) corresponding = i;
      }
    } while (runlength !== i - start);
    while (corresponding < i) {
      ch[start--] = 1;
      ch[i--] = 0;
      while (O(--j)) { /* skip */ }
    }
  }
}

/** Prints the hunks of a change script, grouping changes within 2 * context lines. */
function formatHunks(
  a: string[],
  b: string[],
  changedA: Uint8Array,
  changedB: Uint8Array,
  context: number,
): string {
  // Build the script: [line in a, line in b, deleted, inserted].
  const script: [number, number, number, number][] = [];
  let i = 0, j = 0;
  while (i < a.length || j < b.length) {
    if ((i < a.length && changedA[i]) || (j < b.length && changedB[j])) {
      const i0 = i, j0 = j;
      while (i < a.length && changedA[i]) i++;
      while (j < b.length && changedB[j]) j++;
      script.push([i0, j0, i - i0, j - j0]);
    } else {
      i++;
      j++;
    }
  }
  const out: string[] = [];
  let k = 0;
  while (k < script.length) {
    // Extend the hunk while the next change is within 2 * context lines.
    let last = k;
    while (
      last + 1 < script.length &&
      script[last + 1][0] - (script[last][0] + script[last][2]) <= 2 * context
    ) last++;
    const first = script[k];
    const end = script[last];
    const lo0 = Math.max(0, first[0] - context);
    const lo1 = first[1] - (first[0] - lo0);
    const hi0 = Math.min(a.length, end[0] + end[2] + context);
    const hi1 = end[1] + end[3] + (hi0 - (end[0] + end[2]));
    out.push(`@@ -${range(lo0, hi0 - lo0)} +${range(lo1, hi1 - lo1)} @@\n`);
    let p = lo0;
    for (let s = k; s <= last; s++) {
      const [x, y, del, ins] = script[s];
      for (; p < x; p++) pushLine(out, " ", a[p]);
      for (let q = 0; q < del; q++) pushLine(out, "-", a[x + q]);
      for (let q = 0; q < ins; q++) pushLine(out, "+", b[y + q]);
      p = x + del;
    }
    for (; p < hi0; p++) pushLine(out, " ", a[p]);
    k = last + 1;
  }
  return out.join("");
}

function pushLine(out: string[], mark: string, line: string): void {
  out.push(mark, line);
  if (!line.endsWith("\n")) out.push("\n", NO_NEWLINE);
}

/** GNU's unified range: `start,count`, `start` alone for one line, the line before for none. */
function range(start: number, count: number): string {
  if (count === 0) return `${start},0`;
  if (count === 1) return `${start + 1}`;
  return `${start + 1},${count}`;
}
