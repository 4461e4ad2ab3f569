import { test } from "../_test.ts";
import { SSH_KEYGEN } from "../_counterparts.ts";
import assert from "node:assert/strict";
import {
  generateSshKeyPair,
  parseSshPublicKey,
  sshFingerprint,
  sshPublicKeyOf,
} from "../../ssh/mod.ts";

function run(cmd: string, args: string[]): { code: number; stdout: string; stderr: string } {
  const out = new Deno.Command(cmd, { args, stdout: "piped", stderr: "piped" }).outputSync();
  const dec = new TextDecoder();
  return { code: out.code, stdout: dec.decode(out.stdout), stderr: dec.decode(out.stderr) };
}

test("generateSshKeyPair() writes keys OpenSSH reads", { needs: [SSH_KEYGEN] }, async () => {
  const dir = await Deno.makeTempDir();
  try {
    const pair = await generateSshKeyPair({ comment: "me@test" });
    assert.match(pair.publicKey, /^ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI\S+ me@test$/);
    await Deno.writeTextFile(`${dir}/id`, pair.privateKey, { mode: 0o600 });
    const derived = run("ssh-keygen", ["-y", "-f", `${dir}/id`]);
    assert.equal(derived.code, 0, derived.stderr);
    assert.equal(derived.stdout.trim(), pair.publicKey);
    await Deno.writeTextFile(`${dir}/id.pub`, pair.publicKey + "\n");
    const fp = run("ssh-keygen", ["-l", "-f", `${dir}/id.pub`]);
    assert.equal(fp.stdout.split(" ")[1], await sshFingerprint(pair.publicKey));
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

test("sshPublicKeyOf() reads keys ssh-keygen wrote", { needs: [SSH_KEYGEN] }, async () => {
  const dir = await Deno.makeTempDir();
  try {
    const gen = run("ssh-keygen", ["-q", "-t", "ed25519", "-N", "", "-C", "kg", "-f", `${dir}/k`]);
    assert.equal(gen.code, 0, gen.stderr);
    const pub = (await Deno.readTextFile(`${dir}/k.pub`)).trim();
    assert.equal(sshPublicKeyOf(await Deno.readTextFile(`${dir}/k`)), pub);
    const parsed = parseSshPublicKey(pub);
    assert.equal(parsed.algorithm, "ssh-ed25519");
    assert.equal(parsed.key.length, 32);
    assert.equal(parsed.comment, "kg");
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

test("parseSshPublicKey() rejects what is not an Ed25519 key", () => {
  assert.throws(() => parseSshPublicKey("ssh-rsa AAAAB3NzaC1yc2E"), TypeError);
  assert.throws(() => parseSshPublicKey("ssh-ed25519 !!!"), TypeError);
  assert.throws(() => parseSshPublicKey("ssh-ed25519"), TypeError);
  assert.throws(() => sshPublicKeyOf("not a key"), TypeError);
  assert.throws(
    () =>
      sshPublicKeyOf(
        "-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n-----END OPENSSH PRIVATE KEY-----",
      ),
    TypeError,
  );
});
