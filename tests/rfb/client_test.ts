// RfbClient against scripted servers on real sockets: the handshake's
// versions and security types, the encodings and their bounds, input
// events on the wire, and the one-line errors of bad input (issue 40).
// Real servers (TigerVNC, x11vnc) are in servers_test.ts.

import { test } from "../_test.ts";
import assert from "node:assert/strict";
import { RfbClient, RfbError } from "../../rfb/mod.ts";
import { desEncryptBlock, vncAuthResponse } from "../../rfb/_des.ts";
import { comboKeysyms, keysym } from "../../rfb/_keysym.ts";
import {
  accept38,
  drain,
  type FakeIo,
  fakeServer,
  rawRect,
  readRequest,
  rect,
  serverInit,
  StoredZlib,
  text,
  u16,
  u32,
  update,
} from "./_fake.ts";
import { decodePng, pixel } from "./_png_decode.ts";

const hex = (s: string) => new Uint8Array(s.match(/../g)!.map((h) => parseInt(h, 16)));

/** Asserts an RfbError of `kind` whose message is one line matching `pattern`. */
function oneLine(kind: string, pattern: RegExp) {
  return (err: unknown) => {
    assert.ok(err instanceof RfbError, `not an RfbError: ${err}`);
    assert.equal(err.kind, kind, err.message);
    assert.match(err.message, pattern);
    assert.doesNotMatch(err.message, /\n/);
    return true;
  };
}

test("desEncryptBlock() meets the FIPS 46 worked example; vncAuthResponse() reverses the key's bits", () => {
  assert.deepEqual(
    desEncryptBlock(hex("133457799BBCDFF1"), hex("0123456789ABCDEF")),
    hex("85E813540F0AB405"),
  );
  // "password" with each byte's bits reversed is 0E86CECEEEF64E26.
  const challenge = hex("00112233445566778899AABBCCDDEEFF");
  assert.deepEqual(
    vncAuthResponse("password", challenge),
    new Uint8Array([
      ...desEncryptBlock(hex("0E86CECEEEF64E26"), challenge.subarray(0, 8)),
      ...desEncryptBlock(hex("0E86CECEEEF64E26"), challenge.subarray(8)),
    ]),
  );
  // Only the first 8 characters count, as every VNC server has it.
  assert.deepEqual(
    vncAuthResponse("password-long", challenge),
    vncAuthResponse("password", challenge),
  );
});

test("keysym() and comboKeysyms() take X11 names, xdotool's aliases and characters", () => {
  assert.equal(keysym("Return"), 0xff0d);
  assert.equal(keysym("enter"), 0xff0d);
  assert.equal(keysym("Page_Down"), 0xff56);
  assert.equal(keysym("F5"), 0xffc2);
  assert.equal(keysym("KP_0"), 0xffb0);
  assert.equal(keysym("a"), 0x61);
  assert.equal(keysym("A"), 0x41);
  assert.equal(keysym("€"), 0x010020ac);
  assert.deepEqual(comboKeysyms("ctrl+shift+t"), [0xffe3, 0xffe1, 0x74]);
  assert.deepEqual(comboKeysyms("alt+Tab"), [0xffe9, 0xff09]);
  assert.deepEqual(comboKeysyms("ctrl++"), [0xffe3, 0x2b]);
  assert.throws(() => keysym("Bogus_Key"), /Cannot press key "Bogus_Key": not a key name/);
  assert.throws(() => comboKeysyms("ctrl+"), /an empty name/);
});

