/**
 * The `computer` tool: a desktop (an `rfb` binding) for a model, in the
 * shape computer-use models are trained on. Anthropic models get their own
 * tool type (`computer_20250124`, sent as is, with its beta header);
 * OpenAI-compatible ones a function tool with the same actions and
 * arguments, as open computer-use models (Qwen2.5-VL, UI-TARS) take them.
 * Every action but `cursor_position` answers with a screenshot after the
 * screen settles, as an image the model sees; coordinates are in the
 * model's screen size, scaled to and from the desktop's.
 *
 * @module
 */

import type { RfbClient, RfbPoint } from "../rfb/client.ts";
import type { Run } from "../eval/run.ts";
import { delay } from "../_internal/async.ts";
import type { AgentTool } from "./tools.ts";

/** An image a tool returns, for the model to see. */
export interface ToolImage {
  /** Its media type, such as `image/png`. */
  mediaType: string;
  /** Its bytes. */
  data: Uint8Array;
}

/**
 * A tool result with images: {@linkcode ChatAgent} gives the model the text
 * and the pictures (an image block in Anthropic's `tool_result`; a user
 * message with an image part after the tool results for OpenAI-compatible
 * APIs, whose tool messages hold text only), and keeps the pictures as
 * files of the trace.
 */
export class ImageResult {
  /** The text part. */
  readonly text: string;
  /** The pictures. */
  readonly images: readonly ToolImage[];

  /** Makes a result of `text` and `images`. */
  constructor(text: string, images: readonly ToolImage[]) {
    this.text = text;
    this.images = images;
  }
}

/** Options for {@linkcode computerTool}. */
export interface ComputerToolOptions {
  /**
   * The screen width the model works at: screenshots are scaled to it and
   * its coordinates back (models are trained on about 1280x800 and smaller;
   * Anthropic's API shrinks larger pictures on its own).
   * @default the desktop's width, scaled down with the height to fit 1280x800
   */
  width?: number;
  /** The screen height the model works at; see `width`. */
  height?: number;
  /**
   * How long the screen must stay unchanged before the screenshot after an
   * action, in ms.
   * @default 300
   */
  settleQuiet?: number;
  /**
   * The longest to wait for that, in ms.
   * @default 3_000
   */
  settleTimeout?: number;
}

/** The actions of Anthropic's `computer_20250124` tool, which the function tool takes too. */
export const COMPUTER_ACTIONS = [
  "screenshot",
  "cursor_position",
  "mouse_move",
  "left_click",
  "right_click",
  "middle_click",
  "double_click",
  "triple_click",
  "left_click_drag",
  "left_mouse_down",
  "left_mouse_up",
  "scroll",
  "key",
  "hold_key",
  "type",
  "wait",
] as const;

/** One of {@linkcode COMPUTER_ACTIONS}. */
export type ComputerAction = typeof COMPUTER_ACTIONS[number];

/** The Anthropic tool type this module speaks, and the beta header it needs. */
const ANTHROPIC_TYPE = "computer_20250124";
const ANTHROPIC_BETA = "computer-use-2025-01-24";

/** The longest `wait` and `hold_key`, in seconds. */
const MAX_SECONDS = 10;

/**
 * The most characters `text` may hold: a model's reply may be tens of MiB,
 * and each character typed is four key events held in memory and sent.
 */
const MAX_TEXT = 10_000;

/** The model's screen size: `options`' or the desktop's, shrunk to fit 1280x800. */
export function modelScreen(
  desktop: { width: number; height: number },
  options: ComputerToolOptions = {},
): { width: number; height: number } {
  if ((options.width === undefined) !== (options.height === undefined)) {
    throw new TypeError("Cannot make computer tool: give both width and height, or neither");
  }
  if (options.width !== undefined) {
    for (const v of [options.width, options.height!]) {
      if (!Number.isInteger(v) || v < 64 || v > 8192) {
        throw new RangeError(
          `Cannot make computer tool: invalid screen size "${options.width}x${options.height}"`,
        );
      }
    }
    return { width: options.width, height: options.height! };
  }
  const scale = Math.min(1, 1280 / desktop.width, 800 / desktop.height);
  return {
    width: Math.round(desktop.width * scale),
    height: Math.round(desktop.height * scale),
  };
}

