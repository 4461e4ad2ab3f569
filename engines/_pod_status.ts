// Reading pods: what the API's listings say about each of KubernetesRuntime's
// pods, folded into a record of its state, and what that state means for a
// placement (failed, waiting for room, running). Pure functions of the
// listing, the record and the time: tested without a cluster
// (tests/engines/pod_status_test.ts); the runtime does the I/O.

/** A pod's status, as the API spells it (the fields read here). */
export interface PodStatus {
  phase?: string;
  podIP?: string;
  reason?: string;
  message?: string;
  conditions?: { type: string; status: string; reason?: string; message?: string }[];
  containerStatuses?: {
    name: string;
    ready?: boolean;
    restartCount?: number;
    state?: {
      waiting?: { reason?: string; message?: string };
      running?: unknown;
      terminated?: { exitCode?: number; reason?: string; message?: string };
    };
  }[];
}

/** A pod, as the API spells it (the fields read here). */
export interface PodObject {
  metadata: { name: string; uid?: string; deletionTimestamp?: string };
  spec?: { nodeName?: string };
  status?: PodStatus;
}

/** A node, as the API spells it (the fields read here). */
export interface NodeObject {
  status?: { conditions?: { type: string; status: string; reason?: string }[] };
}

/** What the runtime knows of one of its pods, folded from the listings. */
export interface PodState {
  name: string;
  /** Its node ("" before scheduling). */
  node: string;
  ip: string;
  phase: string;
  /** Why it failed (a fatal reason with the pod's words, its node lost), or null. */
  failure: string | null;
  /** Since when the container has waited for a reason that may be fatal, and which. */
  waitingSince: number;
  waitingReason: string;
  /** Why the scheduler finds no room for it, or null. */
  unschedulable: string | null;
  unschedulableSince: number;
  /** The Ready condition was true once. */
  wasReady: boolean;
  /** The Ready condition went false after it was true (the node controller lost its node). */
  notReady: boolean;
  /** It is no longer in the listings. */
  gone: boolean;
  createdAt: number;
}

/**
 * Container waiting reasons that do not get better by waiting, and how long
 * one may last before placing fails, in ms: a pod's Secret can take the
 * kubelet a few seconds to see (CreateContainerConfigError: "failed to sync
 * secret cache"), and the kubelet tries again by itself.
 */
const FATAL_WAITING: ReadonlyMap<string, number> = new Map([
  ["ErrImagePull", 0],
  ["ImagePullBackOff", 0],
  ["InvalidImageName", 0],
  ["ErrImageNeverPull", 0],
  ["CreateContainerConfigError", 20_000],
  ["CreateContainerError", 20_000],
  ["RunContainerError", 0],
  ["CrashLoopBackOff", 0],
]);

/**
 * A pod that was just created is missing from listings this long (a
 * listing made before the creation returned) before it counts as deleted.
 */
const LISTING_GRACE_MS = 5_000;

/** The record of a pod the API just created. */
export function newPodState(created: PodObject, now: number): PodState {
  return {
    name: created.metadata.name,
    node: created.spec?.nodeName ?? "",
    ip: "",
    phase: "Pending",
    failure: null,
    waitingSince: 0,
    waitingReason: "",
    unschedulable: null,
    unschedulableSince: 0,
    wasReady: false,
    notReady: false,
    gone: false,
    createdAt: now,
  };
}

/**
 * Folds a pod's listing into its record: node, address, phase, whether the
 * scheduler finds room, whether it failed (a fatal waiting reason past its
 * grace, a container that exited, a deletion that is not ours), whether its
 * Ready condition went false after it was true.
 * @param deletingHere the runtime is deleting it (its deletion is no failure)
 */
export function observePod(
  pod: PodState,
  obj: PodObject,
  now: number,
  deletingHere = false,
): void {
  const st = obj.status ?? {};
  pod.node = obj.spec?.nodeName ?? pod.node;
  pod.ip = st.podIP ?? pod.ip;
  pod.phase = st.phase ?? pod.phase;
  const scheduled = st.conditions?.find((c) => c.type === "PodScheduled");
  if (scheduled?.status === "False" && scheduled.reason === "Unschedulable") {
    if (pod.unschedulable === null) pod.unschedulableSince = now;
    pod.unschedulable = scheduled.message ?? "unschedulable";
  } else {
    pod.unschedulable = null;
  }
  if (!st.containerStatuses?.[0]?.state?.waiting) pod.waitingReason = "";
  if (pod.failure === null) pod.failure = containerFailure(pod, st, now);
  const ready = st.conditions?.find((c) => c.type === "Ready");
  if (ready?.status === "True") pod.wasReady = true;
  // The node controller marks the pods of a node it lost not ready.
  else if (pod.wasReady && ready?.status === "False") pod.notReady = true;
  if (obj.metadata.deletionTimestamp && !deletingHere) pod.failure ??= "the pod is being deleted";
}

/**
 * Why the pod's container failed, or null: a waiting reason that does not
 * get better (once its grace is over), or a container that exited.
 */
