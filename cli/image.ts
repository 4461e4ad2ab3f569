// `hud image FILE --tag NAME`: build a container image of an environment
// module with the local engine.

import { loadEnvironment } from "../loader.ts";
import { buildEnvironmentImage } from "../engines/image.ts";
import { buildBaseImage } from "../engines/_base_image.ts";
import { EXIT_OK, type Io, parseCommand, PROGRAM, stringOption, UsageError } from "./_common.ts";

/** The help of `hud image`. */
export const USAGE: string =
  `Usage: ${PROGRAM} image FILE --tag NAME [--env NAME] [--from IMAGE] [--socket PATH]
       ${PROGRAM} image base --tag NAME [--socket PATH]

Builds an OCI image of the environment in FILE with the local engine, with no
registry: Deno's binary and the libraries it links, FILE and its local
imports, and this command line, serving on port 8765 with the token the
runtime passes in HUD_SERVE_TOKEN. Labels: dev.hud.env, dev.hud.env.version.
Imports that FILE's deno.json maps ("@hud/sdk", "@hud/sdk/agents"...) are
mapped in the image too; one that does not resolve refuses the build.

"image base" builds a base image for --from: FROM scratch, this machine's
bash, coreutils, grep, sed, bc, bwrap, setpriv, prlimit and env, with the
libraries they link (what a workspace needs in a container).

Options:
  --tag NAME      the image name (required)
  --env NAME      the environment, by export or environment name
  --from IMAGE    base image (one with bash and coreutils, for workspaces,
                  such as "${PROGRAM} image base" makes); Deno's libraries are
                  added to it; default: scratch (Deno and its libraries only)
  --socket PATH   the engine's socket (default: DOCKER_HOST, then
                  /var/run/docker.sock, then Podman's)
  -h, --help      show this help
`;

/** Runs `hud image` with `args` (after the command name); returns the exit code. */
export async function run(args: string[], io: Io): Promise<number> {
  const parsed = parseCommand(args, {
    name: "image",
    usage: USAGE,
    options: {
      tag: { type: "string" },
      env: { type: "string" },
      from: { type: "string" },
      socket: { type: "string" },
    },
    positionals: { names: ["FILE"], min: 1 },
  }, io);
  if (parsed === null) return EXIT_OK;
  const { values, positionals: [file] } = parsed;
  const tag = stringOption(values, "tag");
  if (tag === undefined) {
    throw new UsageError(`--tag is required (see "${PROGRAM} image --help")`);
  }
  if (file === "base") {
    if (values.env !== undefined || values.from !== undefined) {
      throw new UsageError(`"image base" takes only --tag and --socket`);
    }
    const id = await buildBaseImage(tag, {
      socket: stringOption(values, "socket"),
      signal: io.signal,
    });
    io.out(`${tag} ${id}\n`);
    return EXIT_OK;
  }
  const env = await loadEnvironment(file, { name: stringOption(values, "env") });
  const id = await buildEnvironmentImage(file, tag, {
    envName: env.name,
    envVersion: env.version,
    from: stringOption(values, "from"),
    socket: stringOption(values, "socket"),
    signal: io.signal,
  });
  io.out(`${tag} ${id}\n`);
  return EXIT_OK;
}
