// Python's `json.dumps(value, sort_keys=True)`, byte for byte, so that task
// slugs match the HUD SDK's.

/** Formats a number the way Python's json module does. */
function pyNumber(n: number): string {
  if (Number.isNaN(n)) return "NaN";
  if (n === Infinity) return "Infinity";
  if (n === -Infinity) return "-Infinity";
  // JSON has one number type; an integral value is a Python int on the other side.
  if (Number.isInteger(n)) return BigInt(n).toString();
  // Python's float repr: shortest round-trip digits, scientific notation
  // when the exponent is below -4 or at least 16.
  const [mantissa, expText] = Math.abs(n).toExponential().split("e");
  const exp = Number(expText);
  const digits = mantissa.replace(".", "");
  const sign = n < 0 ? "-" : "";
  if (exp < -4 || exp >= 16) {
    const frac = digits.length > 1 ? "." + digits.slice(1) : "";
    return `${sign}${digits[0]}${frac}e${exp < 0 ? "-" : "+"}${
      String(Math.abs(exp)).padStart(2, "0")
    }`;
  }
  if (exp < 0) return `${sign}0.${"0".repeat(-exp - 1)}${digits}`;
  const int = digits.slice(0, exp + 1).padEnd(exp + 1, "0");
  const frac = digits.slice(exp + 1);
  return `${sign}${int}.${frac === "" ? "0" : frac}`;
}

function pyString(s: string): string {
  let out = '"';
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c === 0x22) out += '\\"';
    else if (c === 0x5c) out += "\\\\";
    else if (c === 0x0a) out += "\\n";
    else if (c === 0x0d) out += "\\r";
    else if (c === 0x09) out += "\\t";
    else if (c === 0x08) out += "\\b";
    else if (c === 0x0c) out += "\\f";
    else if (c < 0x20 || c > 0x7e) out += "\\u" + c.toString(16).padStart(4, "0");
    else out += s[i];
  }
  return out + '"';
}

/** `json.dumps(value, sort_keys=True)` with Python's default separators. */
export function pyJson(value: unknown): string {
  if (value === null || value === undefined) return "null";
  if (typeof value === "boolean") return value ? "true" : "false";
  if (typeof value === "number") return pyNumber(value);
  // An integer kept exact (beyond ±(2^53−1)): a Python int, digit for digit.
  if (typeof value === "bigint") return value.toString();
  if (typeof value === "string") return pyString(value);
  if (Array.isArray(value)) return "[" + value.map(pyJson).join(", ") + "]";
  if (typeof value === "object") {
    const keys = Object.keys(value as object).sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
    const obj = value as Record<string, unknown>;
    return "{" + keys.map((k) => pyString(k) + ": " + pyJson(obj[k])).join(", ") + "}";
  }
  throw new TypeError(`Cannot serialise argument: unsupported type "${typeof value}"`);
}
