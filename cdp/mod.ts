/**
 * The Chrome DevTools Protocol: {@linkcode CdpClient}, a small client over
 * the built-in `WebSocket` (what `HudClient.open("cdp")` returns for a
 * `cdp/1.3` binding). The environment's side, `addBrowser` (a sandboxed
 * headless Chromium published as that capability), is in
 * `@hud/sdk/workspace`, next to the sandbox it runs in.
 *
 * @module
 */

export {
  type CdpBindingOptions,
  CdpClient,
  type CdpConnectOptions,
  CdpError,
  type CdpErrorKind,
  type CdpErrorOptions,
  type CdpEvent,
  type CdpEventHandler,
  type CdpNavigateOptions,
  type CdpNavigateResult,
  type CdpParams,
  type CdpSendOptions,
  CdpSession,
  type CdpWaitForOptions,
  discoverBrowserWsUrl,
} from "./client.ts";
