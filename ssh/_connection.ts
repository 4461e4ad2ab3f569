// The client side of one SSH connection: transport, public-key login, channels.

import { ChannelMux } from "./_channel.ts";
import { SshAuthError, SshError, SshHostKeyError } from "./_errors.ts";
import { ED25519, type Ed25519Signer, formatPublicKey, parsePublicBlob } from "./_keys.ts";
import { MSG, SshTransport } from "./_transport.ts";
import { bytesEqual, SshWriter } from "./_wire.ts";

/** What a connection needs from the client options. */
export interface ConnectionOptions {
  hostPublicKey: string;
  ciphers?: readonly string[];
  macs?: readonly string[];
  rekeyLimit?: number;
}

/** One authenticated connection. */
export class ClientConnection {
  readonly transport: SshTransport;
  readonly mux: ChannelMux;
  #authQueue: Uint8Array[] = [];
  #authWaiter: (() => void) | null = null;
  #authed = false;

  constructor(conn: Deno.Conn, options: ConnectionOptions, hostBlob: Uint8Array) {
    this.transport = new SshTransport(conn, {
      role: "client",
      checkHostKey: (blob) => {
        if (!bytesEqual(blob, hostBlob)) {
          throw new SshHostKeyError(
            `Cannot connect: host key "${
              formatPublicKey(parsePublicBlob(blob))
            }" is not the expected "${options.hostPublicKey.trim()}"`,
          );
        }
      },
      onPacket: (p) => this.#onPacket(p),
      ciphers: options.ciphers,
      macs: options.macs,
      rekeyBytes: options.rekeyLimit,
    });
    this.mux = new ChannelMux(this.transport, null);
    this.transport.closed.then((err) => {
      this.mux.abortAll(err ?? new SshError("Cannot continue: connection closed"));
      this.#authWaiter?.();
    });
  }

  async #onPacket(payload: Uint8Array): Promise<void> {
    if (!this.#authed) {
      this.#authQueue.push(payload);
      const w = this.#authWaiter;
      this.#authWaiter = null;
      w?.();
      return;
    }
    if (await this.mux.handle(payload)) return;
    throw new SshError(`Cannot continue: unexpected message "${payload[0]}"`, { reason: 2 });
  }

  async #next(): Promise<Uint8Array> {
    while (true) {
      const p = this.#authQueue.shift();
      if (p !== undefined) {
        if (p[0] === MSG.USERAUTH_BANNER) continue;
        return p;
      }
      if (this.transport.isClosed) {
        const err = await this.transport.closed;
        throw err instanceof SshError ? err : new SshError("Cannot log in: connection closed", {
          cause: err ?? undefined,
        });
      }
      await new Promise<void>((resolve) => this.#authWaiter = resolve);
    }
  }

  async login(user: string, signer: Ed25519Signer): Promise<void> {
    await this.transport.handshake();
    this.transport.post(new SshWriter(32).byte(MSG.SERVICE_REQUEST).string("ssh-userauth").bytes());
    const accept = await this.#next();
    if (accept[0] !== MSG.SERVICE_ACCEPT) {
      throw new SshError(`Cannot log in: unexpected message "${accept[0]}"`, { reason: 2 });
    }
    const signed = new SshWriter(256).string(this.transport.sessionId).byte(MSG.USERAUTH_REQUEST)
      .string(user).string("ssh-connection").string("publickey").boolean(true).string(ED25519)
      .string(signer.blob).bytes().slice();
    const sig = await signer.sign(signed);
    const req = new SshWriter(256).raw(signed.subarray(4 + this.transport.sessionId.length))
      .string(sig).bytes().slice();
    this.transport.post(req);
    const reply = await this.#next();
    if (reply[0] === MSG.USERAUTH_SUCCESS) {
      this.#authed = true;
      // Anything that came after success belongs to the connection layer.
      for (const p of this.#authQueue.splice(0)) await this.#onPacket(p);
      return;
    }
    if (reply[0] === MSG.USERAUTH_FAILURE) {
      throw new SshAuthError(`Cannot log in: server refused key for user "${user}"`);
    }
    throw new SshError(`Cannot log in: unexpected message "${reply[0]}"`, { reason: 2 });
  }
}
