// X keysyms (RFC 6143 §7.5.4 sends them as is), by their X11 names
// (keysymdef.h), with the short aliases that xdotool and models use
// ("ctrl", "enter", "pagedown"...). A character outside the names is its
// Latin-1 code or, beyond Latin-1, 0x01000000 plus its Unicode code point.

const NAMED: Record<string, number> = {
  BackSpace: 0xff08,
  Tab: 0xff09,
  Linefeed: 0xff0a,
  Clear: 0xff0b,
  Return: 0xff0d,
  Pause: 0xff13,
  Scroll_Lock: 0xff14,
  Sys_Req: 0xff15,
  Escape: 0xff1b,
  Delete: 0xffff,
  Home: 0xff50,
  Left: 0xff51,
  Up: 0xff52,
  Right: 0xff53,
  Down: 0xff54,
  Prior: 0xff55,
  Page_Up: 0xff55,
  Next: 0xff56,
  Page_Down: 0xff56,
  End: 0xff57,
  Begin: 0xff58,
  Select: 0xff60,
  Print: 0xff61,
  Execute: 0xff62,
  Insert: 0xff63,
  Undo: 0xff65,
  Redo: 0xff66,
  Menu: 0xff67,
  Find: 0xff68,
  Cancel: 0xff69,
  Help: 0xff6a,
  Break: 0xff6b,
  Num_Lock: 0xff7f,
  KP_Space: 0xff80,
  KP_Tab: 0xff89,
  KP_Enter: 0xff8d,
  KP_Home: 0xff95,
  KP_Left: 0xff96,
  KP_Up: 0xff97,
  KP_Right: 0xff98,
  KP_Down: 0xff99,
  KP_Prior: 0xff9a,
  KP_Page_Up: 0xff9a,
  KP_Next: 0xff9b,
  KP_Page_Down: 0xff9b,
  KP_End: 0xff9c,
  KP_Begin: 0xff9d,
  KP_Insert: 0xff9e,
  KP_Delete: 0xff9f,
  KP_Multiply: 0xffaa,
  KP_Add: 0xffab,
  KP_Separator: 0xffac,
  KP_Subtract: 0xffad,
  KP_Decimal: 0xffae,
  KP_Divide: 0xffaf,
  KP_Equal: 0xffbd,
  Shift_L: 0xffe1,
  Shift_R: 0xffe2,
  Control_L: 0xffe3,
  Control_R: 0xffe4,
  Caps_Lock: 0xffe5,
  Shift_Lock: 0xffe6,
  Meta_L: 0xffe7,
  Meta_R: 0xffe8,
  Alt_L: 0xffe9,
  Alt_R: 0xffea,
  Super_L: 0xffeb,
  Super_R: 0xffec,
  Hyper_L: 0xffed,
  Hyper_R: 0xffee,
  ISO_Level3_Shift: 0xfe03,
  ISO_Left_Tab: 0xfe20,
  space: 0x20,
  exclam: 0x21,
  quotedbl: 0x22,
  numbersign: 0x23,
  dollar: 0x24,
  percent: 0x25,
  ampersand: 0x26,
  apostrophe: 0x27,
  parenleft: 0x28,
  parenright: 0x29,
  asterisk: 0x2a,
  plus: 0x2b,
  comma: 0x2c,
  minus: 0x2d,
  period: 0x2e,
  slash: 0x2f,
  colon: 0x3a,
  semicolon: 0x3b,
  less: 0x3c,
  equal: 0x3d,
  greater: 0x3e,
  question: 0x3f,
  at: 0x40,
  bracketleft: 0x5b,
  backslash: 0x5c,
  bracketright: 0x5d,
  asciicircum: 0x5e,
  underscore: 0x5f,
  grave: 0x60,
  braceleft: 0x7b,
  bar: 0x7c,
  braceright: 0x7d,
  asciitilde: 0x7e,
};
for (let n = 1; n <= 35; n++) NAMED[`F${n}`] = 0xffbe + n - 1;
for (let n = 0; n <= 9; n++) NAMED[`KP_${n}`] = 0xffb0 + n;

/** Short names, matched without regard to case. */
const ALIASES: Record<string, string> = {
  ctrl: "Control_L",
  control: "Control_L",
  alt: "Alt_L",
  option: "Alt_L",
  shift: "Shift_L",
  super: "Super_L",
  win: "Super_L",
  windows: "Super_L",
  cmd: "Super_L",
  command: "Super_L",
  meta: "Meta_L",
  enter: "Return",
  esc: "Escape",
  del: "Delete",
  backspace: "BackSpace",
  pageup: "Prior",
  pgup: "Prior",
  pagedown: "Next",
  pgdn: "Next",
  arrowup: "Up",
  arrowdown: "Down",
  arrowleft: "Left",
  arrowright: "Right",
  capslock: "Caps_Lock",
  ins: "Insert",
};

const BY_LOWER_NAME = new Map(Object.keys(NAMED).map((k) => [k.toLowerCase(), NAMED[k]]));

/** The keysym of one character (`"a"`, `"é"`, `"€"`, `"\n"`). */
export function charKeysym(char: string): number {
  if (char === "\n" || char === "\r") return NAMED.Return;
  if (char === "\t") return NAMED.Tab;
  const code = char.codePointAt(0)!;
  if ((code >= 0x20 && code <= 0x7e) || (code >= 0xa0 && code <= 0xff)) return code;
  return 0x01000000 + code;
}

/**
 * The keysym a key name stands for: an X11 name (`Return`, `Page_Down`,
 * `KP_0`, `F5`, `a`), an alias (`ctrl`, `enter`, `esc`, `pagedown`, any
 * case), a single character, or a number (`0xff0d`).
 * @throws {RangeError} for a name that is none of these
 */
export function keysym(name: string): number {
  if (Object.hasOwn(NAMED, name)) return NAMED[name];
  if ([...name].length === 1) return charKeysym(name);
  const lower = name.toLowerCase();
  if (Object.hasOwn(ALIASES, lower)) return NAMED[ALIASES[lower]];
  const named = BY_LOWER_NAME.get(lower);
  if (named !== undefined) return named;
  if (/^0x[0-9a-f]{1,8}$/i.test(name)) return parseInt(name, 16);
  throw new RangeError(
    `Cannot press key "${name}": not a key name (use X11 keysym names such as "Return", "ctrl", "Page_Down", "F5", or one character)`,
  );
}

/**
 * The keysyms of a combination such as `ctrl+shift+t` or `alt+Tab`: the
 * keys pressed in order, released in reverse. A lone `+` is the plus key.
 * @throws {RangeError} for an empty combination or an unknown name
 */
export function comboKeysyms(combo: string): number[] {
  if (typeof combo !== "string" || combo.trim() === "") {
    throw new RangeError("Cannot press key: the combination is empty");
  }
  const trimmed = combo.trim();
  if (trimmed === "+") return [NAMED.plus];
  const parts = trimmed.split("+").map((p) => p.trim());
  // "ctrl++" ends with the plus key.
  if (trimmed.endsWith("++")) parts.splice(parts.length - 2, 2, "+");
  if (parts.some((p) => p === "")) {
    throw new RangeError(`Cannot press key "${combo}": an empty name between "+" signs`);
  }
  return parts.map(keysym);
}
