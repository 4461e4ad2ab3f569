/**
 * {@linkcode RfbClient}: a VNC client written from RFC 6143, for agents that
 * use a desktop. It speaks protocol 3.3, 3.7 and 3.8 with the security types
 * None and VNC authentication, asks for a 32-bit true-colour pixel format
 * and the encodings ZRLE (zlib through the web platform's
 * DecompressionStream, one stream per connection), CopyRect and Raw with the
 * DesktopSize, LastRect and Cursor pseudo-encodings, and sends key and
 * pointer events and cut text. `screenshot()` is a PNG (compressed by
 * CompressionStream), taken after a round trip that brings the client's copy
 * of the screen up to date; `settle()` waits until the screen stops
 * changing.
 *
 * @module
 */

import type { Capability } from "../capability.ts";
import { parseHostPort } from "../capability.ts";
import { Deadline } from "../_internal/async.ts";
import { writeAll } from "../_internal/io.ts";
import { errorMessage } from "../_internal/util.ts";
import { handshake } from "./_handshake.ts";
import {
  checkSize,
  type CursorShape,
  type DecoderState,
  Framebuffer,
  readUpdate,
  type UpdateStats,
} from "./_framebuffer.ts";
import { charKeysym, comboKeysyms } from "./_keysym.ts";
import { encodePng, scaleRgba } from "./_png.ts";
import {
  ByteReader,
  CLIENT_FORMAT,
  clientCutText,
  Encoding,
  keyEvent,
  latin1,
  pointerEvent,
  RfbError,
  type RfbTransport,
  setEncodings,
  setPixelFormat,
  updateRequest,
} from "./_wire.ts";
import { Inflater } from "./_zlib.ts";

/** An encoding the client may ask for, by name. */
export type RfbEncodingName = "zrle" | "copyrect" | "raw";

/** Options for {@linkcode RfbClient.over}. */
export interface RfbOptions {
  /** The VNC password, for servers that ask for one (VNC authentication). */
  password?: string;
  /**
   * Whether other clients stay connected (ClientInit's shared flag).
   * @default true
   */
  shared?: boolean;
  /**
   * How long connecting and the handshake may take, in ms.
   * @default 10_000
   */
  connectTimeout?: number;
  /**
   * The most pixels the desktop may have; a larger one (at the start, or
   * resized later) ends the connection with an error.
   * @default 33_554_432 (2^25: 8192x4096)
   */
  maxPixels?: number;
  /**
   * The encodings to ask for, most wanted first (Raw is always accepted).
   * @default ["zrle", "copyrect", "raw"]
   */
  encodings?: readonly RfbEncodingName[];
  /**
   * The most bytes of cut text taken from the server; more ends the
   * connection with an error.
   * @default 1_048_576
   */
  maxCutText?: number;
  /** Aborts connecting. */
  signal?: AbortSignal;
}

/** Options for {@linkcode RfbClient.connect}. */
export interface RfbConnectOptions extends RfbOptions {
  /**
   * The server's host.
   * @default "127.0.0.1"
   */
  hostname?: string;
  /**
   * The server's TCP port.
   * @default 5900
   */
  port?: number;
  /** A unix socket to connect to instead of a TCP port. */
  path?: string;
}

/** Options for {@linkcode RfbClient.fromBinding}. */
export interface RfbBindingOptions extends RfbOptions {
  /** The VNC password. @default the binding's `password` param */
  password?: string;
}

/** A point on the screen, in pixels from the top left. */
export interface RfbPoint {
  /** Pixels from the left edge. */
  x: number;
  /** Pixels from the top edge. */
  y: number;
}

/** A mouse button. */
export type RfbButton = "left" | "middle" | "right";

/** Options of calls that wait. */
export interface RfbWaitOptions {
  /** Aborts the wait. */
  signal?: AbortSignal;
  /**
   * How long the server may take to answer, in ms.
   * @default 10_000
   */
  timeout?: number;
}