test("RfbClient.over() speaks RFB 3.3, 3.7 and 3.8 with security None", async (t) => {
  for (const version of ["3.3", "3.7", "3.8", "3.889"]) {
    await t.step(version, async () => {
      const sent: string[] = [];
      await using server = fakeServer(async (io) => {
        await io.write(
          new TextEncoder().encode(
            `RFB 00${version.slice(0, 1)}.${version.slice(2).padStart(3, "0")}\n`,
          ),
        );
        sent.push(new TextDecoder().decode(await io.read.bytes(12)));
        if (version === "3.3") await io.write(u32(1));
        else {
          await io.write([2, 2, 1]); // VNC authentication, None
          sent.push(String(await io.read.u8()));
        }
        if (version === "3.8" || version === "3.889") await io.write(u32(0));
        sent.push(`shared=${await io.read.u8()}`);
        await io.write(serverInit(320, 200, `desk ${version}`));
        await io.read.bytes(20); // SetPixelFormat
        await io.read.bytes(4);
        await io.read.bytes(4 * 6);
      });
      await using vnc = await RfbClient.connect({ port: server.port });
      await server.done;
      assert.equal(vnc.name, `desk ${version}`);
      assert.deepEqual([vnc.width, vnc.height], [320, 200]);
      const answered = version === "3.889" ? "3.8" : version;
      assert.equal(vnc.version, answered);
      assert.equal(sent[0], `RFB 003.00${answered.slice(2)}\n`);
      if (version !== "3.3") assert.equal(sent[1], "1"); // None, though VNC auth came first
      assert.equal(sent.at(-1), "shared=1");
    });
  }
});

test("RfbClient asks for 32-bit RGB and the encodings it decodes, most wanted first", async () => {
  let asked: { format: Uint8Array; encodings: number[] } | null = null;
  await using server = fakeServer(async (io) => {
    asked = await accept38(io, 64, 64);
  });
  await using _vnc = await RfbClient.connect({ port: server.port });
  await server.done;
  const { format, encodings } = asked!;
  // 32 bpp, depth 24, little-endian, true colour, 255 each, red at bit 0, green 8, blue 16.
  assert.deepEqual([...format], [32, 24, 0, 1, 0, 255, 0, 255, 0, 255, 0, 8, 16, 0, 0, 0]);
  assert.deepEqual(encodings, [16, 1, 0, -223, -224, -239]);
});

test("RfbClient answers VNC authentication and reports a refused password in one line", async (t) => {
  const challenge = crypto.getRandomValues(new Uint8Array(16));
  for (const right of [true, false]) {
    await t.step(right ? "accepted" : "refused", async () => {
      let response: Uint8Array | null = null;
      await using server = fakeServer(async (io) => {
        await io.write(new TextEncoder().encode("RFB 003.008\n"));
        await io.read.bytes(12);
        await io.write([1, 2]);
        assert.equal(await io.read.u8(), 2);
        await io.write(challenge);
        response = await io.read.copy(16);
        if (!right) return await io.write(u32(1), text("Authentication failed"));
        await io.write(u32(0));
        await io.read.u8();
        await io.write(serverInit(8, 8));
        await io.read.bytes(20 + 4 + 24);
      });
      const connecting = RfbClient.connect({
        port: server.port,
        password: right ? "secret" : "wrong",
      });
      if (right) {
        await using vnc = await connecting;
        assert.equal(vnc.width, 8);
      } else {
        await assert.rejects(
          connecting,
          oneLine("auth", /refused the password: Authentication failed$/),
        );
      }
      await server.done;
      assert.deepEqual(response, vncAuthResponse(right ? "secret" : "wrong", challenge));
    });
  }
});

