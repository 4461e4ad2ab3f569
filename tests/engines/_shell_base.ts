// The base image `hud image base` makes (engines/_base_image.ts), for the
// engine tests: this machine's shell tools and their libraries.

import { buildBaseImage } from "../../engines/_base_image.ts";

/**
 * Builds the base image as `tag` on the engine at `socket` (default: the
 * default one), with `extra` files (path in the image: content, mode 0755).
 */
export async function buildShellBase(
  tag: string,
  socket?: string,
  extra: Record<string, Uint8Array> = {},
): Promise<void> {
  await buildBaseImage(tag, { socket, extra, signal: AbortSignal.timeout(240_000) });
}
