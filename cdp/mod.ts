/**
 * The Chrome DevTools Protocol: {@linkcode CdpClient}, a small client over
 * the built-in `WebSocket` (what `HudClient.open("cdp")` returns for a
 * `cdp/1.3` binding), and {@linkcode addBrowser}, which gives an
 * environment a headless Chromium published as that capability.
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
export { addBrowser, type BrowserOptions } from "./browser.ts";