function parameters(width: number, height: number) {
  const point = (what: string) => ({
    type: "array",
    items: { type: "integer" },
    minItems: 2,
    maxItems: 2,
    description: `${what}: [x, y] in pixels of the ${width}x${height} screen, from the top left`,
  });
  return {
    type: "object",
    properties: {
      action: {
        type: "string",
        enum: [...COMPUTER_ACTIONS],
        description:
          "What to do. Every action but cursor_position answers with a screenshot taken after it.",
      },
      coordinate: point(
        "Where to move, click or scroll (clicks without it act where the pointer is)",
      ),
      start_coordinate: point("Where left_click_drag starts (default: where the pointer is)"),
      text: {
        type: "string",
        maxLength: MAX_TEXT,
        description:
          'For type: the text. For key and hold_key: keys in xdotool\'s syntax ("Return", "ctrl+c", "alt+Tab"; several separated by spaces). For clicks and scroll: modifier keys to hold ("shift", "ctrl").',
      },
      scroll_direction: { type: "string", enum: ["up", "down", "left", "right"] },
      scroll_amount: {
        type: "integer",
        minimum: 1,
        maximum: 100,
        description: "Wheel clicks (default 3)",
      },
      duration: {
        type: "number",
        minimum: 0,
        maximum: MAX_SECONDS,
        description: "Seconds, for wait and hold_key",
      },
    },
    required: ["action"],
    additionalProperties: false,
  };
}

/** What an action works with: the desktop, the model's screen, the call's arguments. */
interface Action {
  vnc: RfbClient;
  model: { width: number; height: number };
  args: Record<string, unknown>;
  signal: AbortSignal;
}

/** A model's `[x, y]` as a desktop point, pixel centre to pixel centre. */
function toDesktop(a: Action, c: unknown, what: string): RfbPoint {
  if (
    !Array.isArray(c) || c.length !== 2 ||
    !c.every((v) => typeof v === "number" && Number.isFinite(v))
  ) {
    throw new TypeError(`${what} must be [x, y], two numbers`);
  }
  const [x, y] = c as number[];
  const { model, vnc } = a;
  if (x < 0 || y < 0 || x >= model.width || y >= model.height) {
    throw new RangeError(`${what} [${x}, ${y}] is off the ${model.width}x${model.height} screen`);
  }
  return {
    x: Math.min(vnc.width - 1, Math.floor(((x + 0.5) * vnc.width) / model.width)),
    y: Math.min(vnc.height - 1, Math.floor(((y + 0.5) * vnc.height) / model.height)),
  };
}

/** `coordinate` as a desktop point, or where the pointer is. */
function at(a: Action): RfbPoint {
  return a.args.coordinate === undefined
    ? a.vnc.pointer
    : toDesktop(a, a.args.coordinate, "coordinate");
}

function needs(a: Action, key: string): unknown {
  const value = a.args[key];
  if (value === undefined || value === "") throw new TypeError(`${a.args.action} needs ${key}`);
  return value;
}

/** `text`, a string of at most {@linkcode MAX_TEXT} characters. */
function text(a: Action): string {
  const value = String(needs(a, "text"));
  if (value.length > MAX_TEXT) {
    throw new RangeError(`text is ${value.length} characters; at most ${MAX_TEXT}`);
  }
  return value;
}

function seconds(d: unknown, fallback: number): number {
  const s = d === undefined ? fallback : Number(d);
  if (!(s >= 0 && s <= MAX_SECONDS)) {
    throw new RangeError(`duration must be 0 to ${MAX_SECONDS} seconds, got "${d}"`);
  }
  return s;
}

/** Runs `act` with the modifiers of `text` ("shift", "ctrl+alt") held. */
async function withModifiers(a: Action, act: () => Promise<void>): Promise<void> {
  const held = typeof a.args.text === "string" && a.args.text.trim() !== "" ? text(a).trim() : null;
  if (held !== null) await a.vnc.keyDown(held);
  try {
    await act();
  } finally {
    if (held !== null) await a.vnc.keyUp(held);
  }
}

function scroll(a: Action): Promise<void> {
  const direction = String(a.args.scroll_direction ?? "down");
  if (!["up", "down", "left", "right"].includes(direction)) {
    throw new TypeError(`scroll_direction must be up, down, left or right, got "${direction}"`);
  }
  const amount = a.args.scroll_amount === undefined ? 3 : Number(a.args.scroll_amount);
  if (!Number.isInteger(amount) || amount < 1 || amount > 100) {
    throw new RangeError(`scroll_amount must be 1 to 100, got "${a.args.scroll_amount}"`);
  }
  const point = at(a);
  const sign = direction === "up" || direction === "left" ? -1 : 1;
  const delta = direction === "up" || direction === "down"
    ? { dy: sign * amount }
    : { dx: sign * amount };
  return withModifiers(a, () => a.vnc.scroll(point, delta));
}

const CLICKS: Readonly<Record<string, { button: "left" | "right" | "middle"; count: number }>> = {
  left_click: { button: "left", count: 1 },
  right_click: { button: "right", count: 1 },
  middle_click: { button: "middle", count: 1 },
  double_click: { button: "left", count: 2 },
  triple_click: { button: "left", count: 3 },
};

