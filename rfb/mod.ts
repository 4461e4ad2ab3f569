/**
 * RFB (VNC, RFC 6143) for agents that use a desktop: {@linkcode RfbClient}
 * connects to a VNC server (TCP, a unix socket, an `rfb` binding through the
 * HUD client's forwarder, or any byte stream), keeps a copy of the screen,
 * takes PNG screenshots, waits for the screen to settle, and sends clicks,
 * drags, scrolls, keys and text. Environments publish a desktop with
 * `addDesktop` (`@hud/sdk/workspace`); `HudClient.open("rfb")` returns this
 * client for it.
 *
 * @module
 */

export {
  type RfbBindingOptions,
  type RfbButton,
  type RfbClickOptions,
  RfbClient,
  type RfbConnectOptions,
  type RfbDragOptions,
  type RfbEncodingName,
  type RfbFrame,
  type RfbKeyOptions,
  type RfbOptions,
  type RfbPoint,
  type RfbScreenshotOptions,
  type RfbScrollOptions,
  type RfbSettleOptions,
  type RfbWaitOptions,
} from "./client.ts";
export { RfbError, type RfbErrorKind, type RfbTransport } from "./_wire.ts";
export type { CursorShape } from "./_framebuffer.ts";
export { encodePng, scaleRgba } from "./_png.ts";
