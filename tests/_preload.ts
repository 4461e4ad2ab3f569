// Preloaded into every test module by `deno task test` (and `ok`): every
// test gets a deadline (tests/_deadline.ts) and a HOME of its own
// (tests/_home.ts).
import "./_deadline.ts";
import "./_home.ts";
