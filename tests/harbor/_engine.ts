// What the Harbor tests share about the engine: whether they can run (an
// engine socket; in CI they must), and the containers this process left.

import { EngineClient, findEngineSocket } from "../../engines/_engine.ts";
import { OWNER_LABEL } from "../../engines/mod.ts";

/**
 * Whether a test file must be skipped: no engine socket, outside CI (in CI a
 * missing engine fails the tests instead). Says so, naming the file.
 */
export function skipWithoutEngine(file: string): boolean {
  let socket: string | null = null;
  try {
    socket = findEngineSocket();
  } catch {
    socket = null;
  }
  const skip = socket === null && Deno.env.get("CI") !== "true";
  if (skip) console.log(`${file}: skipped: no engine socket`);
  return skip;
}

/** The containers, running or not, that this process's runtimes made (by owner label). */
export async function containersLeft(): Promise<string[]> {
  using engine = await EngineClient.open();
  const filters = encodeURIComponent(JSON.stringify({ label: [`${OWNER_LABEL}=${Deno.pid}`] }));
  const list = await engine.call("GET", `/containers/json?all=true&filters=${filters}`) as {
    Id: string;
  }[];
  return list.map((c) => c.Id);
}
