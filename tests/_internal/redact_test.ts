import { test } from "../_test.ts";
import assert from "node:assert/strict";
import { redactDeep } from "../../_internal/redact.ts";

const KEY =
  "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----";

test("redactDeep() redacts every string of a value, copying only what changed", async (t) => {
  await t.step("strings nested in objects and arrays, keys too", () => {
    const value = {
      request: [{ role: "tool", content: `cat id:\n${KEY}` }],
      info: { "MY_API_KEY=abcdefgh12345678": 1, n: 3 },
    };
    assert.deepEqual(redactDeep(value), {
      request: [{ role: "tool", content: "cat id:\n[REDACTED OPENSSH PRIVATE KEY]" }],
      info: { "MY_API_KEY=[REDACTED value]": 1, n: 3 },
    });
    assert.equal(value.request[0].content.includes("b3BlbnNz"), true, "the input is not changed");
  });
  await t.step("nothing to redact: the same value back", () => {
    const value = { a: ["x", 1, null, { b: true }] };
    assert.equal(redactDeep(value), value);
    assert.equal(redactDeep("plain"), "plain");
    assert.equal(redactDeep(7), 7);
  });
  await t.step("what JSON would write: toJSON() results, a __proto__ key kept as a key", () => {
    const withJson = { toJSON: () => ({ secret: "password=hunter2hunter2" }) };
    assert.deepEqual(redactDeep(withJson), { secret: "password=[REDACTED value]" });
    const odd = JSON.parse('{"__proto__": "password=abcdefgh12345678"}');
    const out = redactDeep(odd) as Record<string, unknown>;
    assert.deepEqual(Object.keys(out), ["__proto__"]);
    assert.equal(Object.getPrototypeOf(out), Object.prototype);
    assert.equal(JSON.stringify(out), '{"__proto__":"password=[REDACTED value]"}');
  });
  await t.step("nesting past the depth is cut to a note", () => {
    let deep: unknown = KEY;
    for (let i = 0; i < 100; i++) deep = [deep];
    assert.ok(!JSON.stringify(redactDeep(deep)).includes("b3Blbn"));
  });
});
