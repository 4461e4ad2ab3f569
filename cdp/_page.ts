/**
 * The page helpers of a CDP session (`CdpSession.navigate`, `evaluate` and
 * `screenshot` in `client.ts`), over the session's `send` and `waitFor`.
 *
 * @module
 */

import { CdpError, type CdpEvent, type CdpParams, isObject } from "./_protocol.ts";

/** What the helpers need of a session. */
export interface PageTarget {
  send<T extends object = CdpParams>(
    method: string,
    params?: CdpParams,
    options?: { signal?: AbortSignal },
  ): Promise<T>;
  waitFor(
    method: string,
    predicate?: (params: CdpParams, event: CdpEvent) => boolean,
    options?: { signal?: AbortSignal },
  ): Promise<CdpParams>;
}

/** Options for {@linkcode CdpSession.navigate}. */
export interface CdpNavigateOptions {
  /** Lifecycle event to wait for; `"none"` returns right after `Page.navigate`. */
  waitUntil?: "load" | "DOMContentLoaded" | "none";
  /** Stops waiting. */
  signal?: AbortSignal;
}

/** Result of {@linkcode CdpSession.navigate}. */
export interface CdpNavigateResult {
  /** Frame that navigated. */
  frameId: string;
  /** Loader id; absent for same-document navigations. */
  loaderId: string | undefined;
}

/** See `CdpSession.navigate()`. */
export async function navigatePage(
  page: PageTarget,
  url: string,
  options: CdpNavigateOptions,
): Promise<CdpNavigateResult> {
  const { signal, waitUntil = "load" } = options;
  const seen = new Set<string>();
  const abort = new AbortController();
  const combined = signal ? AbortSignal.any([signal, abort.signal]) : abort.signal;
  let wanted: string | undefined;
  const lifecycle = waitUntil === "none" ? undefined : page.waitFor(
    "Page.lifecycleEvent",
    (p) => {
      if (p.name !== waitUntil || typeof p.loaderId !== "string") return false;
      seen.add(p.loaderId);
      return wanted !== undefined && seen.has(wanted);
    },
    { signal: combined },
  );
  lifecycle?.catch(() => {}); // handled below; avoid unhandled rejection when aborted early
  try {
    const result = await page.send<{ frameId: string; loaderId?: string; errorText?: string }>(
      "Page.navigate",
      { url },
      { signal },
    );
    if (result.errorText) {
      throw new CdpError(`Navigation to ${url} failed: ${result.errorText}`, {
        kind: "protocol",
        method: "Page.navigate",
        data: result.errorText,
      });
    }
    const out: CdpNavigateResult = { frameId: result.frameId, loaderId: result.loaderId };
    if (lifecycle === undefined || result.loaderId === undefined) return out;
    wanted = result.loaderId;
    if (seen.has(wanted)) return out;
    await lifecycle;
    return out;
  } finally {
    abort.abort();
  }
}

/** See `CdpSession.evaluate()`. */
export async function evaluateInPage<T>(
  page: PageTarget,
  expression: string,
  options: { signal?: AbortSignal; awaitPromise?: boolean },
): Promise<T> {
  const { signal, awaitPromise = true } = options;
  const res = await page.send<{ result: CdpParams; exceptionDetails?: CdpParams }>(
    "Runtime.evaluate",
    { expression, returnByValue: true, awaitPromise },
    { signal },
  );
  if (res.exceptionDetails !== undefined) {
    const d = res.exceptionDetails;
    const exc = isObject(d.exception) ? d.exception : undefined;
    const description = typeof exc?.description === "string"
      ? exc.description
      : typeof d.text === "string"
      ? d.text
      : "Uncaught exception";
    throw new CdpError(`Evaluation failed: ${description}`, {
      kind: "exception",
      method: "Runtime.evaluate",
      exceptionDetails: d,
    });
  }
  return res.result.value as T;
}

/** See `CdpSession.screenshot()`. */
export async function screenshotPage(
  page: PageTarget,
  options: { signal?: AbortSignal; fullPage?: boolean },
): Promise<Uint8Array<ArrayBuffer>> {
  const { signal, fullPage = false } = options;
  const { data } = await page.send<{ data: string }>(
    "Page.captureScreenshot",
    { format: "png", captureBeyondViewport: fullPage },
    { signal },
  );
  return Uint8Array.fromBase64(data);
}
