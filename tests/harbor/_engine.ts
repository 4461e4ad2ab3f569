// What the Harbor tests share about the engine: the containers this process
// left. (Whether they can run is the ENGINE counterpart, tests/_counterparts.ts.)

import { EngineClient } from "../../engines/_engine.ts";
import { OWNER_LABEL } from "../../engines/mod.ts";

/** The containers, running or not, that this process's runtimes made (by owner label). */
export async function containersLeft(): Promise<string[]> {
  using engine = await EngineClient.open();
  const filters = encodeURIComponent(JSON.stringify({ label: [`${OWNER_LABEL}=${Deno.pid}`] }));
  const list = await engine.call("GET", `/containers/json?all=true&filters=${filters}`) as {
    Id: string;
  }[];
  return list.map((c) => c.Id);
}
