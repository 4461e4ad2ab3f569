/**
 * Capabilities: the wire data that tells an agent where it reaches a shell,
 * a browser, a screen, a tool server, a robot or a file tracker.
 *
 * @module
 */

import { isRecord } from "./_internal/util.ts";

/** A capability as it travels in the `hello` manifest's `bindings`. */
export interface CapabilityManifest {
  /** Name agents and clients refer to it by, unique per environment. */
  name: string;
  /** Protocol and version, such as `ssh/2`. */
  protocol: string;
  /** Where the capability is served. */
  url: string;
  /** Protocol-specific data (wire names, snake_case). */
  params: Record<string, unknown>;
}

/** Fields for {@linkcode Capability}'s constructor. */
export interface CapabilityInit {
  /** Name, unique per environment. */
  name: string;
  /** Protocol and version, such as `ssh/2`. */
  protocol: string;
  /** Where the capability is served: `scheme://host:port/...` or `host:port`. */
  url: string;
  /**
   * Protocol-specific data, sent as is.
   * @default {}
   */
  params?: Record<string, unknown>;
}

/** Options for {@linkcode Capability.ssh}. */
export interface SshCapabilityOptions {
  /**
   * Capability name.
   * @default "shell"
   */
  name?: string;
  /** `ssh://host:port` or `host:port`; the port defaults to 22. */
  url: string;
  /**
   * Login user.
   * @default "agent"
   */
  user?: string;
  /** The server's host key, `ssh-ed25519 AAAA...`. */
  hostPublicKey: string;
  /**
   * Login shell.
   * @default "bash"
   */
  shell?: string;
  /** A private key (OpenSSH format) the agent may log in with. */
  clientKey?: string;
  /** Path of that private key on the agent's side. */
  clientKeyPath?: string;
  /** Working directory commands start in. */
  cwd?: string;
  /** How the shell is isolated, such as `"none"` or `"container"`. */
  isolation?: string;
}

/** Options for {@linkcode Capability.cdp}. */
export interface CdpCapabilityOptions {
  /**
   * Capability name.
   * @default "browser"
   */
  name?: string;
  /** `ws://host:port/...`; the port defaults to 9222. */
  url: string;
  /** The DevTools target to attach to. */
  targetId?: string;
}

/** Options for {@linkcode Capability.rfb}. */
export interface RfbCapabilityOptions {
  /**
   * Capability name.
   * @default "screen"
   */
  name?: string;
  /** `rfb://host:port`; the port defaults to 5900 + `display`. */
  url: string;
  /**
   * X display number.
   * @default 0
   */
  display?: number;
  /** VNC password. */
  password?: string;
}

/** Options for {@linkcode Capability.mcp}. */
export interface McpCapabilityOptions {
  /**
   * Capability name.
   * @default "tools"
   */
  name?: string;
  /** A `ws`, `wss`, `http` or `https` url; the port defaults to 80 (443 for TLS). */
  url: string;
  /**
   * `websocket` for ws/wss urls; `streamable-http` (or `sse`) otherwise.
   * @default "websocket" for ws/wss, "streamable-http" for http/https
   */
  transport?: "websocket" | "streamable-http" | "sse";
  /** Bearer token for the tool server. */
  authToken?: string;
}

/** Options for {@linkcode Capability.openpi}. */
export interface OpenpiCapabilityOptions {
  /**
   * Capability name.
   * @default "robot"
   */
  name?: string;
  /** `ws://host:port`; the port defaults to 9091. */
  url: string;
  /** The robot's action and observation contract. */
  contract?: unknown;
}

/** Options for {@linkcode Capability.filetracking}. */
export interface FiletrackingCapabilityOptions {
  /**
   * Capability name.
   * @default "filetracking"
   */
  name?: string;
  /** `tcp://host:port`; a port is required. */
  url: string;
  /** The tracked directory. */
  root: string;
  /**
   * Whether the tracker reports what the task's setup changed.
   * @default true
   */
  setupDiff?: boolean;
}

/** Splits `scheme://rest` or a bare `host:port`. */
function splitScheme(url: string): { scheme: string | null; rest: string } {
  const m = /^([a-zA-Z][a-zA-Z0-9+.-]*):\/\/(.*)$/s.exec(url);
  return m ? { scheme: m[1].toLowerCase(), rest: m[2] } : { scheme: null, rest: url };
}

/**
 * Adds the default scheme and port to a capability url:
 * `127.0.0.1:22` and `ssh://127.0.0.1` both become `ssh://127.0.0.1:22`.
 */
