// Reading kubeconfigs without kubectl: the YAML subset they are written in,
// contexts, inline and file credentials, credential plugins, refusals.

import { test } from "../_test.ts";
import assert from "node:assert/strict";
import { parseYaml } from "../../engines/_yaml.ts";
import { loadKubeConfig } from "../../engines/_kube.ts";

test("parseYaml() reads the kubeconfig that kubectl writes", () => {
  const doc = parseYaml(`apiVersion: v1
clusters:
- cluster:
    certificate-authority-data: QUJD
    server: https://127.0.0.1:6443 # the API server
  name: kind-kind
contexts:
- context:
    cluster: kind-kind
    user: "kind-kind"
    namespace: 'it''s'
  name: kind-kind
current-context: kind-kind
kind: Config
preferences: {}
users:
- name: kind-kind
  user:
    exec:
      args:
      - --region
      - "us #1"
      command: aws
      env: null
      interactiveMode: Never
      list: [a, 'b c', {x: 1, y: [true, ~]}]
`);
  assert.deepEqual(doc, {
    apiVersion: "v1",
    clusters: [{
      cluster: { "certificate-authority-data": "QUJD", server: "https://127.0.0.1:6443" },
      name: "kind-kind",
    }],
    contexts: [{
      context: { cluster: "kind-kind", user: "kind-kind", namespace: "it's" },
      name: "kind-kind",
    }],
    "current-context": "kind-kind",
    kind: "Config",
    preferences: {},
    users: [{
      name: "kind-kind",
      user: {
        exec: {
          args: ["--region", "us #1"],
          command: "aws",
          env: null,
          interactiveMode: "Never",
          list: ["a", "b c", { x: 1, y: [true, null] }],
        },
      },
    }],
  });
});

test("parseYaml() reads a colon inside a plain flow scalar as compose files write them", () => {
  assert.deepEqual(parseYaml('volumes: [data:/data, "8080:80", a:b]\nm: {a: b:c, d: e}\n'), {
    volumes: ["data:/data", "8080:80", "a:b"],
    m: { a: "b:c", d: "e" },
  });
});

test("parseYaml() refuses what it does not read, naming the line", () => {
  assert.throws(() => parseYaml("a: 1\nb: |\n  text\n"), /YAML line 2: .*block scalars/);
  assert.throws(() => parseYaml("a: &x 1\n"), /YAML line 1: anchors/);
  assert.throws(() => parseYaml("a:\n\tb: 1\n"), /YAML line 2: tabs/);
  assert.throws(() => parseYaml("a: 1\n  b: 2\n"), /YAML line 2: unexpected indentation/);
  assert.throws(() => parseYaml('a: "open\n'), /YAML line 1: unterminated string/);
});

test("loadKubeConfig() picks the context, reads files and inline data", async (t) => {
  const dir = await Deno.makeTempDir();
  try {
    await Deno.writeTextFile(`${dir}/ca.crt`, "CA PEM\n");
    await Deno.writeTextFile(`${dir}/token`, "file-token\n");
    const file = `${dir}/config`;
    await Deno.writeTextFile(
      file,
      `apiVersion: v1
kind: Config
current-context: a
clusters:
- name: c1
  cluster: {server: "https://10.0.0.1:6443/", certificate-authority: ca.crt}
- name: c2
  cluster:
    server: https://10.0.0.2:443
    certificate-authority-data: ${btoa("INLINE CA")}
users:
- name: u1
  user: {tokenFile: token}
- name: u2
  user:
    client-certificate-data: ${btoa("CERT")}
    client-key-data: ${btoa("KEY")}
- name: u3
  user:
    exec:
      apiVersion: client.authentication.k8s.io/v1beta1
      command: ${Deno.execPath()}
      args: [eval, "Deno.writeTextFileSync('${dir}/runs', 'x', {append: true}); console.log(JSON.stringify({status: {token: Deno.env.get('PLUGIN_TOKEN')}}))"]
      env:
      - name: PLUGIN_TOKEN
        value: from-plugin
- name: u4
  user: {}
contexts:
- name: a
  context: {cluster: c1, user: u1, namespace: evals}
- name: b
  context: {cluster: c2, user: u2}
- name: c
  context: {cluster: c2, user: u3}
- name: d
  context: {cluster: c2, user: u4}
`,
    );
    await t.step("current context: a token file, a CA file beside the kubeconfig", async () => {
      const c = await loadKubeConfig({ kubeconfig: file });
      assert.equal(c.server, "https://10.0.0.1:6443");
      assert.deepEqual(c.caCerts, ["CA PEM\n"]);
      assert.equal(await c.token!(), "file-token");
      assert.equal(c.namespace, "evals");
      assert.equal(c.inCluster, false);
    });
    await t.step("another context: inline CA and client certificate", async () => {
      const c = await loadKubeConfig({ kubeconfig: file, context: "b" });
      assert.deepEqual(c.caCerts, ["INLINE CA"]);
      assert.equal(c.cert, "CERT");
      assert.equal(c.key, "KEY");
      assert.equal(c.token, undefined);
      assert.equal(c.namespace, "default");
    });
    await t.step("a credential plugin, run once while its token lasts", async () => {
      const c = await loadKubeConfig({ kubeconfig: file, context: "c" });
      assert.equal(await c.token!(), "from-plugin");
      assert.equal(await c.token!(), "from-plugin");
      assert.equal(await Deno.readTextFile(`${dir}/runs`), "x", "the plugin ran more than once");
    });
    await t.step("refusals name the file and the way out", async () => {
      await assert.rejects(
        loadKubeConfig({ kubeconfig: file, context: "nope" }),
        /Cannot read the kubeconfig .*config: no context "nope"/,
      );
      await Deno.writeTextFile(
        `${dir}/insecure`,
        "current-context: x\ncontexts:\n- {name: x}\n",
      );
      await assert.rejects(
        loadKubeConfig({ kubeconfig: `${dir}/insecure` }),
        /Cannot read the kubeconfig/,
      );
      await Deno.writeTextFile(
        `${dir}/insecure`,
        `current-context: x
contexts:
- name: x
  context: {cluster: k}
clusters:
- name: k
  cluster: {server: "https://h:1", insecure-skip-tls-verify: true}
`,
      );
      await assert.rejects(
        loadKubeConfig({ kubeconfig: `${dir}/insecure` }),
        /insecure-skip-tls-verify is not supported; give the cluster's certificate-authority/,
      );
    });
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
