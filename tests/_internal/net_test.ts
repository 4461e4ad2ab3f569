import { test } from "../_test.ts";
import assert from "node:assert/strict";
import { formatHost, formatHostPort, isLoopback } from "../../_internal/net.ts";

test("formatHost() brackets IPv6 hosts only, once", () => {
  assert.equal(formatHost("::1"), "[::1]");
  assert.equal(formatHost("[::1]"), "[::1]");
  assert.equal(formatHost("fe80::1"), "[fe80::1]");
  assert.equal(formatHost("127.0.0.1"), "127.0.0.1");
  assert.equal(formatHost("example.com"), "example.com");
  assert.equal(formatHostPort("::", 8765), "[::]:8765");
  assert.equal(formatHostPort("10.0.0.1", 22), "10.0.0.1:22");
});

test("isLoopback() is the whole of 127.0.0.0/8, ::1 and localhost", () => {
  for (
    const host of [
      "127.0.0.1",
      "127.0.0.2",
      "127.255.255.254",
      "localhost",
      "LOCALHOST",
      "app.localhost",
      "::1",
      "[::1]",
      "0:0:0:0:0:0:0:1",
      "::ffff:127.0.0.1",
      "[::1]:8080",
      "127.0.0.2:8080",
      "localhost:80",
    ]
  ) {
    assert.equal(isLoopback(host), true, host);
  }
  for (
    const host of [
      "0.0.0.0",
      "::",
      "10.0.0.1",
      "128.0.0.1",
      "127.0.0.256",
      "127.1",
      "localhost.example",
      "evil.example",
      "::ffff:10.0.0.1",
      "",
      "[::1",
    ]
  ) {
    assert.equal(isLoopback(host), false, host);
  }
});