function containerFailure(pod: PodState, st: PodStatus, now: number): string | null {
  const state = st.containerStatuses?.[0]?.state;
  const waiting = state?.waiting;
  const grace = waiting?.reason ? FATAL_WAITING.get(waiting.reason) : undefined;
  if (waiting?.reason !== undefined && grace !== undefined) {
    if (pod.waitingReason !== waiting.reason) {
      pod.waitingReason = waiting.reason;
      pod.waitingSince = now;
    }
    if (now - pod.waitingSince < grace) return null;
    return `${waiting.reason}${waiting.message ? `: ${waiting.message}` : ""}`;
  }
  const term = state?.terminated;
  if (!term && pod.phase !== "Failed" && pod.phase !== "Succeeded") return null;
  const code = term?.exitCode !== undefined ? ` with code ${term.exitCode}` : "";
  const why = term?.reason
    ? ` (${term.reason})`
    : st.reason
    ? ` (${st.reason}${st.message ? `: ${st.message}` : ""})`
    : "";
  return `${EXITED}${code}${why}`;
}

/** How a failure from a container that exited begins. */
const EXITED = "the container exited";

/**
 * Whether the pod failed on its node rather than in its program: one whose
 * program exited would exit anywhere, and one the scheduler found no room
 * for has no node; any other (a pull error, no answer, its node lost) may
 * start on another node.
 */
export function failedOnItsNode(pod: PodState): boolean {
  return pod.unschedulable === null && !pod.failure?.startsWith(EXITED);
}

/**
 * Marks the pods missing from a listing as gone (deleted by someone, or by
 * the runtime), but for those created too recently to be listed.
 * @param listed the names the listing holds
 * @returns the pods that went now
 */
export function markGone<P extends PodState>(
  pods: Iterable<P>,
  listed: ReadonlySet<string>,
  now: number,
): P[] {
  const went: P[] = [];
  for (const pod of pods) {
    if (listed.has(pod.name) || now - pod.createdAt < LISTING_GRACE_MS || pod.gone) continue;
    pod.gone = true;
    pod.failure ??= "the pod was deleted";
    went.push(pod);
  }
  return went;
}

/**
 * The pods bound to a node that have not started: a node that stopped
 * answering never starts them, so the runtime asks after those nodes.
 */
export function pendingByNode<P extends PodState>(pods: Iterable<P>): Map<string, P[]> {
  const out = new Map<string, P[]>();
  for (const p of pods) {
    if (p.gone || p.node === "" || p.phase !== "Pending" || p.failure !== null) continue;
    const list = out.get(p.node) ?? [];
    list.push(p);
    out.set(p.node, list);
  }
  return out;
}

/** Fails the pods of a node that is not ready: they never start there. */
export function failOnLostNode(pods: Iterable<PodState>, node: string): void {
  for (const p of pods) {
    p.failure = `its node ${node} is not ready`;
    p.notReady = true;
  }
}

/** Where a pod being placed stands. */
export type PodProgress =
  /** It cannot be placed: the reason, as the error's end. */
  | { state: "failed"; why: string }
  /** The scheduler finds no room for it (yet): it needs no create slot meanwhile. */
  | { state: "unschedulable" }
  /** It runs and has an address: time for the handshake. */
  | { state: "running" }
  /** Anything else: wait for the next listing. */
  | { state: "pending" };

/**
 * Where a pod being placed stands: failed (its failure, or no room for
 * longer than `unschedulableTimeout`), waiting for room, running, or
 * pending.
 */
export function podProgress(pod: PodState, now: number, unschedulableTimeout: number): PodProgress {
  if (pod.failure !== null) return { state: "failed", why: `failed: ${pod.failure}` };
  if (pod.unschedulable !== null) {
    return now - pod.unschedulableSince >= unschedulableTimeout
      ? { state: "failed", why: `is unschedulable: ${pod.unschedulable}` }
      : { state: "unschedulable" };
  }
  if (pod.phase === "Running" && pod.ip !== "") return { state: "running" };
  return { state: "pending" };
}

/** Whether the pod's log belongs in an error about it: its program ended. */
export function logWorthShowing(pod: PodState, why: string): boolean {
  return pod.phase === "Failed" || pod.phase === "Succeeded" || /exited/.test(why);
}

/** A node's Ready condition; undefined when it has none. */
export function nodeReady(node: NodeObject): boolean | undefined {
  const ready = node.status?.conditions?.find((c) => c.type === "Ready");
  return ready === undefined ? undefined : ready.status === "True";
}

/** Why a pod on a lost node is gone, from the node's Ready condition. */
export function nodeProblem(name: string, node: NodeObject): string {
  const ready = node.status?.conditions?.find((c) => c.type === "Ready");
  return `node ${name} is not ready (${ready?.reason ?? ready?.status ?? "unknown"})`;
}

/** A pod's last events, `reason: message` (the last four different ones, oldest first), as an error's end. */
export function eventsText(
  items: readonly { reason?: string; message?: string; lastTimestamp?: string }[],
): string {
  const sorted = [...items].sort((a, b) =>
    String(a.lastTimestamp).localeCompare(String(b.lastTimestamp))
  );
  const seen = [...new Set(sorted.map((e) => `${e.reason}: ${e.message}`))].slice(-4);
  return seen.length === 0 ? "" : `; events: ${seen.join(" | ")}`;
}

/** A pod's last lines of output (at most five), as an error's end. */
export function logText(text: unknown): string {
  const lines = String(text ?? "").trim().split("\n").filter((l) => l !== "").slice(-5);
  return lines.length === 0 ? "" : `; last output: ${lines.join(" | ")}`;
}
