// A workspace with a network allowlist, against hosts of the test's own in a
// network namespace it makes (`_netns_hosts.ts`): what an agent's command
// reaches through the egress proxy, what it is refused, and the attacks an
// agent would try to step around it.

import { test } from "../_test.ts";
import { withDeadline } from "../_deadline.ts";
import { BWRAP, CURL, IPTABLES, ROOT_USER, UNSHARE } from "../_counterparts.ts";
import assert from "node:assert/strict";
import { Environment } from "../../env.ts";
import { addWorkspace, type Workspace } from "../../workspace/workspace.ts";
import { type NetworkPolicy, parseNetworkPolicy } from "../../workspace/_netpolicy.ts";
import { startEgressProxy } from "../../workspace/_egress.ts";
import { startNetnsHosts } from "./_netns_hosts.ts";

/** The policy of these tests: names under allowed.test, never the denied address. */
function policyOf(allowed: string, denied: string): NetworkPolicy {
  return { allow: ["*.allowed.test"], deny: [`${denied}/32`], nameServer: `${allowed}:53` };
}

/** Runs `script` (bash) as the agent; its exit code and output. */
async function agent(ws: Workspace, script: string): Promise<{ code: number; out: string }> {
  const child = await ws.spawn(["bash", "-c", script]);
  await child.stdin.close();
  const out = await child.output();
  const dec = new TextDecoder();
  return { code: out.code, out: dec.decode(out.stdout) + dec.decode(out.stderr) };
}

const MECHANISM = { bwrap: BWRAP, unshare: UNSHARE } as const;

