// The network policy's parsing and matching (`workspace/_netpolicy.ts`),
// in-process: what each entry form lets through and how bad entries are
// refused.

import { test } from "../_test.ts";
import assert from "node:assert/strict";
import {
  checkAddress,
  checkHost,
  type NetworkPolicy,
  parseAddress,
  parseNetworkPolicy,
} from "../../workspace/_netpolicy.ts";
import { Environment } from "../../env.ts";
import { addWorkspace } from "../../workspace/workspace.ts";

function allows(policy: NetworkPolicy, host: string, port: number | null = 443): boolean {
  return checkHost(parseNetworkPolicy(policy), host, port) === null;
}

test("parseNetworkPolicy() refuses bad entries in one line naming the entry", () => {
  const cases: [string, RegExp][] = [
    [
      "https://pypi.org/simple",
      /"https:\/\/pypi.org\/simple" is a URL \(give its host.*"pypi.org"\)/,
    ],
    ["pypi.org/simple", /"pypi.org\/simple" is a path or URL.*"pypi.org"/],
    ["", /an entry is empty \(remove it\)/],
    ["   ", /an entry is empty/],
    ["10.0.0.0/33", /"10.0.0.0\/33": prefix "\/33" is not 0-32/],
    ["fd00::/129", /prefix "\/129" is not 0-128/],
    ["300.1.1.1/8", /"300.1.1.1\/8" is not a CIDR/],
    ["*", /"\*" allows everything \(use network "public"/],
    ["a*.example.com", /"\*" may only lead a name/],
    ["pypi.org:0", /port "0" is not 1-65535/],
    ["pypi.org:99999", /port "99999"/],
    ["bad_host!", /is not a host name, host:port, address or CIDR/],
  ];
  for (const [entry, message] of cases) {
    assert.throws(() => parseNetworkPolicy({ allow: [entry] }), (err: Error) => {
      assert.ok(err instanceof TypeError);
      assert.match(err.message, /^Invalid network allow entry: /);
      assert.match(err.message, message);
      assert.doesNotMatch(err.message, /\n/);
      return true;
    }, entry);
  }
  assert.throws(
    () => parseNetworkPolicy({ allow: ["a.example"], deny: ["*"] }),
    /network deny entry/,
  );
  assert.throws(() => parseNetworkPolicy({ allow: "pypi.org" as never }), /allow must be an array/);
  assert.throws(() => parseNetworkPolicy("open" as never), /use "none", "public" or \{ allow/);
  assert.throws(
    () => parseNetworkPolicy({ allow: [], nameServer: "dns.example" }),
    /nameServer "dns.example": give an address/,
  );
  assert.deepEqual(parseNetworkPolicy({ allow: [], nameServer: "[fd00::53]:5353" }).nameServer, {
    ipAddr: "fd00::53",
    port: 5353,
  });
});

test("checkHost() matches names, wildcards, ports and ranges; deny wins", () => {
  const policy: NetworkPolicy = {
    allow: ["pypi.org:443", "*.pythonhosted.example", "Files.Example.", "10.1.0.0/16", "fd00::/8"],
    deny: ["evil.pythonhosted.example", "10.1.2.0/24"],
  };
  assert.ok(allows(policy, "pypi.org", 443));
  assert.ok(!allows(policy, "pypi.org", 80), "the port is part of the entry");
  assert.ok(allows(policy, "pypi.org", null), "a DNS question: any port");
  assert.ok(allows(policy, "PyPI.org.", 443), "case and trailing dot normalised");
  assert.ok(allows(policy, "files.example", 80), "an entry's case and dot normalised too");
  assert.ok(allows(policy, "cdn.pythonhosted.example"));
  assert.ok(allows(policy, "a.b.pythonhosted.example"), "any depth of subdomain");
  assert.ok(!allows(policy, "pythonhosted.example"), "a wildcard matches subdomains only");
  assert.ok(!allows(policy, "xpythonhosted.example"), "a wildcard matches whole labels");
  assert.ok(!allows(policy, "evil.pythonhosted.example"), "deny wins over allow");
  assert.ok(!allows(policy, "pypi.org.evil.example"));
  assert.ok(allows(policy, "10.1.9.9", 22));
  assert.ok(!allows(policy, "10.1.2.3", 22), "a denied range inside an allowed one");
  assert.ok(!allows(policy, "10.2.0.1"));
  assert.ok(allows(policy, "[fd00::1]"));
  assert.ok(allows(policy, "fd12:3456::1"));
  assert.ok(!allows(policy, "fe80::1"));
  assert.ok(!allows(policy, "::ffff:10.1.2.3"), "an IPv4-mapped address is its IPv4 one");
  assert.ok(allows(policy, "::ffff:10.1.9.9"));
  assert.ok(!allows(policy, "10.1.9.9.nip.example"), "a name is never matched as an address");
  assert.match(
    checkHost(parseNetworkPolicy(policy), "x.example", 443)!,
    /"x.example:443" is not on the allowlist/,
  );
  assert.match(
    checkHost(parseNetworkPolicy(policy), "evil.pythonhosted.example", 443)!,
    /is denied by "evil.pythonhosted.example"/,
  );
  assert.equal(checkHost(parseNetworkPolicy("public"), "anything.example", 1), null);
  assert.match(checkHost(parseNetworkPolicy("none"), "pypi.org", 443)!, /policy is "none"/);
});

test("checkAddress() refuses resolved addresses in a denied range", () => {
  const policy = parseNetworkPolicy({
    allow: ["*.example"],
    deny: ["169.254.0.0/16", "10.0.0.0/8", "fc00::/7", "bad.example"],
  });
  assert.match(checkAddress(policy, "169.254.169.254", 80)!, /denied by "169.254.0.0\/16"/);
  assert.match(checkAddress(policy, "::ffff:169.254.169.254", 80)!, /denied/);
  assert.match(checkAddress(policy, "fd00::1", 80)!, /denied by "fc00::\/7"/);
  assert.equal(checkAddress(policy, "93.184.216.34", 80), null);
  assert.equal(checkAddress(policy, "2606:2800::1", 80), null);
});

test("parseAddress() reads IPv4 and IPv6 forms, refuses others", () => {
  assert.deepEqual(parseAddress("1.2.3.4"), new Uint8Array([1, 2, 3, 4]));
  assert.deepEqual(parseAddress("::1"), new Uint8Array([...new Array(15).fill(0), 1]));
  assert.deepEqual(parseAddress("::ffff:1.2.3.4"), new Uint8Array([1, 2, 3, 4]));
  assert.equal(parseAddress("2001:db8::1")!.length, 16);
  assert.equal(parseAddress("1:2:3:4:5:6:7:8")!.length, 16);
  for (
    const bad of [
      "1.2.3",
      "01.2.3.4",
      "1.2.3.256",
      "1::2::3",
      "1:2:3:4:5:6:7:8:9",
      "0x7f.1",
      "2130706433",
    ]
  ) {
    assert.equal(parseAddress(bad), null, bad);
  }
});

test("addWorkspace() refuses a bad network policy, and an allowlist without a sandbox", () => {
  const env = new Environment("netpolicy-config");
  assert.throws(
    () => addWorkspace(env, "/tmp", { network: { allow: ["https://pypi.org/simple"] } }),
    /^TypeError: Cannot add workspace: Invalid network allow entry: "https:\/\/pypi.org\/simple" is a URL/,
  );
  assert.throws(
    () => addWorkspace(env, "/tmp", { isolation: "none", network: { allow: ["pypi.org"] } }),
    /Cannot add workspace: a network allowlist needs a sandbox \(isolation "auto", "bwrap" or "unshare"\)/,
  );
  assert.equal(addWorkspace(env, "/tmp", { network: "public" }).network, true);
  assert.equal(addWorkspace(env, "/tmp", { network: { allow: ["pypi.org"] } }).network, false);
});