test("RfbClient refuses what it cannot connect to, in one line, without hanging", async (t) => {
  const cases: [string, (io: FakeIo) => Promise<void>, string, RegExp][] = [
    [
      "a binding that is not RFB (an SSH server)",
      (io) => io.write(new TextEncoder().encode("SSH-2.0-OpenSSH_9.2p1 Debian\r\n")),
      "protocol",
      /does not speak RFB \(it sent "SSH-2\.0-Open"\)/,
    ],
    [
      "a server offering no security type we speak (VeNCrypt, TLS)",
      async (io) => {
        await io.write(new TextEncoder().encode("RFB 003.008\n"));
        await io.read.bytes(12);
        await io.write([2, 19, 18]);
      },
      "security",
      /offers the security types 19 \(VeNCrypt\), 18 \(TLS\), none that this client speaks/,
    ],
    [
      "a server refusing with a reason",
      async (io) => {
        await io.write(new TextEncoder().encode("RFB 003.008\n"));
        await io.read.bytes(12);
        await io.write([0], text("Too many security failures"));
      },
      "security",
      /it refused: Too many security failures$/,
    ],
    [
      "a 3.3 server choosing a type we do not speak",
      async (io) => {
        await io.write(new TextEncoder().encode("RFB 003.003\n"));
        await io.read.bytes(12);
        await io.write(u32(16));
      },
      "security",
      /offers the security types 16 \(Tight\)/,
    ],
    [
      "a server asking for a password when none was given",
      async (io) => {
        await io.write(new TextEncoder().encode("RFB 003.008\n"));
        await io.read.bytes(12);
        await io.write([1, 2]);
      },
      "auth",
      /asks for a VNC password and none was given/,
    ],
    [
      "a desktop over the size bound",
      async (io) => {
        await io.write(new TextEncoder().encode("RFB 003.008\n"));
        await io.read.bytes(12);
        await io.write([1, 1]);
        await io.read.u8();
        await io.write(u32(0));
        await io.read.u8();
        await io.write(serverInit(65535, 65535));
      },
      "protocol",
      /desktop is 65535x65535, outside the bound of 1 to 33554432 pixels \(maxPixels\)/,
    ],
    [
      "a server that closes at once",
      (io) => Promise.resolve(io.conn.close()),
      "closed",
      /closed the connection/,
    ],
  ];
  for (const [name, script, kind, pattern] of cases) {
    await t.step(name, async () => {
      await using server = fakeServer(script);
      await assert.rejects(RfbClient.connect({ port: server.port }), oneLine(kind, pattern));
    });
  }
  await t.step("a server that says nothing: no handshake within connectTimeout", async () => {
    await using server = fakeServer(async (io) => {
      await drain(io);
    });
    const started = performance.now();
    await assert.rejects(
      RfbClient.connect({ port: server.port, connectTimeout: 300 }),
      oneLine("protocol", /no RFB handshake within 300 ms \(is it a VNC server\?\)/),
    );
    assert.ok(performance.now() - started < 5_000);
  });
  await t.step("nothing listening", async () => {
    const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
    const port = listener.addr.port;
    listener.close();
    await assert.rejects(
      RfbClient.connect({ port }),
      oneLine("closed", /Cannot connect to the VNC server at 127\.0\.0\.1:\d+: /),
    );
  });
});