function normaliseUrl(
  what: string,
  url: string,
  defaultScheme: string,
  defaultPort: (scheme: string) => number | null,
): string {
  if (typeof url !== "string" || url.trim() === "") {
    throw new TypeError(`Cannot create ${what} capability: url must be a non-empty string`);
  }
  const split = splitScheme(url.trim());
  const scheme = split.scheme ?? defaultScheme;
  const parsed = parseHostPort(`${scheme}://${split.rest}`);
  if (parsed === null) {
    throw new TypeError(`Cannot create ${what} capability: invalid url "${url}"`);
  }
  if (parsed.port !== null) return `${scheme}://${split.rest}`;
  const port = defaultPort(scheme);
  if (port === null) {
    throw new TypeError(`Cannot create ${what} capability: url "${url}" has no port`);
  }
  // Insert the port right after the authority.
  const m = /^([^/?#]*)(.*)$/s.exec(split.rest)!;
  return `${scheme}://${m[1]}:${port}${m[2]}`;
}

/** Host and port of a url, or `null` when it has no host. */
export function parseHostPort(url: string): { hostname: string; port: number | null } | null {
  const split = splitScheme(url);
  const authority = /^([^/?#]*)/.exec(split.rest)![1];
  const hostPort = authority.slice(authority.lastIndexOf("@") + 1);
  let hostname: string;
  let portText: string | undefined;
  if (hostPort.startsWith("[")) {
    const end = hostPort.indexOf("]");
    if (end < 0) return null;
    hostname = hostPort.slice(1, end);
    const after = hostPort.slice(end + 1);
    if (after !== "" && !after.startsWith(":")) return null;
    portText = after === "" ? undefined : after.slice(1);
  } else {
    const colon = hostPort.lastIndexOf(":");
    hostname = colon < 0 ? hostPort : hostPort.slice(0, colon);
    portText = colon < 0 ? undefined : hostPort.slice(colon + 1);
  }
  if (hostname === "") return null;
  if (portText === undefined || portText === "") return { hostname, port: null };
  if (!/^\d+$/.test(portText)) return null;
  const port = Number(portText);
  if (port > 65535) return null;
  return { hostname, port };
}

function dropUndefined(params: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(params)) if (v !== undefined) out[k] = v;
  return out;
}

/**
 * A published capability: a name, a protocol, a url and protocol params.
 * Immutable; the factories fill in defaults and normalise urls the way the
 * HUD SDK does.
 *
 * @example Publish a shell
 * ```ts
 * import { Capability } from "./mod.ts";
 * import assert from "node:assert/strict";
 *
 * const shell = Capability.ssh({ url: "127.0.0.1:2222", hostPublicKey: "ssh-ed25519 AAAA" });
 * assert.equal(shell.url, "ssh://127.0.0.1:2222");
 * assert.equal(shell.params.user, "agent");
 * ```
 */
export class Capability {
  readonly #name: string;
  readonly #protocol: string;
  readonly #url: string;
  readonly #params: Readonly<Record<string, unknown>>;

  /**
   * Creates a capability from its wire fields.
   * @throws {TypeError} when a field has the wrong type or is empty
   */
  constructor(init: CapabilityInit) {
    if (!isRecord(init)) throw new TypeError("Cannot create capability: expected an object");
    for (const key of ["name", "protocol", "url"] as const) {
      if (typeof init[key] !== "string" || init[key] === "") {
        throw new TypeError(`Cannot create capability: "${key}" must be a non-empty string`);
      }
    }
    if (init.params !== undefined && !isRecord(init.params)) {
      throw new TypeError(`Cannot create capability "${init.name}": "params" must be an object`);
    }
    this.#name = init.name;
    this.#protocol = init.protocol;
    this.#url = init.url;
    this.#params = Object.freeze({ ...(init.params ?? {}) });
  }

  /** Name agents and clients refer to it by. */
  get name(): string {
    return this.#name;
  }
  /** Protocol and version, such as `ssh/2`. */
  get protocol(): string {
    return this.#protocol;
  }
  /** The protocol family: `ssh` for `ssh/2`. */
  get family(): string {
    return this.#protocol.split("/")[0];
  }
  /** Where the capability is served. */
  get url(): string {
    return this.#url;
  }
  /** Protocol-specific data, with wire (snake_case) keys. */
  get params(): Readonly<Record<string, unknown>> {
    return this.#params;
  }

  /** The same capability at another url. */
  withUrl(url: string): Capability {
    return new Capability({
      name: this.#name,
      protocol: this.#protocol,
      url,
      params: this.#params,
    });
  }

  /** The wire form, as sent in `bindings`. */
  toManifest(): CapabilityManifest {
    return {
      name: this.#name,
      protocol: this.#protocol,
      url: this.#url,
      params: { ...this.#params },
    };
  }

  /** JSON form is the wire form. */
  toJSON(): CapabilityManifest {
    return this.toManifest();
  }

  /**
   * Reads a capability from its wire form.
   * @throws {TypeError} when the value is not a capability
   */
  static fromManifest(value: unknown): Capability {
    if (!isRecord(value)) throw new TypeError("Cannot read capability: expected an object");
    return new Capability({
      name: value.name as string,
      protocol: value.protocol as string,
      url: value.url as string,
      params: (value.params ?? {}) as Record<string, unknown>,
    });
  }

  /** An SSH shell (`ssh/2`). */
  static ssh(options: SshCapabilityOptions): Capability {
    if (typeof options?.hostPublicKey !== "string" || options.hostPublicKey === "") {
      throw new TypeError("Cannot create ssh capability: hostPublicKey must be a non-empty string");
    }
    return new Capability({
      name: options.name ?? "shell",
      protocol: "ssh/2",
      url: normaliseUrl("ssh", options.url, "ssh", () => 22),
      params: dropUndefined({
        user: options.user ?? "agent",
        host_pubkey: options.hostPublicKey,
        shell: options.shell ?? "bash",
        client_key: options.clientKey,
        client_key_path: options.clientKeyPath,
        cwd: options.cwd,
        isolation: options.isolation,
      }),
    });
  }

  /** A browser over the Chrome DevTools Protocol (`cdp/1.3`). */
  static cdp(options: CdpCapabilityOptions): Capability {
    return new Capability({
      name: options.name ?? "browser",
      protocol: "cdp/1.3",
      url: normaliseUrl("cdp", options.url, "ws", () => 9222),
      params: dropUndefined({ target_id: options.targetId }),
    });
  }

  /** A screen over VNC (`rfb/3.8`). */
  static rfb(options: RfbCapabilityOptions): Capability {
    const display = options.display ?? 0;
    if (!Number.isInteger(display) || display < 0) {
      throw new RangeError(`Cannot create rfb capability: invalid display "${display}"`);
    }
    return new Capability({
      name: options.name ?? "screen",
      protocol: "rfb/3.8",
      url: normaliseUrl("rfb", options.url, "rfb", () => 5900 + display),
      params: dropUndefined({ display, password: options.password }),
    });
  }

  /** A tool server speaking the Model Context Protocol (`mcp/2025-11-25`). */
  static mcp(options: McpCapabilityOptions): Capability {
    const url = normaliseUrl(
      "mcp",
      options.url,
      "ws",
      (scheme) => scheme === "https" || scheme === "wss" ? 443 : 80,
    );
    const scheme = splitScheme(url).scheme!;
    if (!["ws", "wss", "http", "https"].includes(scheme)) {
      throw new TypeError(
        `Cannot create mcp capability: url scheme must be ws, wss, http or https, got "${scheme}"`,
      );
    }
    const socket = scheme === "ws" || scheme === "wss";
    const transport = options.transport ?? (socket ? "websocket" : "streamable-http");
    if (socket !== (transport === "websocket")) {
      throw new TypeError(
        `Cannot create mcp capability: transport "${transport}" does not fit a ${scheme} url`,
      );
    }
    return new Capability({
      name: options.name ?? "tools",
      protocol: "mcp/2025-11-25",
      url,
      params: dropUndefined({ transport, auth_token: options.authToken }),
    });
  }

  /** A robot policy endpoint (`openpi/0`). */
  static openpi(options: OpenpiCapabilityOptions): Capability {
    return new Capability({
      name: options.name ?? "robot",
      protocol: "openpi/0",
      url: normaliseUrl("openpi", options.url, "ws", () => 9091),
      params: dropUndefined({ contract: options.contract }),
    });
  }

  /** A workspace file tracker (`filetracking/1`). */
  static filetracking(options: FiletrackingCapabilityOptions): Capability {
    if (typeof options?.root !== "string" || options.root === "") {
      throw new TypeError("Cannot create filetracking capability: root must be a non-empty string");
    }
    return new Capability({
      name: options.name ?? "filetracking",
      protocol: "filetracking/1",
      url: normaliseUrl("filetracking", options.url, "tcp", () => null),
      params: { root: options.root, setup_diff: options.setupDiff ?? true },
    });
  }
}
