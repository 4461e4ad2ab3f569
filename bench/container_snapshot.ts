// Container snapshot figures for BENCHMARKS.md (issue 41): the commit of a
// container whose file system changed by `--files` files of `--bytes` each
// (default 10,000 files, 100 MiB together), and a fork: a container started
// from the snapshot's image, to ready (its server answers `hello`), beside a
// container of the image itself. Median of `--runs` rounds, each on a fresh
// container; Docker, and Podman when its socket is up. Root; engines
// started by .ci/engine/engine_up.sh. Prints a table and the load average.
//
//   deno run -A bench/container_snapshot.ts [--runs 5] [--files 10000] [--bytes 10486]

import { parseArgs } from "node:util";
import { connect } from "../client.ts";
import { buildForkImage, forkRuntime } from "../tests/engines/_snapshot_images.ts";

const { values } = parseArgs({
  args: Deno.args,
  options: {
    runs: { type: "string", default: "5" },
    files: { type: "string", default: "10000" },
    bytes: { type: "string", default: "10486" },
  },
});
const RUNS = Number(values.runs);
const FILES = Number(values.files);
const BYTES = Number(values.bytes);
const PODMAN = "/run/podman/podman.sock";

const load = () => Deno.readTextFileSync("/proc/loadavg").split(" ").slice(0, 3).join(" ");
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const ms = (x: number) => `${x.toFixed(0)} ms`;

interface Round {
  commit: number;
  fork: number;
  plain: number;
  bytes: number;
}

async function round(socket: string | undefined): Promise<Round> {
  const runtime = forkRuntime(socket);
  try {
    let t0 = performance.now();
    const source = await runtime.place();
    const plain = performance.now() - t0;
    {
      await using client = await connect(source);
      await client.startTask("fill", { files: FILES, bytes: BYTES }, {
        signal: AbortSignal.timeout(600_000),
      });
      await client.grade({ answer: "" });
    }
    t0 = performance.now();
    await using snapshot = await runtime.snapshot(source);
    const commit = performance.now() - t0;
    await source[Symbol.asyncDispose]();
    t0 = performance.now();
    const fork = await runtime.placeFrom(snapshot);
    const forked = performance.now() - t0;
    await fork[Symbol.asyncDispose]();
    return { commit, fork: forked, plain, bytes: snapshot.bytes };
  } finally {
    await runtime.close();
  }
}

async function engine(label: string, socket: string | undefined): Promise<string> {
  await buildForkImage(socket);
  const rounds: Round[] = [];
  for (let i = 0; i < RUNS; i++) rounds.push(await round(socket));
  const m = (k: keyof Round) => median(rounds.map((r) => r[k]));
  return `| ${label} | ${ms(m("commit"))} | ${ms(m("fork"))} | ${ms(m("plain"))} | ${
    (m("bytes") / 2 ** 20).toFixed(1)
  } MiB |`;
}

console.log(`load before: ${load()}; ${RUNS} rounds, ${FILES} files of ${BYTES} bytes`);
const rows = [await engine("Docker", undefined)];
if (await Deno.stat(PODMAN).then(() => true, () => false)) {
  rows.push(await engine("Podman", PODMAN));
}
console.log(
  "| engine | commit (`snapshot()`) | fork (`placeFrom()`, to ready) | container of the image, to ready | snapshot's `bytes` |",
);
console.log("| --- | --- | --- | --- | --- |");
for (const r of rows) console.log(r);
console.log(`load after: ${load()}`);