test("RfbClient decodes Raw, CopyRect and ZRLE (one zlib stream across rectangles) into PNG screenshots", async () => {
  const zlib = new StoredZlib();
  const cpixel = (rgb: number[]) => rgb;
  // 80x70: ZRLE tiles are 64x64, so the rectangle below has four tiles of different sizes.
  await using server = fakeServer(async (io) => {
    await accept38(io, 80, 70);
    assert.deepEqual(await readRequest(io), [0, 0, 0, 80, 70]);
    // Tile (0,0) 64x64 solid red; (64,0) 16x64 plain RLE: 16*64 pixels as two runs;
    // (0,64) 64x6 packed palette of 2 (stripes); (64,64) 16x6 palette RLE of 3 colours.
    const tiles: number[] = [];
    tiles.push(1, ...cpixel([255, 0, 0]));
    tiles.push(128, ...cpixel([0, 255, 0]), 255, 255, 1, ...cpixel([0, 0, 255]), 255, 255, 1); // 512 + 512
    tiles.push(2, ...cpixel([0, 0, 0]), ...cpixel([255, 255, 255]));
    for (let row = 0; row < 6; row++) for (let b = 0; b < 8; b++) tiles.push(row % 2 ? 0xff : 0x00);
    tiles.push(128 + 3, ...cpixel([10, 20, 30]), ...cpixel([40, 50, 60]), ...cpixel([70, 80, 90]));
    tiles.push(0x80 | 0, 31, 0x80 | 1, 31, 0x80 | 2, 31); // 32 + 32 + 32 = 96 = 16*6
    const data = new Uint8Array(tiles);
    // The first half of the stream in one rectangle, the second in the next update.
    const first = zlib.part(data);
    await io.write(update(1), rect(0, 0, 80, 70, 16), u32(first.length), first);
    // The next request: incremental and the one-pixel fence.
    assert.deepEqual(await readRequest(io), [1, 0, 0, 80, 70]);
    assert.deepEqual(await readRequest(io), [0, 0, 0, 1, 1]);
    // Same stream continued: a raw-subencoding 1x1 tile at the origin, a Raw
    // rectangle, and a CopyRect of the stripes.
    const second = zlib.part(new Uint8Array([0, 1, 2, 3]));
    await io.write(
      update(3),
      rect(0, 0, 1, 1, 16),
      u32(second.length),
      second,
      rawRect(40, 10, 4, 4, [9, 8, 7]),
      rect(20, 30, 40, 6, 1),
      u16(0),
      u16(64),
    );
    await readRequest(io);
    await readRequest(io);
    await io.write(update(1), rawRect(0, 0, 1, 1, [1, 2, 3]));
    await drain(io);
  });
  await using vnc = await RfbClient.connect({ port: server.port });
  const first = await decodePng(await vnc.screenshot());
  assert.deepEqual([first.width, first.height], [80, 70]);
  assert.deepEqual(pixel(first, 10, 10), [255, 0, 0]);
  assert.deepEqual(pixel(first, 70, 5), [0, 255, 0]); // run 1: 512 pixels = rows 0-31
  assert.deepEqual(pixel(first, 70, 40), [0, 0, 255]); // run 2
  assert.deepEqual(pixel(first, 5, 64), [0, 0, 0]);
  assert.deepEqual(pixel(first, 5, 65), [255, 255, 255]);
  assert.deepEqual(pixel(first, 64, 64), [10, 20, 30]);
  assert.deepEqual(pixel(first, 64, 66), [40, 50, 60]);
  assert.deepEqual(pixel(first, 79, 69), [70, 80, 90]);
  const second = await decodePng(await vnc.screenshot());
  assert.deepEqual(pixel(second, 0, 0), [1, 2, 3]);
  assert.deepEqual(pixel(second, 41, 11), [9, 8, 7]);
  assert.deepEqual(pixel(second, 30, 30), [0, 0, 0]); // copied stripes
  assert.deepEqual(pixel(second, 30, 31), [255, 255, 255]);
  const small = await decodePng(await vnc.screenshot({ width: 40, height: 35 }));
  assert.deepEqual([small.width, small.height], [40, 35]);
  await vnc.close();
  await server.done;
});

test("RfbClient ends the connection on a framebuffer update past its bounds, in one line", async (t) => {
  const cases: [string, (io: FakeIo) => Promise<void>, RegExp][] = [
    [
      "a Raw rectangle outside the screen",
      (io) => io.write(update(1), rect(60, 60, 10, 10, 0)),
      /a Raw rectangle 10x10 at \(60, 60\) lies outside the 64x64 screen/,
    ],
    [
      "a CopyRect source outside the screen",
      (io) => io.write(update(1), rect(0, 0, 10, 10, 1), u16(60), u16(0)),
      /a CopyRect source 10x10 at \(60, 0\) lies outside the 64x64 screen/,
    ],
    [
      "a ZRLE rectangle claiming more bytes than it may take",
      (io) => io.write(update(1), rect(0, 0, 64, 64, 16), u32(0x7fffffff)),
      /a ZRLE rectangle of 64x64 claims 2147483647 bytes, over the \d+ it may take/,
    ],
    [
      "ZRLE data that is not zlib",
      (io) => io.write(update(1), rect(0, 0, 8, 8, 16), u32(4), [1, 2, 3, 4]),
      /ZRLE data is not zlib/,
    ],
    [
      "ZRLE data that ends inside a tile",
      (io) => {
        const part = new StoredZlib().part(new Uint8Array([0, 1, 2, 3]));
        return io.write(update(1), rect(0, 0, 8, 8, 16), u32(part.length), part);
      },
      /ZRLE data ends inside the 8x8 rectangle at \(0, 0\)/,
    ],
    [
      "a desktop resized past the bound",
      (io) => io.write(update(1), rect(0, 0, 60000, 60000, -223)),
      /desktop is 60000x60000, outside the bound/,
    ],
    [
      "an encoding the client did not ask for",
      (io) => io.write(update(1), rect(0, 0, 8, 8, 5)),
      /encoding 5 \(Hextile\), which this client did not ask for/,
    ],
    [
      "cut text over maxCutText",
      (io) => io.write([3, 0, 0, 0], u32(2_000_000)),
      /the server sent 2000000 bytes, over the 1048576 allowed \(maxCutText\)/,
    ],
    [
      "an unknown message",
      (io) => io.write([77]),
      /unknown message type 77/,
    ],
  ];
  for (const [name, script, pattern] of cases) {
    await t.step(name, async () => {
      await using server = fakeServer(async (io) => {
        await accept38(io, 64, 64);
        await readRequest(io);
        await script(io);
        await drain(io);
      });
      await using vnc = await RfbClient.connect({ port: server.port });
      await assert.rejects(vnc.screenshot({ timeout: 10_000 }), oneLine("protocol", pattern));
      assert.equal(vnc.closed, true);
      // Every later call fails the same way, at once.
      await assert.rejects(vnc.click({ x: 1, y: 1 }), oneLine("protocol", pattern));
    });
  }
});

