// The program an image made by buildEnvironmentImage starts: this SDK's
// `serve` command for the environment module, run in this process.
//
//   deno run -A _container_main.ts CLI_PATH MODULE_PATH
//
// With HUD_CONTROL_SOCKET set (ContainerRuntime sets it), the container may
// have no network at all: the server listens on the container's loopback
// only, and this program relays the unix socket at that path (in a
// directory the engine bind-mounts from the runtime's host) to it. Without
// it (a swarm replica, HUD's DockerRuntime), the server listens on every
// interface, to be published by the engine, and without authentication
// when it is given no token either (HUD's runtimes send none).
//
// The CLI is loaded by the path the image gives, not imported: this is a
// program launching another, not a library module depending on the CLI.

import { Relay } from "./_relay.ts";
import { errorMessage } from "../_internal/util.ts";
import { CONTAINER_PORT, CONTROL_SOCKET_VAR } from "./_constants.ts";

const [cli, module] = Deno.args;
if (cli === undefined || module === undefined) {
  console.error("usage: _container_main.ts CLI_PATH MODULE_PATH");
  Deno.exit(2);
}
const socket = Deno.env.get(CONTROL_SOCKET_VAR);
Deno.env.delete(CONTROL_SOCKET_VAR);
let relay: Relay | null = null;
if (socket) {
  relay = new Relay(
    { transport: "unix", path: socket },
    { transport: "tcp", hostname: "127.0.0.1", port: CONTAINER_PORT },
    (err) => console.error(`warning: control relay: ${errorMessage(err)}`),
  );
  // The runtime's side may run as another user than this container's.
  await Deno.chmod(socket, 0o666);
}
const { main } = await import(new URL(cli, `file://${Deno.cwd()}/`).href) as {
  main(args: string[]): Promise<number>;
};
const code = await main([
  "serve",
  module,
  "--port",
  String(CONTAINER_PORT),
  ...(socket ? ["--host", "127.0.0.1"] : ["--host", "0.0.0.0", "--no-auth-without-token"]),
]);
await relay?.close();
Deno.exit(code);