for (const isolation of ["bwrap", "unshare"] as const) {
  test(
    `addWorkspace() network allowlist under "${isolation}": only the proxy carries traffic`,
    {
      needs: [MECHANISM[isolation], ROOT_USER, IPTABLES, CURL],
    },
    withDeadline(55_000, async (t) => {
      await using hosts = await startNetnsHosts();
      const { allowed, denied } = hosts;
      const root = await Deno.makeTempDir({ prefix: "ws-egress-" });
      const env = new Environment("egress-test");
      const ws = addWorkspace(env, root, {
        isolation,
        trackFiles: false,
        network: policyOf(allowed, denied),
      });
      await env.start();
      try {
        const curl = "curl -sS --max-time 8";
        await t.step("the allowed host is reached through the proxy", async () => {
          const r = await agent(ws, `${curl} http://api.allowed.test:8080/`);
          assert.equal(r.out, "allowed host\n");
          const tunnelled = await agent(ws, `${curl} -p http://api.allowed.test:8080/`);
          assert.equal(tunnelled.out, "allowed host\n", "through CONNECT too");
        });

        await t.step("a name not on the list is refused with 403 and a reason", async () => {
          const r = await agent(ws, `${curl} -w '%{http_code}' http://www.denied.test:8080/`);
          assert.match(r.out, /"www.denied.test:8080" is not on the allowlist\n403$/);
          const tunnelled = await agent(ws, `${curl} -p http://www.denied.test:8080/`);
          assert.match(tunnelled.out, /403/);
          assert.doesNotMatch(tunnelled.out, /denied host/);
        });

        await t.step("an allowed name resolving into a denied range is refused", async () => {
          const r = await agent(ws, `${curl} http://sneaky.allowed.test:8080/`);
          assert.match(r.out, new RegExp(`"${denied}" is denied by "${denied}/32"`));
        });

        await t.step(
          "the agent unsets the proxy variables: no route, not even to the allowed host",
          async () => {
            for (const address of [allowed, denied]) {
              const r = await agent(
                ws,
                `unset http_proxy HTTP_PROXY all_proxy ALL_PROXY; ${curl} --noproxy '*' http://${address}:8080/; echo " exit=$?"`,
              );
              assert.doesNotMatch(r.out, /host\n/, address);
              assert.match(r.out, /exit=(7|28)\n/, r.out);
            }
            const named = await agent(
              ws,
              `env -i curl -sS --max-time 8 http://api.allowed.test:8080/; echo " exit=$?"`,
            );
            assert.doesNotMatch(named.out, /allowed host/);
          },
        );

        await t.step("DNS answers allowed names and refuses the others", async () => {
          // getent hosts: gethostbyname(). getaddrinfo() with AI_ADDRCONFIG (getent
          // ahosts) asks nothing in a namespace with only loopback.
          const ok = await agent(ws, "getent hosts api.allowed.test");
          assert.match(
            ok.out,
            new RegExp(`^${allowed.replaceAll(".", "\\.")}\\s+api.allowed.test\n$`),
          );
          const no = await agent(ws, "getent hosts www.denied.test; echo exit=$?");
          assert.equal(no.out, "exit=2\n");
        });

        await t.step("a Host header naming another host is refused", async () => {
          const r = await agent(
            ws,
            `${curl} -H 'Host: www.denied.test:8080' http://api.allowed.test:8080/`,
          );
          assert.match(r.out, /Host header "www.denied.test:8080" is not the URL's host/);
          assert.doesNotMatch(r.out, /host\n/);
        });

        await t.step(
          "a setup command with a wider policy fetches what the agent cannot",
          async () => {
            const fetch = ["curl", "-sS", "--max-time", "8", `http://${denied}:8080/`];
            const setup = await ws.exec([...fetch, "-o", "fetched.txt"], {
              network: { allow: [denied] },
              timeout: 15_000,
            });
            assert.equal(setup.code, 0, setup.stderr);
            assert.equal(await Deno.readTextFile(`${root}/fetched.txt`), "denied host\n");
            const open = await ws.exec(fetch, { network: "public", timeout: 15_000 });
            assert.equal(open.stdout, "denied host\n", "network public: this host's network");
            const r = await agent(ws, `${curl} http://${denied}:8080/`);
            assert.match(r.out, /is denied by/);
            const grader = await ws.exec(fetch, { timeout: 15_000 });
            assert.notEqual(
              grader.stdout,
              "denied host\n",
              "without its own: the workspace's policy",
            );
          },
        );

        await t.step("the agent asks the proxy's socket directly for a denied host", async () => {
          const r = await agent(
            ws,
            `${curl} --unix-socket /run/hud/net/proxy.sock http://www.denied.test:8080/; ${curl} --unix-socket /run/hud/net/proxy.sock http://${denied}:8080/`,
          );
          assert.doesNotMatch(r.out, /denied host/);
        });
      } finally {
        await env.stop();
        await Deno.remove(root, { recursive: true });
      }
    }),
  );
}

/** A TLS ClientHello record naming `sni` (enough of one for the proxy's check). */
function clientHello(sni: string): Uint8Array {
  const name = new TextEncoder().encode(sni);
  const ext = [0, 0, 0, name.length + 5, 0, name.length + 3, 0, 0, name.length, ...name];
  const body = [3, 3, ...new Array(32).fill(7), 0, 0, 2, 0x13, 1, 1, 0, 0, ext.length, ...ext];
  const hs = [1, 0, body.length >> 8, body.length & 0xff, ...body];
  return new Uint8Array([0x16, 3, 1, hs.length >> 8, hs.length & 0xff, ...hs]);
}

async function readAll(conn: Deno.Conn): Promise<Uint8Array> {
  const parts: number[] = [];
  const buf = new Uint8Array(4096);
  for (;;) {
    const n = await conn.read(buf).catch(() => null);
    if (n === null) return new Uint8Array(parts);
    parts.push(...buf.subarray(0, n));
  }
}

test("startEgressProxy(): the proxy's own checks, asked on its socket directly", {
  needs: [ROOT_USER, IPTABLES],
}, async (t) => {
  await using hosts = await startNetnsHosts();
  const policy = parseNetworkPolicy(policyOf(hosts.allowed, hosts.denied));
  const proxy = await startEgressProxy(policy);
  const open = () => Deno.connect({ transport: "unix", path: `${proxy.dir}/proxy.sock` });
  const enc = new TextEncoder();
  try {
    await t.step("CONNECT to an allowed name with another TLS server name is closed", async () => {
      for (
        const [sni, echoed] of [["api.allowed.test", true], ["www.denied.test", false]] as const
      ) {
        const conn = await open();
        await conn.write(
          enc.encode("CONNECT api.allowed.test:443 HTTP/1.1\r\nHost: api.allowed.test:443\r\n\r\n"),
        );
        const hello = clientHello(sni);
        await conn.write(hello);
        await conn.closeWrite();
        const got = new TextDecoder().decode(await readAll(conn));
        conn.close();
        assert.match(got, /^HTTP\/1.1 200 /);
        // The echo on the allowed host sends the ClientHello back only if it got it.
        assert.equal(got.includes(new TextDecoder().decode(hello.subarray(5))), echoed, sni);
      }
    });

    await t.step("CONNECT to a denied address is refused before anything is sent", async () => {
      const conn = await open();
      await conn.write(enc.encode(`CONNECT ${hosts.denied}:8080 HTTP/1.1\r\n\r\n`));
      const got = new TextDecoder().decode(await readAll(conn));
      conn.close();
      assert.match(got, /^HTTP\/1.1 403 Forbidden\r\n/);
      assert.match(got, /is not on the allowlist|is denied/);
    });

    await t.step("tricks in an absolute URL reach no other host", async () => {
      const ask = async (text: string) => {
        const conn = await open();
        await conn.write(enc.encode(text));
        const got = new TextDecoder().decode(await readAll(conn));
        conn.close();
        return got;
      };
      const userinfo = await ask(
        "GET http://api.allowed.test:8080@www.denied.test:8080/ HTTP/1.1\r\nHost: www.denied.test:8080\r\n\r\n",
      );
      assert.match(userinfo, /^HTTP\/1.1 403 .*"www.denied.test:8080" is not on the allowlist/s);
      const pipelined = await ask(
        "GET http://api.allowed.test:8080/ HTTP/1.1\r\nHost: api.allowed.test:8080\r\n\r\n" +
          `GET http://${hosts.denied}:8080/ HTTP/1.1\r\nHost: ${hosts.denied}:8080\r\n\r\n`,
      );
      assert.match(pipelined, /allowed host/);
      assert.doesNotMatch(pipelined, /denied host/);
      const https = await ask("GET https://api.allowed.test/ HTTP/1.1\r\n\r\n");
      assert.match(https, /^HTTP\/1.1 400 .*use CONNECT for https/s);
    });

    await t.step(
      "a denied name gets REFUSED from the resolver, an allowed one an address",
      async () => {
        for (const [name, rcode] of [["www.denied.test", 5], ["api.allowed.test", 0]] as const) {
          const conn = await Deno.connect({ transport: "unix", path: `${proxy.dir}/dns.sock` });
          const labels = name.split(".").flatMap((l) => [l.length, ...enc.encode(l)]);
          const q = [0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, ...labels, 0, 0, 1, 0, 1];
          await conn.write(new Uint8Array([0, q.length, ...q]));
          const reply = new Uint8Array(512);
          const n = (await conn.read(reply))!;
          conn.close();
          assert.equal(reply[5] & 0x0f, rcode, name);
          assert.equal(reply[2] << 8 | reply[3], 0x1234, "the query's id");
          if (rcode === 0) {
            assert.deepEqual([...reply.subarray(n - 4, n)], hosts.allowed.split(".").map(Number));
          }
        }
      },
    );
  } finally {
    await proxy.close();
  }
});