test("RfbClient sends pointer and key events as RFC 6143 lays them out", async () => {
  const events: number[][] = [];
  await using server = fakeServer(async (io) => {
    await accept38(io, 100, 50);
    for (;;) {
      const type = await io.read.u8().catch(() => null);
      if (type === null) return;
      if (type === 5) {
        events.push([5, await io.read.u8(), await io.read.u16(), await io.read.u16()]);
      } else if (type === 4) {
        const down = await io.read.u8();
        await io.read.bytes(2);
        events.push([4, down, await io.read.u32()]);
      } else if (type === 6) {
        await io.read.bytes(3);
        const n = await io.read.u32();
        events.push([6, ...await io.read.bytes(n)]);
      } else throw new Error(`unexpected message ${type}`);
    }
  });
  const vnc = await RfbClient.connect({ port: server.port });
  await vnc.click({ x: 10, y: 20 });
  await vnc.doubleClick({ x: 99.4, y: 49 }, { button: "right" });
  await vnc.drag({ x: 0, y: 0 }, { x: 4, y: 2 }, { steps: 2 });
  await vnc.scroll({ x: 5, y: 5 }, { dy: -1, dx: 1 });
  await vnc.key("ctrl+c");
  await vnc.type("Hi\n");
  await vnc.sendCutText("clip");
  assert.deepEqual(vnc.pointer, { x: 5, y: 5 });
  await vnc.close();
  await server.done;
  assert.deepEqual(events, [
    [5, 0, 10, 20],
    [5, 1, 10, 20],
    [5, 0, 10, 20],
    [5, 0, 99, 49],
    [5, 4, 99, 49],
    [5, 0, 99, 49],
    [5, 4, 99, 49],
    [5, 0, 99, 49],
    [5, 0, 0, 0],
    [5, 1, 0, 0],
    [5, 1, 2, 1],
    [5, 1, 4, 2],
    [5, 0, 4, 2],
    [5, 0, 5, 5],
    [5, 8, 5, 5],
    [5, 0, 5, 5],
    [5, 64, 5, 5],
    [5, 0, 5, 5],
    [4, 1, 0xffe3],
    [4, 1, 0x63],
    [4, 0, 0x63],
    [4, 0, 0xffe3],
    [4, 1, 0xffe1],
    [4, 1, 0x48],
    [4, 0, 0x48],
    [4, 0, 0xffe1],
    [4, 1, 0x69],
    [4, 0, 0x69],
    [4, 1, 0xff0d],
    [4, 0, 0xff0d],
    [6, 0x63, 0x6c, 0x69, 0x70],
  ]);
});