/** Options for {@linkcode RfbClient.screenshot}. */
export interface RfbScreenshotOptions extends RfbWaitOptions {
  /**
   * Scale the picture to this size (a model that works at another
   * resolution); both or neither of `width` and `height`.
   * @default the desktop's size
   */
  width?: number;
  /** See `width`. */
  height?: number;
}

/** Options for {@linkcode RfbClient.settle}. */
export interface RfbSettleOptions {
  /**
   * How long the screen must stay unchanged, in ms.
   * @default 300
   */
  quiet?: number;
  /**
   * The longest to wait for that, in ms.
   * @default 5_000
   */
  timeout?: number;
  /** Aborts the wait. */
  signal?: AbortSignal;
}

/** Options for {@linkcode RfbClient.click} and the other pointer calls. */
export interface RfbClickOptions {
  /**
   * The button.
   * @default "left"
   */
  button?: RfbButton;
  /**
   * Clicks in a row (2 is a double click).
   * @default 1
   */
  count?: number;
}

/** Options for {@linkcode RfbClient.drag}. */
export interface RfbDragOptions {
  /**
   * The button held.
   * @default "left"
   */
  button?: RfbButton;
  /**
   * Pointer moves between the ends (applications that track motion need some).
   * @default 10
   */
  steps?: number;
}

/** Options for {@linkcode RfbClient.scroll}. */
export interface RfbScrollOptions {
  /** Wheel clicks down (negative: up). @default 0 */
  dy?: number;
  /** Wheel clicks right (negative: left). @default 0 */
  dx?: number;
}

/** Options for {@linkcode RfbClient.key}. */
export interface RfbKeyOptions {
  /**
   * How long to hold the keys down, in ms.
   * @default 0
   */
  hold?: number;
}

/** The screen's pixels. */
export interface RfbFrame {
  /** The width in pixels. */
  width: number;
  /** The height in pixels. */
  height: number;
  /** RGBA, `width * height * 4` bytes, rows top to bottom. */
  rgba: Uint8Array;
}

