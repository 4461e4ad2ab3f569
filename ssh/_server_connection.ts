/**
 * One connection to the SSH server (`server.ts`): the transport, the
 * `ssh-userauth` service (public-key logins against the authorised keys),
 * then session channels (`_session.ts`).
 *
 * @module
 */

import { isPeerGone } from "../_internal/io.ts";
import { ChannelMux } from "./_channel.ts";
import { DISCONNECT, SshError } from "./_errors.ts";
import { ED25519, type Ed25519Signer as Signer, verifyEd25519 } from "./_keys.ts";
import { MSG, SshTransport } from "./_transport.ts";
import { bytesEqual, SshReader, SshWriter } from "./_wire.ts";
import { type ServerConfig, Session } from "./_session.ts";

/** One client connection: authentication, then channels. */
export class ServerConnection {
  readonly transport: SshTransport;
  readonly #config: ServerConfig;
  readonly #mux: ChannelMux;
  readonly #sessions = new Set<Session>();
  #service = false;
  #authed = false;
  #failures = 0;
  #authedResolve!: () => void;
  readonly authed: Promise<void> = new Promise((resolve) => this.#authedResolve = resolve);

  constructor(conn: Deno.Conn, hostKey: Promise<Signer>, config: ServerConfig) {
    this.#config = config;
    this.transport = new SshTransport(conn, {
      role: "server",
      hostKey,
      rekeyBytes: config.rekeyLimit,
      ciphers: config.ciphers,
      onPacket: (p) => this.#onPacket(p),
    });
    this.#mux = new ChannelMux(this.transport, (type, channel) => {
      if (type !== "session") return { reason: 3, message: `unsupported channel type "${type}"` };
      const session = new Session(channel, this.#config);
      this.#sessions.add(session);
      channel.closed.then(() => session.done).finally(() => this.#sessions.delete(session));
      return { handlers: session.handlers() };
    });
  }

  async run(graceMs: number, versionMs: number): Promise<void> {
    const timer = setTimeout(() => {
      this.transport.disconnect(DISCONNECT.PROTOCOL_ERROR, "login grace time exceeded")
        .catch(() => {});
    }, graceMs);
    // A silent peer gets no binary DISCONNECT: it has not spoken SSH yet.
    const versionTimer = setTimeout(() => {
      if (this.transport.peerVersion === "") this.transport.close();
    }, versionMs);
    try {
      await this.transport.handshake();
      await Promise.race([this.authed, this.transport.closed]);
    } catch {
      // Handshake failures only end this connection.
    } finally {
      clearTimeout(timer);
      clearTimeout(versionTimer);
    }
    const err = await this.transport.closed;
    this.#mux.abortAll(err ?? new SshError("Connection closed"));
    await this.transport.wait();
    await Promise.allSettled([...this.#sessions].map((s) => s.done));
    if (err !== null && !(err instanceof SshError) && !isPeerGone(err)) this.#config.onError(err);
  }

  async #onPacket(payload: Uint8Array): Promise<void> {
    const type = payload[0];
    if (type === MSG.SERVICE_REQUEST) {
      const name = new SshReader(payload, 1).text();
      if (name !== "ssh-userauth" || this.#service) {
        throw new SshError(`Cannot serve: unknown service "${name}"`, {
          reason: DISCONNECT.SERVICE_NOT_AVAILABLE,
        });
      }
      this.#service = true;
      this.transport.post(new SshWriter(32).byte(MSG.SERVICE_ACCEPT).string(name).bytes());
      return;
    }
    if (type === MSG.USERAUTH_REQUEST) {
      if (!this.#service) throw new SshError("Cannot serve: no ssh-userauth", { reason: 2 });
      if (!this.#authed) await this.#auth(payload);
      return; // Requests after success are ignored (RFC 4252 section 5.1).
    }
    if (this.#authed && await this.#mux.handle(payload)) return;
    throw new SshError(`Cannot serve: unexpected message "${type}"`, {
      reason: DISCONNECT.PROTOCOL_ERROR,
    });
  }

  async #auth(payload: Uint8Array): Promise<void> {
    const r = new SshReader(payload, 1);
    const user = r.text();
    const service = r.text();
    const method = r.text();
    if (service !== "ssh-connection") {
      throw new SshError(`Cannot serve: unknown service "${service}"`, {
        reason: DISCONNECT.SERVICE_NOT_AVAILABLE,
      });
    }
    const userOk = this.#config.user === undefined || this.#config.user === user;
    if (method === "publickey") {
      const hasSig = r.boolean();
      const alg = r.text();
      const blob = r.string();
      const known = alg === ED25519 && userOk &&
        this.#config.authorized.some((k) => bytesEqual(k, blob));
      if (!hasSig) {
        if (known) {
          this.transport.post(
            new SshWriter(80).byte(MSG.USERAUTH_PK_OK).string(alg).string(blob).bytes().slice(),
          );
          return;
        }
      } else if (known) {
        const sig = r.string();
        const signed = new SshWriter(256).string(this.transport.sessionId).byte(
          MSG.USERAUTH_REQUEST,
        ).string(user).string(service).string("publickey").boolean(true).string(alg).string(blob)
          .bytes();
        if (await verifyEd25519(blob.subarray(19), sig, signed)) {
          this.#authed = true;
          this.transport.post(new Uint8Array([MSG.USERAUTH_SUCCESS]));
          this.#authedResolve();
          return;
        }
      }
    }
    if (method !== "none") this.#failures++;
    if (this.#failures > this.#config.maxAuthTries) {
      throw new SshError("Cannot log in: too many authentication failures", {
        reason: DISCONNECT.NO_MORE_AUTH_METHODS_AVAILABLE,
      });
    }
    this.transport.post(
      new SshWriter(32).byte(MSG.USERAUTH_FAILURE).nameList(["publickey"]).boolean(false).bytes()
        .slice(),
    );
  }
}
