// The RFB handshake (RFC 6143 §7.1-§7.3): versions 3.3, 3.7 and 3.8, the
// security types None and VNC authentication, ClientInit and ServerInit.

import { vncAuthResponse } from "./_des.ts";
import { type ByteReader, decodePixelFormat, latin1, type PixelFormat, RfbError } from "./_wire.ts";

/** What the server said about itself. */
export interface ServerInit {
  /** The protocol version both sides use: "3.3", "3.7" or "3.8". */
  version: string;
  /** The framebuffer's width. */
  width: number;
  /** The framebuffer's height. */
  height: number;
  /** The server's pixel format (the client asks for its own next). */
  format: PixelFormat;
  /** The desktop's name. */
  name: string;
}

/** What the handshake needs from the caller. */
export interface HandshakeOptions {
  /** The VNC password, for servers that ask for one. */
  password?: string;
  /** Whether other clients may stay connected (ClientInit's shared flag). */
  shared: boolean;
}

/** The most bytes of a name or a reason string taken from the server. */
const MAX_STRING = 64 * 1024;

const SECURITY_NAMES: Readonly<Record<number, string>> = {
  1: "None",
  2: "VNC authentication",
  5: "RA2",
  6: "RA2ne",
  16: "Tight",
  17: "Ultra",
  18: "TLS",
  19: "VeNCrypt",
  20: "GTK-VNC SASL",
  21: "MD5 hash",
  22: "Colin Dean xvp",
  30: "Apple remote desktop",
  129: "Unix login",
};

const NONE = 1;
const VNC_AUTH = 2;

function printable(bytes: Uint8Array): string {
  return latin1(bytes).replace(/[^\x20-\x7e]/g, (c) => `\\x${c.charCodeAt(0).toString(16)}`);
}

/** A length-prefixed string from the server, within {@linkcode MAX_STRING}. */
async function readString(reader: ByteReader, what: string): Promise<string> {
  const n = await reader.u32();
  if (n > MAX_STRING) {
    throw new RfbError(
      "protocol",
      `Cannot connect to the VNC server: its ${what} is ${n} bytes, over the ${MAX_STRING} allowed`,
    );
  }
  return new TextDecoder().decode(await reader.bytes(n));
}

/** The version this client answers with, for the server's `major.minor`. */
function chooseVersion(major: number, minor: number): string {
  if (major > 3 || minor >= 8) return "3.8";
  if (minor === 7) return "3.7";
  return "3.3"; // 3.3, and 3.5 and others, which the RFC says to treat as 3.3
}

async function chooseSecurity(
  reader: ByteReader,
  write: (b: Uint8Array) => Promise<void>,
  version: string,
  password: string | undefined,
): Promise<number> {
  let offered: number[];
  if (version === "3.3") {
    const type = await reader.u32();
    offered = type === 0 ? [] : [type];
  } else {
    const n = await reader.u8();
    offered = [...await reader.bytes(n)];
  }
  if (offered.length === 0) {
    const reason = await readString(reader, "reason");
    throw new RfbError("security", `Cannot connect to the VNC server: it refused: ${reason}`);
  }
  const names = offered.map((t) => `${t} (${SECURITY_NAMES[t] ?? "unknown"})`).join(", ");
  let chosen: number;
  if (offered.includes(NONE)) chosen = NONE;
  else if (offered.includes(VNC_AUTH) && password !== undefined) chosen = VNC_AUTH;
  else if (offered.includes(VNC_AUTH)) {
    throw new RfbError(
      "auth",
      "Cannot connect to the VNC server: it asks for a VNC password and none was given (pass password, or the binding's password param)",
    );
  } else {
    throw new RfbError(
      "security",
      `Cannot connect to the VNC server: it offers the security types ${names}, none that this client speaks (1: None, 2: VNC authentication)`,
    );
  }
  if (version !== "3.3") await write(new Uint8Array([chosen]));
  return chosen;
}

/**
 * Runs the handshake on a fresh connection, up to and including ServerInit.
 * @throws {RfbError} "protocol" for a server that does not speak RFB,
 *   "security" when no security type fits, "auth" for a refused password
 */
export async function handshake(
  reader: ByteReader,
  write: (b: Uint8Array) => Promise<void>,
  options: HandshakeOptions,
): Promise<ServerInit> {
  const greeting = await reader.bytes(12);
  const m = /^RFB (\d{3})\.(\d{3})\n$/.exec(latin1(greeting));
  if (m === null) {
    throw new RfbError(
      "protocol",
      `Cannot connect to the VNC server: it does not speak RFB (it sent "${printable(greeting)}")`,
    );
  }
  const version = chooseVersion(Number(m[1]), Number(m[2]));
  await write(new TextEncoder().encode(`RFB 003.00${version.slice(2)}\n`));
  const security = await chooseSecurity(reader, write, version, options.password);
  if (security === VNC_AUTH) {
    const challenge = await reader.copy(16);
    await write(vncAuthResponse(options.password!, challenge));
  }
  // 3.8 always says how security went; 3.3 and 3.7 only after a password.
  if (version === "3.8" || security === VNC_AUTH) {
    const result = await reader.u32();
    if (result !== 0) {
      const reason = version === "3.8" ? `: ${await readString(reader, "reason")}` : "";
      throw new RfbError(
        "auth",
        `Cannot connect to the VNC server: it refused the ${
          security === VNC_AUTH ? "password" : "connection"
        }${reason}`,
      );
    }
  }
  await write(new Uint8Array([options.shared ? 1 : 0]));
  const width = await reader.u16();
  const height = await reader.u16();
  const format = decodePixelFormat(await reader.copy(16));
  const name = await readString(reader, "desktop name");
  return { version, width, height, format, name };
}
