// Intentionally empty: the start-up floor is `deno run` of this file.
