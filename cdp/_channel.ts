/**
 * What a CDP client talks over (`client.ts`): a WebSocket, or the
 * browser's relay in this process (`_relay.ts`).
 *
 * @module
 */

/**
 * What a {@linkcode CdpClient} talks over: a WebSocket, or the browser's
 * relay in this process (`cdp/_relay.ts`). Not part of the face.
 */
export interface CdpChannel {
  /** Sends one message. */
  send(text: string): void;
  /** Closes the channel; the owner then calls the client's `end`. */
  close(): void;
  /** Whether `send` still reaches the browser. */
  readonly open: boolean;
}

/** A {@linkcode CdpChannel} over a WebSocket. */
export function webSocketChannel(ws: WebSocket): CdpChannel {
  return {
    send: (text) => ws.send(text),
    close: () => ws.close(),
    get open() {
      return ws.readyState < WebSocket.CLOSING;
    },
  };
}