const BUTTON_BITS: Readonly<Record<RfbButton, number>> = { left: 1, middle: 2, right: 4 };
const WHEEL = { up: 8, down: 16, left: 32, right: 64 } as const;
const ENCODING_CODES: Readonly<Record<RfbEncodingName, number>> = {
  zrle: Encoding.ZRLE,
  copyrect: Encoding.COPY_RECT,
  raw: Encoding.RAW,
};
const DEFAULT_MAX_PIXELS = 2 ** 25;
/** Characters typed with Shift on a US keyboard. */
const SHIFTED = /^[A-Z~!@#$%^&*()_+{}|:"<>?]$/;

interface Waiter {
  resolve(stats: UpdateStats): void;
  reject(err: unknown): void;
}

/** A resolved {@linkcode RfbOptions}. */
interface RfbConfig {
  password: string | undefined;
  shared: boolean;
  connectTimeout: number;
  maxPixels: number;
  encodings: number[];
  maxCutText: number;
  signal: AbortSignal | undefined;
}

function resolveOptions(options: RfbOptions): RfbConfig {
  const names: readonly RfbEncodingName[] = options.encodings ?? ["zrle", "copyrect", "raw"];
  if (!Array.isArray(names) || names.some((n) => !Object.hasOwn(ENCODING_CODES, n))) {
    throw new TypeError(
      `Cannot connect to the VNC server: encodings must be some of "zrle", "copyrect", "raw"`,
    );
  }
  const maxPixels = options.maxPixels ?? DEFAULT_MAX_PIXELS;
  if (!Number.isInteger(maxPixels) || maxPixels < 1) {
    throw new RangeError(`Cannot connect to the VNC server: invalid maxPixels "${maxPixels}"`);
  }
  const encodings = names.map((n: RfbEncodingName) => ENCODING_CODES[n]);
  if (!encodings.includes(Encoding.RAW)) encodings.push(Encoding.RAW);
  encodings.push(Encoding.DESKTOP_SIZE, Encoding.LAST_RECT, Encoding.CURSOR);
  return {
    password: options.password,
    shared: options.shared ?? true,
    connectTimeout: options.connectTimeout ?? 10_000,
    maxPixels,
    encodings,
    maxCutText: options.maxCutText ?? 1024 * 1024,
    signal: options.signal,
  };
}

function rounded(p: RfbPoint, what: string): RfbPoint {
  if (
    typeof p !== "object" || p === null || !Number.isFinite(p.x) || !Number.isFinite(p.y)
  ) {
    throw new TypeError(`Cannot ${what}: a point must be { x, y } with finite numbers`);
  }
  return { x: Math.round(p.x), y: Math.round(p.y) };
}

/**
 * A connection to a VNC server. Make one with {@linkcode RfbClient.connect}
 * (TCP or a unix socket), {@linkcode RfbClient.fromBinding} (an `rfb`
 * binding, through the HUD client's forwarder) or
 * {@linkcode RfbClient.over} (any byte stream).
 *
 * @example Take a screenshot and click
 * ```ts ignore
 * import { RfbClient } from "@hud/sdk/rfb";
 *
 * await using vnc = await RfbClient.connect({ port: 5901 });
 * const png = await vnc.screenshot();
 * await vnc.click({ x: 100, y: 200 });
 * await vnc.settle();
 * await vnc.type("hello\n");
 * ```
 */
export class RfbClient implements AsyncDisposable {
  readonly #transport: RfbTransport;
  readonly #reader: ByteReader;
  readonly #state: DecoderState;
  readonly #config: RfbConfig;
  readonly #name: string;
  readonly #version: string;
  readonly #loop: Promise<void>;
  #waiters: Waiter[] = [];
  #writing: Promise<void> = Promise.resolve();
  #error: RfbError | null = null;
  #closed = false;
  #haveFrame = false;
  #updates = 0;
  #pointer: RfbPoint = { x: 0, y: 0 };
  #buttons = 0;
  #cutText: string | null = null;

  private constructor(
    transport: RfbTransport,
    reader: ByteReader,
    config: RfbConfig,
    init: { width: number; height: number; name: string; version: string },
  ) {
    this.#transport = transport;
    this.#reader = reader;
    this.#config = config;
    this.#name = init.name;
    this.#version = init.version;
    this.#state = {
      fb: new Framebuffer(init.width, init.height),
      zrle: new Inflater(),
      maxPixels: config.maxPixels,
      cursor: null,
    };
    this.#loop = this.#readLoop();
  }

  /**
   * Connects to a VNC server over TCP or a unix socket and runs the handshake.
   * @throws {RfbError} when the server does not speak RFB ("protocol"),
   *   offers no security type this client speaks ("security"), refuses the
   *   password ("auth"), or cannot be reached or hangs up ("closed")
   */
  static async connect(options: RfbConnectOptions = {}): Promise<RfbClient> {
    const config = resolveOptions(options);
    const where = options.path ?? `${options.hostname ?? "127.0.0.1"}:${options.port ?? 5900}`;
    using deadline = new Deadline(config.connectTimeout, config.signal, "VNC connect");
    let conn: Deno.Conn;
    try {
      const connecting: Promise<Deno.Conn> = options.path !== undefined
        ? Deno.connect({ transport: "unix", path: options.path })
        : Deno.connect({ hostname: options.hostname ?? "127.0.0.1", port: options.port ?? 5900 });
      conn = await raceSignal(connecting, deadline.signal, (c) => c.close());
    } catch (err) {
      throw new RfbError(
        "closed",
        `Cannot connect to the VNC server at ${where}: ${errorMessage(err)}`,
        {
          cause: err,
        },
      );
    }
    return await RfbClient.over(conn, options);
  }

  /**
   * Connects to an `rfb` binding (through the HUD client's forwarder when
   * it comes from `HudClient.binding()`), with its `password` param.
   * @throws {TypeError} when the binding is not an `rfb` one
   */
  static async fromBinding(
    capability: Capability,
    options: RfbBindingOptions = {},
  ): Promise<RfbClient> {
    if (capability.family !== "rfb") {
      throw new TypeError(
        `Cannot open binding "${capability.name}": expected an rfb binding, got "${capability.protocol}"`,
      );
    }
    const target = parseHostPort(capability.url);
    if (target === null || target.port === null) {
      throw new TypeError(
        `Cannot open binding "${capability.name}": its url "${capability.url}" has no host and port`,
      );
    }
    const password = options.password ??
      (typeof capability.params.password === "string" ? capability.params.password : undefined);
    return await RfbClient.connect({
      ...options,
      password,
      hostname: target.hostname,
      port: target.port,
    });
  }

  /**
   * Runs the handshake over a stream that is already open (a socket, a
   * desktop's pipe) and returns the client, which owns the stream.
   * @throws {RfbError} as {@linkcode RfbClient.connect}; "protocol" also
   *   when the server says nothing within `connectTimeout`
   */
  static async over(transport: RfbTransport, options: RfbOptions = {}): Promise<RfbClient> {
    const config = resolveOptions(options);
    const reader = new ByteReader(transport);
    using deadline = new Deadline(config.connectTimeout, config.signal, "VNC handshake");
    const write = (b: Uint8Array) => writeAll(transport, b);
    try {
      const init = await raceSignal(
        handshake(reader, write, { password: config.password, shared: config.shared }),
        deadline.signal,
        () => {},
      );
      checkSize(init.width, init.height, config.maxPixels);
      await write(setPixelFormat(CLIENT_FORMAT));
      await write(setEncodings(config.encodings));
      return new RfbClient(transport, reader, config, init);
    } catch (err) {
      try {
        transport.close();
      } catch {
        // already closed
      }
      if (err instanceof RfbError) throw err;
      if (deadline.signal.aborted && !config.signal?.aborted) {
        throw new RfbError(
          "protocol",
          `Cannot connect to the VNC server: no RFB handshake within ${config.connectTimeout} ms (is it a VNC server?)`,
          { cause: err },
        );
      }
      throw err;
    }
  }

  /** The desktop's width in pixels. */
  get width(): number {
    return this.#state.fb.width;
  }

  /** The desktop's height in pixels. */
  get height(): number {
    return this.#state.fb.height;
  }

  /** The desktop's name, as the server gave it. */
  get name(): string {
    return this.#name;
  }

  /** The protocol version in use: "3.3", "3.7" or "3.8". */
  get version(): string {
    return this.#version;
  }

  /** Bytes received from the server so far (the handshake included). */
  get bytesRead(): number {
    return this.#reader.total;
  }

  /** FramebufferUpdate messages received so far. */
  get updates(): number {
    return this.#updates;
  }

  /** Where this client last put the pointer. */
  get pointer(): RfbPoint {
    return { ...this.#pointer };
  }

  /** The pointer's shape, when the server sent one. */
  get cursor(): CursorShape | null {
    return this.#state.cursor;
  }

  /** The text the server last put on the clipboard (ServerCutText), if any. */
  get cutText(): string | null {
    return this.#cutText;
  }

  /** Whether the connection has ended. */
  get closed(): boolean {
    return this.#closed || this.#error !== null;
  }

  async #readLoop(): Promise<void> {
    const r = this.#reader;
    try {
      for (;;) {
        const type = await r.u8();
        if (type === 0) {
          const stats = await readUpdate(r, this.#state);
          this.#updates++;
          const waiters = this.#waiters;
          this.#waiters = [];
          for (const w of waiters) w.resolve(stats);
        } else if (type === 1) {
          // SetColourMapEntries: not for a true-colour format; skipped.
          await r.bytes(3);
          const n = await r.u16();
          await r.bytes(n * 6);
        } else if (type === 2) {
          // Bell.
        } else if (type === 3) {
          await r.bytes(3);
          const n = await r.u32();
          if (n > this.#config.maxCutText) {
            throw new RfbError(
              "protocol",
              `Cannot read cut text: the server sent ${n} bytes, over the ${this.#config.maxCutText} allowed (maxCutText)`,
            );
          }
          this.#cutText = latin1(await r.bytes(n));
        } else {
          throw new RfbError(
            "protocol",
            `Cannot read from the VNC server: unknown message type ${type}`,
          );
        }
      }
    } catch (err) {
      this.#fail(
        err instanceof RfbError
          ? err
          : new RfbError("protocol", `Cannot read from the VNC server: ${errorMessage(err)}`, {
            cause: err,
          }),
      );
    }
  }

  #fail(err: RfbError): void {
    if (this.#error === null) this.#error = this.#closed ? closedError() : err;
    this.#state.zrle.close();
    try {
      this.#transport.close();
    } catch {
      // already closed
    }
    const waiters = this.#waiters;
    this.#waiters = [];
    for (const w of waiters) w.reject(this.#error);
  }

  #check(): void {
    if (this.#closed) throw closedError();
    if (this.#error !== null) throw this.#error;
  }

  #send(bytes: Uint8Array): Promise<void> {
    this.#check();
    const next = this.#writing.then(() => writeAll(this.#transport, bytes));
    this.#writing = next.catch(() => {});
    return next.catch((err) => {
      const failure = new RfbError(
        "closed",
        `Cannot write to the VNC server: ${errorMessage(err)}`,
        {
          cause: err,
        },
      );
      this.#fail(failure);
      throw this.#error ?? failure;
    });
  }

  /** Resolves with the next FramebufferUpdate's stats, or null after `ms` without one. */
  #nextUpdate(ms: number, signal: AbortSignal | undefined): Promise<UpdateStats | null> {
    this.#check();
    return new Promise((resolve, reject) => {
      const waiter: Waiter = {
        resolve: (s) => done(() => resolve(s)),
        reject: (e) => done(() => reject(e)),
      };
      const timer = setTimeout(() => done(() => resolve(null)), ms);
      const onAbort = () => done(() => reject(signal!.reason));
      const done = (then: () => void) => {
        clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
        this.#waiters = this.#waiters.filter((w) => w !== waiter);
        then();
      };
      if (signal?.aborted) return onAbort();
      signal?.addEventListener("abort", onAbort, { once: true });
      this.#waiters.push(waiter);
    });
  }

  /**
   * Brings this client's copy of the screen up to date: asks for every
   * change (and the whole screen the first time) together with one pixel
   * in full, which the server must answer at once, and waits for the
   * update that holds that pixel. An update without it (one already on its
   * way, or a cursor-only update, which TigerVNC sends in answer to the
   * request) is followed by the request again. A scraping server (x11vnc)
   * sees changes only as often as it polls the screen.
   * @throws {RfbError} when the connection fails; a `TimeoutError` when the
   *   server does not answer within `timeout`
   */
  async refresh(options: RfbWaitOptions = {}): Promise<void> {
    const timeout = options.timeout ?? 10_000;
    const end = performance.now() + timeout;
    for (;;) {
      const { width, height } = this;
      const request = this.#haveFrame
        ? join([updateRequest(true, 0, 0, width, height), updateRequest(false, 0, 0, 1, 1)])
        : updateRequest(false, 0, 0, width, height);
      const left = end - performance.now();
      const next = left > 0 ? this.#nextUpdate(left, options.signal) : Promise.resolve(null);
      try {
        await this.#send(request);
      } catch (err) {
        next.catch(() => {});
        throw err;
      }
      const stats = await next;
      if (stats === null) {
        throw new DOMException(
          `The VNC server did not answer a framebuffer update request within ${timeout} ms`,
          "TimeoutError",
        );
      }
      if (stats.resized || stats.origin) break;
    }
    this.#haveFrame = true;
  }

  /**
   * The screen's pixels, after a {@linkcode RfbClient.refresh}.
   * @returns a copy of the pixels, RGBA
   */
  async frame(options: RfbWaitOptions = {}): Promise<RfbFrame> {
    await this.refresh(options);
    const fb = this.#state.fb;
    return { width: fb.width, height: fb.height, rgba: fb.rgba.slice() };
  }

  /**
   * A PNG of the screen, after a {@linkcode RfbClient.refresh}, scaled to
   * `width`×`height` when given.
   * @throws {RangeError} for a bad size
   */
  async screenshot(options: RfbScreenshotOptions = {}): Promise<Uint8Array> {
    const { width, height } = options;
    if ((width === undefined) !== (height === undefined)) {
      throw new TypeError("Cannot take screenshot: give both width and height, or neither");
    }
    if (
      width !== undefined &&
      !(Number.isInteger(width) && width > 0 && Number.isInteger(height) && height! > 0)
    ) {
      throw new RangeError(`Cannot take screenshot: invalid size ${width}x${height}`);
    }
    await this.refresh(options);
    const fb = this.#state.fb;
    const w = width ?? fb.width;
    const h = height ?? fb.height;
    return await encodePng(scaleRgba(fb.rgba, fb.width, fb.height, w, h), w, h);
  }

  /**
   * Waits until the screen has not changed for `quiet` ms (after a click,
   * for the application to draw), or `timeout` passes.
   * @returns whether the screen settled in time
   */
  async settle(options: RfbSettleOptions = {}): Promise<boolean> {
    const quiet = options.quiet ?? 300;
    const end = performance.now() + (options.timeout ?? 5_000);
    if (!this.#haveFrame) await this.refresh({ signal: options.signal });
    for (;;) {
      const left = end - performance.now();
      if (left <= 0) return false;
      const next = this.#nextUpdate(Math.min(quiet, left), options.signal);
      try {
        await this.#send(updateRequest(true, 0, 0, this.width, this.height));
      } catch (err) {
        next.catch(() => {});
        throw err;
      }
      const stats = await next;
      if (stats === null) {
        if (left >= quiet) return true;
        return false;
      }
    }
  }

  #checkPoint(p: RfbPoint, what: string): RfbPoint {
    const q = rounded(p, what);
    if (q.x < 0 || q.y < 0 || q.x >= this.width || q.y >= this.height) {
      throw new RangeError(
        `Cannot ${what}: (${q.x}, ${q.y}) is off the ${this.width}x${this.height} screen`,
      );
    }
    return q;
  }

  #pointerBytes(p: RfbPoint, buttons: number): Uint8Array {
    this.#pointer = p;
    this.#buttons = buttons;
    return pointerEvent(buttons, p.x, p.y);
  }

  /** Moves the pointer. @throws {RangeError} for a point off the screen */
  async move(point: RfbPoint): Promise<void> {
    const p = this.#checkPoint(point, "move the pointer");
    await this.#send(this.#pointerBytes(p, this.#buttons));
  }

  /**
   * Clicks at `point` (moves there first).
   * @throws {RangeError} for a point off the screen or a bad count
   */
  async click(point: RfbPoint, options: RfbClickOptions = {}): Promise<void> {
    const p = this.#checkPoint(point, "click");
    const bit = buttonBit(options.button);
    const count = options.count ?? 1;
    if (!Number.isInteger(count) || count < 1 || count > 10) {
      throw new RangeError(`Cannot click: invalid count "${count}" (1 to 10)`);
    }
    const parts = [this.#pointerBytes(p, this.#buttons)];
    for (let i = 0; i < count; i++) {
      parts.push(this.#pointerBytes(p, this.#buttons | bit));
      parts.push(this.#pointerBytes(p, this.#buttons & ~bit));
    }
    await this.#send(join(parts));
  }

  /** Clicks twice at `point`. */
  async doubleClick(point: RfbPoint, options: Omit<RfbClickOptions, "count"> = {}): Promise<void> {
    await this.click(point, { ...options, count: 2 });
  }

  /** Presses a button (at `point`, or where the pointer is) and keeps it down. */
  async mouseDown(point?: RfbPoint, options: { button?: RfbButton } = {}): Promise<void> {
    const p = point === undefined ? this.#pointer : this.#checkPoint(point, "press a button");
    await this.#send(this.#pointerBytes(p, this.#buttons | buttonBit(options.button)));
  }

  /** Releases a button (at `point`, or where the pointer is). */
  async mouseUp(point?: RfbPoint, options: { button?: RfbButton } = {}): Promise<void> {
    const p = point === undefined ? this.#pointer : this.#checkPoint(point, "release a button");
    await this.#send(this.#pointerBytes(p, this.#buttons & ~buttonBit(options.button)));
  }

  /**
   * Presses at `from`, moves to `to` in `steps`, and releases there.
   * @throws {RangeError} for a point off the screen
   */
  async drag(from: RfbPoint, to: RfbPoint, options: RfbDragOptions = {}): Promise<void> {
    const a = this.#checkPoint(from, "drag");
    const b = this.#checkPoint(to, "drag");
    const bit = buttonBit(options.button);
    const steps = options.steps ?? 10;
    if (!Number.isInteger(steps) || steps < 1 || steps > 1000) {
      throw new RangeError(`Cannot drag: invalid steps "${steps}" (1 to 1000)`);
    }
    const parts = [
      this.#pointerBytes(a, this.#buttons),
      this.#pointerBytes(a, this.#buttons | bit),
    ];
    for (let i = 1; i <= steps; i++) {
      const p = {
        x: Math.round(a.x + ((b.x - a.x) * i) / steps),
        y: Math.round(a.y + ((b.y - a.y) * i) / steps),
      };
      parts.push(this.#pointerBytes(p, this.#buttons));
    }
    parts.push(this.#pointerBytes(b, this.#buttons & ~bit));
    await this.#send(join(parts));
  }

  /**
   * Turns the wheel at `point`: `dy` clicks down (negative: up), `dx`
   * right (negative: left).
   * @throws {RangeError} for a point off the screen or more than 100 clicks
   */
  async scroll(point: RfbPoint, options: RfbScrollOptions = {}): Promise<void> {
    const p = this.#checkPoint(point, "scroll");
    const dy = Math.round(options.dy ?? 0);
    const dx = Math.round(options.dx ?? 0);
    if (!(Math.abs(dy) <= 100 && Math.abs(dx) <= 100)) {
      throw new RangeError(`Cannot scroll: ${dx}, ${dy} clicks is over the 100 allowed`);
    }
    const parts = [this.#pointerBytes(p, this.#buttons)];
    const turn = (bit: number, n: number) => {
      for (let i = 0; i < n; i++) {
        parts.push(this.#pointerBytes(p, this.#buttons | bit));
        parts.push(this.#pointerBytes(p, this.#buttons & ~bit));
      }
    };
    turn(dy > 0 ? WHEEL.down : WHEEL.up, Math.abs(dy));
    turn(dx > 0 ? WHEEL.right : WHEEL.left, Math.abs(dx));
    await this.#send(join(parts));
  }

  /**
   * Presses a key combination, xdotool style: `Return`, `ctrl+c`,
   * `alt+Tab`, `ctrl+shift+t`, `F5` (X keysym names; `ctrl`, `alt`,
   * `shift`, `super`, `enter`, `esc` and other short names too).
   * @throws {RangeError} for a name that is no key
   */
  async key(combo: string, options: RfbKeyOptions = {}): Promise<void> {
    const keys = comboKeysyms(combo);
    const hold = options.hold ?? 0;
    if (!(hold >= 0 && hold <= 60_000)) {
      throw new RangeError(`Cannot press key: invalid hold "${hold}" (0 to 60000 ms)`);
    }
    await this.#send(join(keys.map((k) => keyEvent(true, k))));
    if (hold > 0) await new Promise((resolve) => setTimeout(resolve, hold));
    await this.#send(join(keys.toReversed().map((k) => keyEvent(false, k))));
  }

  /** Presses the keys of a combination (as {@linkcode RfbClient.key} names them) and keeps them down. */
  async keyDown(combo: string): Promise<void> {
    await this.#send(join(comboKeysyms(combo).map((k) => keyEvent(true, k))));
  }

  /** Releases the keys of a combination, in reverse order. */
  async keyUp(combo: string): Promise<void> {
    await this.#send(join(comboKeysyms(combo).toReversed().map((k) => keyEvent(false, k))));
  }

  /**
   * Types `text`, one key press per character (`\n` is Return, `\t` Tab),
   * with Shift held for the characters a US keyboard shifts (capitals,
   * `!`, `?`...), as a person typing would: servers then need not fake a
   * modifier (TigerVNC would toggle Caps Lock).
   */
  async type(text: string): Promise<void> {
    if (typeof text !== "string") throw new TypeError("Cannot type: text must be a string");
    const shift = comboKeysyms("shift")[0];
    const parts: Uint8Array[] = [];
    for (const char of text) {
      const k = charKeysym(char);
      const shifted = SHIFTED.test(char);
      if (shifted) parts.push(keyEvent(true, shift));
      parts.push(keyEvent(true, k), keyEvent(false, k));
      if (shifted) parts.push(keyEvent(false, shift));
    }
    if (parts.length > 0) await this.#send(join(parts));
  }

  /** Puts `text` on the server's clipboard (ClientCutText; Latin-1, others become "?"). */
  async sendCutText(text: string): Promise<void> {
    if (typeof text !== "string") {
      throw new TypeError("Cannot send cut text: text must be a string");
    }
    await this.#send(clientCutText(text));
  }

  /** Closes the connection. Idempotent. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    this.#fail(closedError());
    await this.#loop;
    await this.#writing;
  }

  /** Closes the connection. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}

function closedError(): RfbError {
  return new RfbError("closed", "Cannot use the VNC connection: it is closed");
}

function buttonBit(button: RfbButton | undefined): number {
  const b = button ?? "left";
  if (!Object.hasOwn(BUTTON_BITS, b)) {
    throw new RangeError(`Cannot use mouse button "${b}" (use "left", "middle" or "right")`);
  }
  return BUTTON_BITS[b];
}

function join(parts: readonly Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let off = 0;
  for (const p of parts) {
    out.set(p, off);
    off += p.length;
  }
  return out;
}

/** Races `promise` against `signal`; `cleanup` disposes of a value that arrives too late. */
function raceSignal<T>(
  promise: Promise<T>,
  signal: AbortSignal,
  cleanup: (value: T) => void,
): Promise<T> {
  if (signal.aborted) {
    promise.then(cleanup, () => {});
    return Promise.reject(signal.reason);
  }
  return new Promise((resolve, reject) => {
    const onAbort = () => {
      promise.then(cleanup, () => {});
      reject(signal.reason);
    };
    signal.addEventListener("abort", onAbort, { once: true });
    promise.then((v) => {
      signal.removeEventListener("abort", onAbort);
      if (signal.aborted) cleanup(v);
      else resolve(v);
    }, (e) => {
      signal.removeEventListener("abort", onAbort);
      reject(e);
    });
  });
}