/** Every action but the two that take no screenshot after them. */
const ACTIONS: Readonly<Record<string, (a: Action) => Promise<void>>> = {
  mouse_move: (a) => a.vnc.move(toDesktop(a, needs(a, "coordinate"), "coordinate")),
  ...Object.fromEntries(
    Object.entries(CLICKS).map(([name, click]) => [
      name,
      (a: Action) => {
        const point = at(a);
        return withModifiers(a, () => a.vnc.click(point, click));
      },
    ]),
  ),
  left_click_drag: (a) => {
    const to = toDesktop(a, needs(a, "coordinate"), "coordinate");
    const from = a.args.start_coordinate === undefined
      ? a.vnc.pointer
      : toDesktop(a, a.args.start_coordinate, "start_coordinate");
    return a.vnc.drag(from, to);
  },
  left_mouse_down: (a) => a.vnc.mouseDown(a.args.coordinate === undefined ? undefined : at(a)),
  left_mouse_up: (a) => a.vnc.mouseUp(a.args.coordinate === undefined ? undefined : at(a)),
  scroll,
  key: async (a) => {
    for (const combo of text(a).trim().split(/\s+/)) await a.vnc.key(combo);
  },
  hold_key: (a) => a.vnc.key(text(a).trim(), { hold: seconds(a.args.duration, 1) * 1000 }),
  type: (a) => a.vnc.type(text(a)),
  wait: (a) => delay(seconds(a.args.duration, 1) * 1000, a.signal),
};

/**
 * The `computer` tool over a connected {@linkcode RfbClient}.
 *
 * @example
 * ```ts ignore
 * import { computerTool } from "@hud/sdk/agents";
 * await using vnc = await run.client.open("rfb");
 * const tool = computerTool(vnc); // ChatAgent adds it for an rfb binding on its own
 * ```
 * @param vnc the desktop
 * @param options the model's screen size, how long to let the screen settle
 * @returns the tool, with its Anthropic definition
 * @throws {TypeError} for a half-given screen size
 * @throws {RangeError} for a screen size out of range
 */
export function computerTool(vnc: RfbClient, options: ComputerToolOptions = {}): AgentTool {
  const model = modelScreen(vnc, options);
  const quiet = options.settleQuiet ?? 300;
  const settleTimeout = options.settleTimeout ?? 3_000;
  const screenshot = async (signal: AbortSignal): Promise<ImageResult> => {
    await vnc.settle({ quiet, timeout: settleTimeout, signal });
    const same = model.width === vnc.width && model.height === vnc.height;
    const png = await vnc.screenshot(same ? { signal } : { ...model, signal });
    return new ImageResult("", [{ mediaType: "image/png", data: png }]);
  };
  return {
    name: "computer",
    description:
      `Use the computer's ${model.width}x${model.height} screen with the mouse and keyboard, and see it. ` +
      "Start with a screenshot; every action answers with a screenshot taken after it.",
    parameters: parameters(model.width, model.height),
    anthropic: {
      definition: {
        type: ANTHROPIC_TYPE,
        name: "computer",
        display_width_px: model.width,
        display_height_px: model.height,
      },
      beta: ANTHROPIC_BETA,
    },
    async call(args, { signal }) {
      const action = String(args.action);
      if (action === "cursor_position") {
        const p = vnc.pointer;
        const x = Math.floor(((p.x + 0.5) * model.width) / vnc.width);
        const y = Math.floor(((p.y + 0.5) * model.height) / vnc.height);
        return `X=${x},Y=${y}`;
      }
      if (action !== "screenshot") {
        if (!Object.hasOwn(ACTIONS, action)) {
          throw new TypeError(
            `unknown action "${args.action}"; use one of ${COMPUTER_ACTIONS.join(", ")}`,
          );
        }
        await ACTIONS[action]({ vnc, model, args, signal });
      }
      return await screenshot(signal);
    },
  };
}

/**
 * The computer tool for the run's first `rfb` binding, opened through the
 * run's client, with that client (the caller closes it); null when the run
 * has no desktop.
 */
export async function openComputerTool(
  run: Run,
  options: ComputerToolOptions | undefined,
  signal: AbortSignal,
): Promise<{ tool: AgentTool; vnc: RfbClient } | null> {
  const screen = run.capabilities.find((c) => c.family === "rfb");
  if (screen === undefined) return null;
  const vnc = await run.client.open(screen.name, { signal }) as RfbClient;
  try {
    return { tool: computerTool(vnc, options), vnc };
  } catch (err) {
    await vnc.close();
    throw err;
  }
}
