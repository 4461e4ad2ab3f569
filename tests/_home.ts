// Each test module runs with a HOME of its own, an empty temporary
// directory removed when the module ends. A login shell (the SSH server runs
// commands with `bash -l`) otherwise sources the host user's profile, which
// on the build machines runs `pyenv init`: seconds per command on a loaded
// machine, and 60 s when a shell killed mid-rehash left pyenv's lock behind.
// Deno's cache stays where it was, so `deno run` children do not start cold.

const realHome = Deno.env.get("HOME");
if (realHome !== undefined && Deno.build.os !== "windows") {
  if (Deno.env.get("DENO_DIR") === undefined) {
    const cache = Deno.env.get("XDG_CACHE_HOME") ?? `${realHome}/.cache`;
    Deno.env.set("DENO_DIR", `${cache}/deno`);
  }
  const home = Deno.makeTempDirSync({ prefix: "hud-test-home-" });
  Deno.env.set("HOME", home);
  globalThis.addEventListener("unload", () => {
    Deno.env.set("HOME", realHome);
    try {
      Deno.removeSync(home, { recursive: true });
    } catch {
      // A test left something locked in it: the OS cleans /tmp.
    }
  });
}