test("RfbClient refuses a point off the screen and bad arguments in one line, sending nothing", async () => {
  let sent = 0;
  await using server = fakeServer(async (io) => {
    await accept38(io, 100, 50);
    while (await io.read.bytes(1).then(() => true, () => false)) sent++;
  });
  await using vnc = await RfbClient.connect({ port: server.port });
  const off =
    /Cannot (click|drag|scroll|move the pointer): \(\d+, -?\d+\) is off the 100x50 screen$/;
  await assert.rejects(vnc.click({ x: 100, y: 10 }), off);
  await assert.rejects(vnc.click({ x: 10, y: -1 }), off);
  await assert.rejects(vnc.drag({ x: 1, y: 1 }, { x: 1, y: 50 }), off);
  await assert.rejects(vnc.scroll({ x: 2000, y: 1 }, { dy: 1 }), off);
  await assert.rejects(vnc.move({ x: 5, y: 5000 }), off);
  await assert.rejects(
    vnc.click({ x: Number.NaN, y: 1 }),
    /a point must be \{ x, y \} with finite numbers/,
  );
  await assert.rejects(vnc.key("ctrl+Nope"), /Cannot press key "Nope": not a key name/);
  await assert.rejects(
    vnc.click({ x: 1, y: 1 }, { button: "side" as "left" }),
    /mouse button "side"/,
  );
  await assert.rejects(vnc.screenshot({ width: 10 }), /give both width and height/);
  await vnc.close();
  await server.done;
  assert.equal(sent, 0);
});

test("RfbClient.settle() waits for the screen to stop changing, bounded by its timeout", async (t) => {
  await t.step("settles after the last change", async () => {
    await using server = fakeServer(async (io) => {
      await accept38(io, 8, 8);
      await readRequest(io); // the first full frame
      await io.write(update(1), rawRect(0, 0, 8, 8, [0, 0, 0]));
      // Three changes, one per request, then none.
      for (let i = 0; i < 3; i++) {
        await readRequest(io);
        await io.write(update(1), rawRect(1, 1, 1, 1, [i, i, i]));
      }
      await drain(io);
    });
    await using vnc = await RfbClient.connect({ port: server.port });
    const started = performance.now();
    assert.equal(await vnc.settle({ quiet: 200, timeout: 5_000 }), true);
    assert.ok(performance.now() - started >= 200);
    assert.equal(vnc.updates, 4);
  });
  await t.step("gives up at timeout while the screen keeps changing", async () => {
    await using server = fakeServer(async (io) => {
      await accept38(io, 8, 8);
      for (let i = 0;; i++) {
        const r = await readRequest(io).catch(() => null);
        if (r === null) return;
        await io.write(update(1), rawRect(0, 0, 1, 1, [i & 255, 0, 0]));
      }
    });
    await using vnc = await RfbClient.connect({ port: server.port });
    const started = performance.now();
    assert.equal(await vnc.settle({ quiet: 300, timeout: 800 }), false);
    assert.ok(performance.now() - started < 3_000);
  });
});

test("RfbClient keeps the server's cut text (Latin-1) and skips bells and colour maps", async () => {
  await using server = fakeServer(async (io) => {
    await accept38(io, 8, 8);
    await readRequest(io);
    await io.write([2], [1, 0, ...u16(0), ...u16(1), 0, 1, 0, 2, 0, 3]); // Bell, SetColourMapEntries
    await io.write([3, 0, 0, 0], u32(6), [0x63, 0x61, 0x66, 0xe9, 0x21, 0x0a]); // "café!\n"
    await io.write(update(1), rawRect(0, 0, 8, 8, [1, 2, 3]));
    await drain(io);
  });
  await using vnc = await RfbClient.connect({ port: server.port });
  assert.equal(vnc.cutText, null);
  await vnc.refresh();
  assert.equal(vnc.cutText, "café!\n");
  assert.equal(vnc.closed, false);
});

test("RfbClient.close() is idempotent; calls after it fail as closed", async () => {
  await using server = fakeServer(async (io) => {
    await accept38(io, 8, 8);
    await drain(io);
  });
  const vnc = await RfbClient.connect({ port: server.port });
  await vnc.close();
  await vnc.close();
  await assert.rejects(vnc.screenshot(), oneLine("closed", /the VNC connection: it is closed/));
  await server.done;
});

test("RfbClient.fromBinding() refuses a binding that is not rfb", async () => {
  const { Capability } = await import("../../capability.ts");
  await assert.rejects(
    RfbClient.fromBinding(Capability.cdp({ url: "ws://127.0.0.1:9222/devtools/browser/x" })),
    /Cannot open binding "browser": expected an rfb binding, got "cdp\/1\.3"/,
  );
});
