// The viewer page's script, as text. It builds every element with DOM calls
// and puts data in only as text nodes or attribute values, never as markup,
// so agent output cannot inject anything. Kept free of backticks and "${"
// so that it can live in a template literal.
//
// It computes no figures of its own: which attempts count, and every count,
// mean and pass@k, come from the server's summary (eval/_summary.ts, the
// summarizer behind `eval`, `report` and `Job`). The page only formats them
// and draws the rows it is given.

/** The page script. */
export const CLIENT_JS: string = String.raw`
"use strict";
(function () {
  performance.mark("hud-script-start");
  var ROW_H = 30, OVERSCAN = 12, TASKS_SHOWN = 100, SVGNS = "http://www.w3.org/2000/svg";
  var boot = JSON.parse(document.getElementById("hud-data").textContent);
  var FIELDS = boot.fields;
  function unpack(a, i) {
    var o = { i: i, old: false };
    for (var k = 0; k < FIELDS.length; k++) o[FIELDS[k]] = a[k];
    return o;
  }
  // A row names the attempt it replaced; that one is history from then on.
  function addRows(file, packed) {
    for (var j = 0; j < packed.length; j++) {
      var r = unpack(packed[j], file.rows.length);
      file.rows.push(r);
      if (r.prev !== null && file.rows[r.prev]) file.rows[r.prev].old = true;
    }
  }
  function groupOf(file, r) { return r.group !== null ? r.group : (file.head ? file.head.id : "") + ":" + r.task; }
  var files = boot.files.map(function (f) {
    var file = {
      name: f.name, rows: [], records: f.records || null, generation: f.generation || 0,
      head: f.summary || null, tasks: f.summary && f.summary.tasks ? f.summary : null,
      subscores: f.subscores || [],
    };
    addRows(file, f.rows || []);
    return file;
  });
  var live = boot.live === true;
  // The live viewer's requests carry its token (the page came with it).
  function api(path) {
    return fetch(path, { headers: boot.token ? { authorization: "Bearer " + boot.token } : {} });
  }
  var main = document.getElementById("main");
  var state = { sort: { key: "i", dir: 1 }, filter: "", view: null, showOld: false, allTasks: false };
  var renderId = 0;

  // ------------------------------------------------------------ readiness
  // data-ready="1" once everything a view shows is on the page: for
  // screenshots and tests, never a half-drawn page.
  function notReady() { document.documentElement.dataset.ready = "0"; }
  function ready(id, view) {
    if (id !== renderId) return;
    document.documentElement.dataset.view = view;
    document.documentElement.dataset.ready = "1";
    // For benchmarks: when the first view was wholly drawn.
    if (!performance.getEntriesByName("hud-ready").length) performance.mark("hud-ready");
  }

  // ------------------------------------------------------------ elements
  function put(el, attrs, kids) {
    if (attrs) {
      for (var k in attrs) {
        var v = attrs[k];
        if (v === null || v === undefined || v === false) continue;
        if (k === "text") el.textContent = String(v);
        else if (k === "class") el.setAttribute("class", v);
        else if (k.slice(0, 2) === "on") el.addEventListener(k.slice(2), v);
        else el.setAttribute(k, String(v));
      }
    }
    function add(c) {
      if (c === null || c === undefined || c === false || c === "") return;
      if (Array.isArray(c)) c.forEach(add);
      else el.appendChild(typeof c === "string" || typeof c === "number" ? document.createTextNode(String(c)) : c);
    }
    add(kids);
    return el;
  }
  // replaceChildren() would write a null as the text "null": leave it out.
  function fill(el, kids) { el.replaceChildren.apply(el, kids.filter(function (k) { return k !== null && k !== undefined && k !== "" && k !== false; })); }
  function h(tag, attrs) { return put(document.createElement(tag), attrs, Array.prototype.slice.call(arguments, 2)); }
  function s(tag, attrs) { return put(document.createElementNS(SVGNS, tag), attrs, Array.prototype.slice.call(arguments, 2)); }

  // ------------------------------------------------------------ numbers for people
  // Three significant digits on the page; the JSON keeps them exact.
  function sig(x) {
    if (typeof x !== "number" || !isFinite(x)) return "\u2013";
    if (x === 0) return "0";
    if (Math.abs(x) >= 1e5) return count(x);
    return String(Number(x.toPrecision(3)));
  }
  function count(n) {
    if (typeof n !== "number" || !isFinite(n)) return "\u2013";
    var a = Math.abs(n);
    if (a < 10000) return String(Math.round(n));
    if (a < 1e6) return Number((n / 1e3).toPrecision(3)) + "k";
    return Number((n / 1e6).toPrecision(3)) + "M";
  }
  function fmtMs(ms) {
    if (typeof ms !== "number" || !isFinite(ms)) return "\u2013";
    if (ms < 1000) return sig(ms) + " ms";
    if (ms < 120000) return sig(ms / 1000) + " s";
    if (ms < 7200000) return sig(ms / 60000) + " min";
    return sig(ms / 3600000) + " h";
  }
  function fmtMean(m, se) { return m === null || m === undefined ? "\u2013" : sig(m) + (se === null || se === undefined ? "" : " \u00b1 " + sig(se)); }
  // B − A, with a difference below float noise (two means of the same rewards, summed in
  // another order) counted as none: it would be "worse", in red, for nothing.
  function change(a, b) { var d = b - a; return Math.abs(d) <= 1e-9 * Math.max(Math.abs(a), Math.abs(b)) ? 0 : d; }
  function fmtDelta(d) { return d === null ? "\u2013" : (d > 0 ? "+" : d < 0 ? "\u2212" : "\u00b1") + sig(Math.abs(d)); }
  function plural(n, one, many) { return n + " " + (n === 1 ? one : (many || one + "s")); }
  function lines(text) { return text === "" ? 0 : text.split("\n").length; }
  function textOf(content) {
    if (content === null || content === undefined) return "";
    if (typeof content === "string") return content;
    if (Array.isArray(content)) {
      return content.map(function (p) {
        if (typeof p === "string") return p;
        if (p && typeof p.text === "string") return p.text;
        return p && p.type ? "[" + p.type + "]" : "";
      }).join("\n");
    }
    return JSON.stringify(content, null, 2);
  }
  function isObj(v) { return v !== null && typeof v === "object" && !Array.isArray(v); }

  // ------------------------------------------------------------ summaries
  function tasksOf(f) {
    var file = files[f];
    if (file.tasks) return Promise.resolve(file.tasks);
    if (!live) return Promise.resolve(null);
    return api("api/summary?file=" + f).then(function (res) {
      if (!res.ok) throw new Error("HTTP " + res.status);
      return res.json();
    }).then(function (summary) { file.tasks = summary; return summary; });
  }

  // ------------------------------------------------------------ navigation
  function nav() {
    var links = files.map(function (f, i) {
      return h("li", null, h("a", { href: "#/f/" + i, "aria-current": state.view === "f" + i ? "page" : null }, f.name));
    });
    if (files.length > 1) {
      links.push(h("li", null, h("a", { href: "#/compare/0/1", "aria-current": state.view === "compare" ? "page" : null }, "Compare")));
    }
    var el = document.getElementById("files");
    el.replaceChildren.apply(el, links);
  }

  function route() {
    var id = ++renderId;
    notReady();
    var parts = (location.hash || "#/f/0").slice(2).split("/");
    if (parts[0] === "r" && files[+parts[1]]) return showRollout(id, +parts[1], +parts[2]);
    if (parts[0] === "compare" && files.length > 1) return showCompare(id, +parts[1] || 0, parts[2] === undefined ? 1 : +parts[2]);
    var f = parts[0] === "f" && files[+parts[1]] ? +parts[1] : 0;
    showJob(id, f);
  }

  // ------------------------------------------------------------ plots
  // Inline SVG, drawn from the numbers given: no library, nothing fetched.
  var PW = 360, PH = 170, PL = 40, PR = 10, PT = 10, PB = 34;
  function plot(title, desc, draw) {
    var svg = s("svg", { viewBox: "0 0 " + PW + " " + PH, role: "img", "aria-label": title + ": " + desc, class: "plot" },
      s("title", { text: title + ": " + desc }));
    draw(svg);
    return h("figure", { class: "plot" }, h("figcaption", null, title), svg, h("p", { class: "muted small" }, desc));
  }
  function axes(svg, yMax, yFmt, whole) {
    var x0 = PL, x1 = PW - PR, y0 = PH - PB, y1 = PT;
    // Counts get whole ticks: 0, the middle when it is whole, the top.
    var ticks = whole ? (yMax % 2 === 0 ? [0, yMax / 2, yMax] : [0, yMax]) : [0, yMax / 2, yMax];
    ticks.forEach(function (v) {
      var y = y0 - (yMax ? v / yMax : 0) * (y0 - y1);
      svg.appendChild(s("line", { x1: x0, x2: x1, y1: y, y2: y, class: "grid" }));
      svg.appendChild(s("text", { x: x0 - 4, y: y + 3, class: "tick", "text-anchor": "end", text: yFmt(v) }));
    });
    svg.appendChild(s("line", { x1: x0, x2: x0, y1: y0, y2: y1, class: "axis" }));
  }
  function bars(svg, items, opts) {
    // items: [{label, value, cls, title}]
    var yMax = Math.max.apply(null, items.map(function (b) { return b.value; }).concat([1]));
    axes(svg, yMax, count, true);
    var every = Math.ceil(items.length / (opts.labels || 14));
    var x0 = PL, w = (PW - PR - PL) / Math.max(1, items.length), y0 = PH - PB, hgt = y0 - PT;
    items.forEach(function (b, j) {
      var bh = yMax > 0 ? b.value / yMax * hgt : 0;
      svg.appendChild(s("rect", { x: x0 + j * w + w * 0.12, y: y0 - bh, width: Math.max(1, w * 0.76), height: bh, class: "bar " + (b.cls || "") },
        s("title", { text: b.title || (b.label + ": " + b.value) })));
      if (j % every === 0) {
        svg.appendChild(s("text", { x: x0 + j * w + w / 2, y: y0 + 13, class: "tick", "text-anchor": "middle", text: b.label }));
      }
    });
    if (opts.xLabel) svg.appendChild(s("text", { x: (PL + PW - PR) / 2, y: PH - 4, class: "label", "text-anchor": "middle", text: opts.xLabel }));
  }
  function isGradedRow(r) { return r.graded === undefined ? r.reward !== null : r.graded; }
  function rewardPlot(rows) {
    var graded = rows.filter(isGradedRow);
    var errored = rows.length - graded.length;
    var distinct = {};
    graded.forEach(function (r) { distinct[r.reward] = (distinct[r.reward] || 0) + 1; });
    var keys = Object.keys(distinct).map(Number).sort(function (a, b) { return a - b; });
    var items;
    if (keys.length <= 12) {
      items = keys.map(function (k) { return { label: sig(k), value: distinct[k], cls: k >= 1 ? "pass" : k > 0 ? "partial" : "zero", title: distinct[k] + " rollouts with reward " + sig(k) }; });
    } else {
      var lo = Math.min(0, keys[0]), hi = Math.max(1, keys[keys.length - 1]), n = 10, counts = [];
      for (var b = 0; b < n; b++) counts.push(0);
      graded.forEach(function (r) { counts[Math.min(n - 1, Math.floor((r.reward - lo) / (hi - lo) * n))]++; });
      items = counts.map(function (c, b) { var a = lo + b * (hi - lo) / n; return { label: sig(a), value: c, title: c + " rollouts with reward " + sig(a) + " to " + sig(a + (hi - lo) / n) }; });
    }
    if (errored) items.push({ label: "errored", value: errored, cls: "err", title: errored + " rollouts not graded" });
    return plot("Reward distribution", plural(graded.length, "graded rollout") + (errored ? ", " + errored + " errored" : ""), function (svg) {
      bars(svg, items, { xLabel: "reward" });
    });
  }
  function durationPlot(rows) {
    var ds = rows.map(function (r) { return r.duration; }).filter(function (d) { return typeof d === "number"; });
    if (!ds.length) return null;
    var max = Math.max.apply(null, ds), n = 12, counts = [];
    for (var b = 0; b < n; b++) counts.push(0);
    ds.forEach(function (d) { counts[max > 0 ? Math.min(n - 1, Math.floor(d / max * n)) : 0]++; });
    var items = counts.map(function (c, b) { return { label: fmtMs(b * max / n), value: c, title: c + " rollouts took " + fmtMs(b * max / n) + " to " + fmtMs((b + 1) * max / n) }; });
    var sorted = ds.slice().sort(function (a, b) { return a - b; });
    return plot("Durations", "median " + fmtMs(sorted[Math.floor(sorted.length / 2)]) + ", longest " + fmtMs(max), function (svg) {
      bars(svg, items, { xLabel: "rollout wall time", labels: 4 });
    });
  }
  function passPlot(head) {
    var ks = Object.keys(head.pass_at || {}).map(Number).sort(function (a, b) { return a - b; });
    if (ks.length < 2) return null;
    return plot("pass@k", "the chance that one of k rollouts of a task passes, k = 1 to " + ks[ks.length - 1], function (svg) {
      axes(svg, 1, sig);
      var x0 = PL, x1 = PW - PR, y0 = PH - PB, hgt = y0 - PT;
      var pts = [];
      ks.forEach(function (k, j) {
        var v = head.pass_at[String(k)];
        if (v === null) return;
        var x = x0 + (ks.length === 1 ? 0.5 : j / (ks.length - 1)) * (x1 - x0 - 20) + 10, y = y0 - v * hgt;
        pts.push(x + "," + y);
        svg.appendChild(s("circle", { cx: x, cy: y, r: 3.5, class: "dot" }, s("title", { text: "pass@" + k + " " + sig(v) })));
        if (ks.length <= 12 || j % Math.ceil(ks.length / 8) === 0) svg.appendChild(s("text", { x: x, y: y0 + 13, class: "tick", "text-anchor": "middle", text: String(k) }));
      });
      svg.insertBefore(s("polyline", { points: pts.join(" "), class: "line" }), svg.firstChild.nextSibling);
      svg.appendChild(s("text", { x: (PL + PW - PR) / 2, y: PH - 4, class: "label", "text-anchor": "middle", text: "k (rollouts per task)" }));
    });
  }
  // A task's arguments in one line, as a tooltip or a table cell shows them.
  function argsText(args) { return JSON.stringify(args === undefined ? {} : args); }
  function cut(text, n) { return text.length > n ? text.slice(0, n - 1) + "\u2026" : text; }
  function taskPlot(tasks) {
    var ts = tasks.filter(function (t) { return t.mean_reward !== null; });
    if (!ts.length) return null;
    if (ts.length <= 24) {
      var rowH = 16, height = ts.length * rowH + 26, labelW = 130;
      var svg = s("svg", { viewBox: "0 0 " + PW + " " + height, role: "img", class: "plot", "aria-label": "Mean reward per task" }, s("title", { text: "Mean reward per task" }));
      var x0 = labelW, x1 = PW - 40, lo = Math.min(0, Math.min.apply(null, ts.map(function (t) { return t.mean_reward; }))), hi = Math.max(1, Math.max.apply(null, ts.map(function (t) { return t.mean_reward; })));
      function X(v) { return x0 + (v - lo) / (hi - lo) * (x1 - x0); }
      [lo, (lo + hi) / 2, hi].forEach(function (v) {
        svg.appendChild(s("line", { x1: X(v), x2: X(v), y1: 4, y2: height - 20, class: "grid" }));
        svg.appendChild(s("text", { x: X(v), y: height - 8, class: "tick", "text-anchor": "middle", text: sig(v) }));
      });
      ts.forEach(function (t, j) {
        var y = 6 + j * rowH, v = t.mean_reward;
        svg.appendChild(s("text", { x: x0 - 6, y: y + 10, class: "tick", "text-anchor": "end", text: t.slug.length > 22 ? t.slug.slice(0, 21) + "\u2026" : t.slug }, s("title", { text: t.slug + " " + argsText(t.args) })));
        svg.appendChild(s("rect", { x: Math.min(X(0), X(v)), y: y + 2, width: Math.max(1, Math.abs(X(v) - X(0))), height: rowH - 5, class: "bar " + (v >= 1 ? "pass" : v > 0 ? "partial" : "zero") },
          s("title", { text: t.slug + " " + argsText(t.args) + ": " + fmtMean(v, t.stderr) + " (" + t.passes + "/" + t.runs + " pass)" })));
        if (t.stderr !== null) svg.appendChild(s("line", { x1: X(v - t.stderr), x2: X(v + t.stderr), y1: y + rowH / 2, y2: y + rowH / 2, class: "whisker" }));
        svg.appendChild(s("text", { x: x1 + 4, y: y + 10, class: "tick", text: sig(v) }));
      });
      return h("figure", { class: "plot wide" }, h("figcaption", null, "Mean reward per task"), svg,
        h("p", { class: "muted small" }, plural(ts.length, "task") + "; whiskers \u00b1 one standard error"));
    }
    // Many tasks: their means sorted, as one profile.
    var means = ts.map(function (t) { return t.mean_reward; }).sort(function (a, b) { return b - a; });
    var lo2 = Math.min(0, means[means.length - 1]), hi2 = Math.max(1, means[0]);
    return plot("Mean reward per task", plural(means.length, "task") + ", best first", function (svg) {
      axes(svg, hi2, sig);
      var x0 = PL, x1 = PW - PR, y0 = PH - PB, hgt = y0 - PT, step = Math.max(1, Math.floor(means.length / 400)), pts = [x0 + "," + y0];
      for (var j = 0; j < means.length; j += step) {
        var x = x0 + j / (means.length - 1 || 1) * (x1 - x0), y = y0 - (means[j] - lo2) / (hi2 - lo2) * hgt;
        pts.push(x + "," + y);
      }
      pts.push(x1 + "," + (y0 - (means[means.length - 1] - lo2) / (hi2 - lo2) * hgt), x1 + "," + y0);
      svg.appendChild(s("polygon", { points: pts.join(" "), class: "area" }));
      svg.appendChild(s("text", { x: (PL + PW - PR) / 2, y: PH - 4, class: "label", "text-anchor": "middle", text: "tasks, sorted by mean reward" }));
    });
  }

  // ------------------------------------------------------------ the job page
  function agentText(agent) {
    if (!agent) return "\u2013";
    if (agent.kind === "model") return "model \u201c" + agent.name + "\u201d";
    if (agent.kind === "command") return "command " + agent.name;
    return agent.kind + " " + agent.name;
  }
  function settingsText(settings) {
    if (!isObj(settings)) return "";
    return Object.keys(settings).map(function (k) {
      var v = settings[k];
      return k.replace(/_/g, " ") + " " + (Array.isArray(v) ? v.join(", ") : typeof v === "number" ? sig(v) : String(v));
    }).join(" \u00b7 ");
  }
  function jobFacts(file, head) {
    var rows = file.rows.filter(function (r) { return !r.old; });
    function item(label, value, id) { return [h("dt", null, label), h("dd", { id: id }, value)]; }
    var k = head.group_size, passes = [];
    for (var j = 1; j <= k; j++) if (j === 1 || j === k) passes.push("pass@" + j + " " + sig(head.pass_at[String(j)]));
    function byPhase(o) { return Object.keys(o || {}).map(function (p) { return p + " " + o[p]; }).join(", "); }
    var classes = byPhase(head.errored_by_class), failed = byPhase(head.failures_by_class);
    // One denominator for the mean and pass@k, named: the graded rollouts.
    var meanWords = " over " + plural(head.graded, "graded rollout") + (head.errored ? "; " + head.errored + " errored, not in the mean" : "");
    var over = head.pass_at_tasks || {}, tasksN = file.tasks && file.tasks.tasks ? file.tasks.tasks.length : null;
    var passWords = " over graded rollouts, as the mean" + (head.errored ? " (errored ones left out)" : "") +
      (tasksN !== null && k > 1 && over[String(k)] !== undefined && over[String(k)] < tasksN ? "; pass@" + k + " over the " + over[String(k)] + " tasks with " + k : "");
    var common = head.common_failure;
    var tokens = head.input_tokens === null && head.output_tokens === null ? null
      : count(head.input_tokens || 0) + " in, " + count(head.output_tokens || 0) + " out";
    var perRollout = head.total ? " (" + sig(head.model_calls / head.total) + " per rollout)" : "";
    var subs = Object.keys(head.subscores || {});
    return h("dl", { class: "summary facts" },
      item("Agent", [h("strong", null, agentText(head.agent)), head.agent && head.agent.settings ? h("span", { class: "muted" }, " " + settingsText(head.agent.settings)) : ""], "s-agent"),
      item("Environment", head.env ? head.env.name + (head.env.version ? " " + head.env.version : "") : "\u2013", "s-env"),
      item("Rollouts", head.total + " (" + head.graded + " graded" + (head.superseded ? "; " + plural(head.superseded, "earlier attempt") + " replaced, not counted" : "") + ")", "s-total"),
      common ? item("Every rollout errored", [h("strong", null, common.class), " (" + common.meaning + "): " + common.message, h("br"), h("span", { class: "muted" }, "What to do: " + common.action)], "s-common") : null,
      [h("dt", null, "Mean reward"), h("dd", null, h("span", { id: "s-mean" }, fmtMean(head.mean_reward, head.stderr)), h("span", { class: "muted", id: "s-mean-over" }, meanWords))],
      [h("dt", null, "pass@k"), h("dd", null, h("span", { id: "s-pass" }, k > 0 ? passes.join(", ") : "\u2013"), k > 0 ? h("span", { class: "muted", id: "s-pass-over" }, passWords) : "")],
      subs.length ? item("Subscores", subs.map(function (n) { return n + " " + sig(head.subscores[n]); }).join(", "), "s-subscores") : null,
      item("Errored", head.errored + (classes ? " (" + classes + ")" : "") + (failed && failed !== classes ? "; failures: " + failed : ""), "s-errored"),
      head.model_calls ? item("Steps", plural(head.model_calls, "model call") + perRollout + ", " + plural(head.tool_calls, "tool call"), "s-steps") : item("Steps", plural(head.steps, "trace step"), "s-steps"),
      item("Tokens", tokens === null ? "not reported" : tokens, "s-tokens"),
      item("Cost", head.cost_usd === null ? "not reported" : "$" + sig(head.cost_usd), "s-cost"),
      item("Wall time", fmtMs(head.wall_ms) + (head.mean_duration_ms !== null ? " (mean rollout " + fmtMs(head.mean_duration_ms) + ")" : ""), "s-duration"),
      rows.length !== head.total ? item("Note", "the table has " + rows.length + " rows", null) : null);
  }

  function taskTable(summary, f) {
    var names = Object.keys(summary.subscores || {});
    var tasks = summary.tasks;
    var shown = state.allTasks ? tasks : tasks.slice(0, TASKS_SHOWN);
    var replaced = tasks.some(function (t) { return t.superseded > 0; });
    var failing = tasks.some(function (t) { return t.first_error; });
    var head = ["Task", "Args", "Runs", "Mean reward", "Passes"].concat(names).concat(replaced ? ["Replaced"] : []).concat(failing ? ["First error"] : []);
    var numeric = function (j) { return j > 1 && !(failing && j === head.length - 1); };
    return h("section", { "aria-labelledby": "tasks-h" },
      h("h2", { id: "tasks-h" }, "Tasks"),
      h("table", { id: "tasks", class: "tasks" },
        h("caption", null, tasks.length > shown.length ? "The first " + shown.length + " of " + tasks.length + " tasks" : plural(tasks.length, "task")),
        h("thead", null, h("tr", null, head.map(function (t, j) { return h("th", { scope: "col", class: numeric(j) ? "num" : null }, t); }))),
        h("tbody", null, shown.map(function (t) {
          return h("tr", { class: t.mean_reward === null ? "failed" : t.mean_reward >= 1 ? "pass" : t.mean_reward > 0 ? "partial" : "zero" },
            h("th", { scope: "row" }, h("a", { href: "#/f/" + f, onclick: function (e) { e.preventDefault(); state.filter = t.slug; route(); } }, t.slug)),
            h("td", { class: "task-args", title: argsText(t.args) }, h("code", null, cut(argsText(t.args), 60))),
            h("td", { class: "num" }, t.runs + (t.errored ? " (" + t.errored + " errored)" : "")),
            h("td", { class: "num reward" }, fmtMean(t.mean_reward, t.stderr)),
            h("td", { class: "num" }, t.passes + "/" + t.runs),
            names.map(function (n) { return h("td", { class: "num" }, Object.prototype.hasOwnProperty.call(t.subscores, n) ? sig(t.subscores[n]) : "\u2013"); }),
            replaced ? h("td", { class: "num" }, t.superseded ? String(t.superseded) : "") : null,
            failing ? h("td", { class: "error", title: t.first_error || "" }, t.first_error || "") : null);
        }))),
      tasks.length > shown.length ? h("p", null, h("button", { type: "button", onclick: function () { state.allTasks = true; route(); } }, "Show all " + tasks.length + " tasks")) : "");
  }

  // Rollouts that started from one workspace snapshot are branches of it:
  // a group per snapshot, its ancestry, its figures (the summary's) and a
  // link to each of its rollouts.
  function branchList(file, f, head) {
    var snaps = head && head.snapshots ? head.snapshots : [];
    if (!snaps.length) return null;
    var rows = file.rows.filter(function (r) { return !r.old && r.snap; });
    return h("section", { "aria-labelledby": "branches-h", id: "branches" },
      h("h2", { id: "branches-h" }, "Snapshots"),
      h("p", { class: "muted" }, "Rollouts that started from one workspace snapshot, as its branches."),
      snaps.map(function (sn) {
        var kids = rows.filter(function (r) { return r.snap === sn.id; });
        return h("div", { class: "snapshot", "data-snapshot": sn.id },
          h("h3", null, h("code", null, sn.id), sn.parents.length ? h("span", { class: "muted parents" }, " after " + sn.parents.join(" \u2190 ")) : ""),
          h("p", { class: "muted" }, plural(sn.rollouts, "rollout") + ", " + sn.graded + " graded; mean reward " + sig(sn.mean_reward) + ", best " + sig(sn.best_reward)),
          h("ul", { class: "branches" }, kids.map(function (r) {
            return h("li", { class: "branch", "data-i": r.i }, h("a", { href: "#/r/" + f + "/" + r.i }, r.task + " \u00b7 repeat " + (r.repeat + 1)), " \u2014 reward " + sig(r.reward));
          })));
      }));
  }

  var table = null;
  function columnsFor(file, head) {
    var k = head ? head.group_size : 1;
    var anyCalls = file.rows.some(function (r) { return r.calls > 0; });
    var anyTokens = file.rows.some(function (r) { return r.tokens !== null; });
    var cols = [
      { key: "task", label: "Task", w: 17, cell: function (r, f) { return h("a", { href: "#/r/" + f + "/" + r.i }, r.task); } },
      { key: "args", label: "Args", w: 14, title: function (r) { return r.args; }, text: function (r) { return r.args; } },
      { key: "repeat", label: "Repeat", w: 9, num: true, title: function (r) { return "group " + groupOf(file, r) + (r.attempt > 1 ? ", attempt " + r.attempt : ""); },
        text: function (r) { return (r.repeat + 1) + (k > 1 ? " of " + k : "") + (r.attempt > 1 ? " \u00b7 try " + r.attempt : ""); } },
      { key: "reward", label: "Reward", w: 7, num: true, cls: "reward", text: function (r) { return sig(r.reward); } },
    ];
    if (file.subscores.length) {
      cols.push({ key: "sub", label: "Subscores", w: 14, sortable: false, text: function (r) {
        return r.sub ? file.subscores.map(function (n, j) { return r.sub[j] === null || r.sub[j] === undefined ? null : n + " " + sig(r.sub[j]); }).filter(Boolean).join(", ") : "";
      }, title: function (r) { return r.sub ? file.subscores.map(function (n, j) { return r.sub[j] === undefined ? null : n + ": " + r.sub[j]; }).filter(Boolean).join("\n") : ""; } });
    }
    cols.push({ key: "status", label: "Status", w: 10, cls: "status", text: function (r) { return (r.old ? "replaced: " : "") + r.status + (r.class ? " (" + r.class + ")" : r.phase ? " (" + r.phase + ")" : ""); } });
    cols.push({ key: "duration", label: "Duration", w: 8, num: true, text: function (r) { return fmtMs(r.duration); } });
    if (anyCalls) cols.push({ key: "calls", label: "Steps", w: 6, num: true, title: function (r) { return r.calls + " model calls, " + r.tools + " tool calls"; }, text: function (r) { return String(r.calls); } });
    if (anyTokens) cols.push({ key: "tokens", label: "Tokens", w: 7, num: true, text: function (r) { return count(r.tokens); } });
    cols.push({ key: "error", label: "Error", cls: "error", title: function (r) { return r.error; }, text: function (r) { return r.error; } });
    return cols;
  }

  function showJob(id, f) {
    state.view = "f" + f;
    nav();
    var file = files[f];
    var head = file.head || (file.tasks ? file.tasks : null);
    var cols = columnsFor(file, head);
    var filter = h("input", { id: "filter", type: "search", value: state.filter, placeholder: "task, args, status, error\u2026",
      oninput: function (e) { state.filter = e.target.value; table.update(); } });
    var oldCount = file.rows.filter(function (r) { return r.old; }).length;
    var old = oldCount ? h("label", { class: "toggle" }, h("input", { type: "checkbox", id: "show-old", checked: state.showOld ? "" : null,
      onchange: function (e) { state.showOld = e.target.checked; table.update(); } }), " show " + plural(oldCount, "replaced attempt")) : "";
    var caption = h("caption", { id: "count", "aria-live": "polite" });
    var colgroup = h("colgroup", null, cols.map(function (c) { return h("col", { style: c.w ? "width:" + c.w + "%" : null }); }));
    var headRow = h("tr", null, cols.map(function (c) {
      var sorted = state.sort.key === c.key;
      return h("th", { scope: "col", "data-key": c.key, class: c.num ? "num" : null, "aria-sort": c.sortable === false ? null : sorted ? (state.sort.dir > 0 ? "ascending" : "descending") : "none" },
        c.sortable === false ? c.label : h("button", { type: "button", onclick: function () {
          state.sort = { key: c.key, dir: state.sort.key === c.key ? -state.sort.dir : 1 };
          route();
        } }, c.label, h("span", { class: "arrow", "aria-hidden": "true" }, sorted ? (state.sort.dir > 0 ? " \u25b2" : " \u25bc") : "")));
    }));
    var tbody = h("tbody");
    var scroller = h("div", { class: "scroller", tabindex: "0", role: "region", "aria-label": "Rollouts" },
      h("table", { id: "rollouts" }, caption, colgroup, h("thead", null, headRow), tbody));
    var facts = h("div", { id: "facts" }, head ? jobFacts(file, head) : "");
    var plots = h("div", { class: "plots", id: "plots" }, h("div", { class: "plot-slot" }), h("div", { class: "plot-slot" }), h("div", { class: "plot-slot" }));
    var tasksSlot = h("div", { id: "tasks-slot" });
    var branchesSlot = h("div", { id: "branches-slot" });
    main.replaceChildren(
      h("section", { "aria-labelledby": "sum-h" }, h("h2", { id: "sum-h" }, "Job " + (head && head.id ? head.id : "") + " \u00b7 " + file.name), facts),
      h("section", { "aria-label": "Plots" }, plots),
      tasksSlot,
      branchesSlot,
      h("section", { "aria-labelledby": "roll-h" }, h("h2", { id: "roll-h" }, "Rollouts"),
        h("p", { class: "tools" }, h("label", { for: "filter" }, "Filter "), filter, " ", old), scroller));
    var view = [];
    var shown = { start: -1, end: -1, len: -1 };
    function compare(a, b) {
      var key = state.sort.key, x = a[key], y = b[key];
      if (x === y) return a.i - b.i;
      if (x === null || x === undefined || x === "") return 1;
      if (y === null || y === undefined || y === "") return -1;
      return (x < y ? -1 : 1) * state.sort.dir;
    }
    function paint(force) {
      var top = scroller.scrollTop, height = scroller.clientHeight || 600;
      var start = Math.max(0, Math.floor(top / ROW_H) - OVERSCAN);
      var end = Math.min(view.length, Math.ceil((top + height) / ROW_H) + OVERSCAN);
      if (!force && start === shown.start && end === shown.end && view.length === shown.len) return;
      shown = { start: start, end: end, len: view.length };
      var out = [h("tr", { class: "spacer", "aria-hidden": "true", style: "height:" + start * ROW_H + "px" })];
      for (var j = start; j < end; j++) {
        var r = view[j];
        out.push(h("tr", { class: "row " + (r.old ? "old " : "") + (r.phase || !isGradedRow(r) ? "failed" : r.reward >= 1 ? "pass" : r.reward > 0 ? "partial" : "zero"), "aria-rowindex": j + 2, "data-i": r.i },
          cols.map(function (c) {
            return h("td", { class: (c.num ? "num " : "") + (c.cls || ""), title: c.title ? c.title(r) : null }, c.cell ? c.cell(r, f) : c.text(r));
          })));
      }
      out.push(h("tr", { class: "spacer", "aria-hidden": "true", style: "height:" + (view.length - end) * ROW_H + "px" }));
      tbody.replaceChildren.apply(tbody, out);
    }
    function update() {
      var q = state.filter.trim().toLowerCase();
      var counted = 0;
      view = file.rows.filter(function (r) {
        if (!r.old) counted++;
        if (r.old && !state.showOld) return false;
        return !q || (r.task + " " + r.args + " " + r.status + " " + (r.phase || "") + " " + (r.class || "") + " " + r.error + " " + (r.group || "")).toLowerCase().indexOf(q) >= 0;
      });
      view.sort(compare);
      document.getElementById("rollouts").setAttribute("aria-rowcount", String(view.length + 1));
      caption.textContent = "Showing " + view.length + " of " + counted + " rollouts" + (state.showOld ? " (with replaced attempts)" : "");
      // A short table gets a short box; a long one scrolls inside 70% of the window.
      scroller.style.height = Math.min(Math.round(window.innerHeight * 0.7), (view.length + 2) * ROW_H + 12) + "px";
      paint(true);
    }
    function drawSummary() {
      // Plots and the task table need the per-task lines; the live page
      // fetches them once the table is up.
      return tasksOf(f).then(function (summary) {
        if (id !== renderId) return;
        var counted = file.rows.filter(function (r) { return !r.old; });
        var h2 = file.head || summary;
        if (summary && !file.head) facts.replaceChildren(jobFacts(file, summary));
        var figs = [rewardPlot(counted), summary ? taskPlot(summary.tasks) : null, durationPlot(counted), h2 ? passPlot(h2) : null].filter(Boolean);
        fill(plots, figs);
        fill(tasksSlot, [summary && summary.tasks.length ? taskTable(summary, f) : null]);
        fill(branchesSlot, [branchList(file, f, h2)]);
        ready(id, "job");
      }, function (err) {
        if (id !== renderId) return;
        plots.replaceChildren(h("p", { class: "error", role: "alert" }, "Cannot load the summary: " + err.message));
        ready(id, "job");
      });
    }
    scroller.addEventListener("scroll", function () { requestAnimationFrame(function () { paint(false); }); });
    table = { file: f, update: update, refresh: function () {
      if (file.head) facts.replaceChildren(jobFacts(file, file.head));
      update();
      notReady();
      drawSummary();
    } };
    update();
    // For benchmarks: when the table first showed, in ms since navigation.
    if (!performance.getEntriesByName("hud-table-ready").length) performance.mark("hud-table-ready");
    drawSummary();
  }

  // ------------------------------------------------------------ one rollout
  function diffCounts(patch) {
    var add = 0, del = 0;
    String(patch.patch || "").split("\n").forEach(function (l) {
      if (l.slice(0, 3) === "+++" || l.slice(0, 3) === "---") return;
      if (l[0] === "+") add++;
      else if (l[0] === "-") del++;
    });
    return { add: add, del: del };
  }
  // A file-tracking result's patches: a flush nests its diff (HUD's shape,
  // { diff: { patches }, capture }); the other kinds hold them directly.
  function patchesOf(c) {
    if (!isObj(c)) return [];
    var d = isObj(c.diff) ? c.diff : c;
    return Array.isArray(d.patches) ? d.patches : [];
  }
  function diffBlock(patch, open) {
    var n = diffCounts(patch);
    var body = function () {
      var ls = String(patch.patch || "").split("\n");
      if (ls.length && ls[ls.length - 1] === "") ls.pop();
      return patch.patch ? h("pre", { class: "diff" }, ls.map(function (l) {
        var cls = l.slice(0, 3) === "+++" || l.slice(0, 3) === "---" ? "meta" : l[0] === "+" ? "add" : l[0] === "-" ? "del" : l.slice(0, 2) === "@@" ? "hunk" : "ctx";
        return h("span", { class: "line " + cls }, l + "\n");
      })) : h("p", { class: "muted" }, "no content shown (" + (patch.status === "deleted" ? "removed" : count(patch.size_after) + " bytes") + ")");
    };
    var d = h("details", { class: "file", open: open ? "" : null },
      h("summary", null, h("code", null, patch.path), " ", h("span", { class: "badge" }, patch.status || ""), " ",
        h("span", { class: "adds" }, "+" + n.add), " ", h("span", { class: "dels" }, "\u2212" + n.del)));
    // Closed diffs are built when first opened: a big setup stays cheap.
    if (open) d.appendChild(body());
    else d.addEventListener("toggle", function once() { if (d.open && d.children.length === 1) d.appendChild(body()); });
    return d;
  }

  function offsetOf(step, t0) {
    var t = Date.parse(step.timestamp);
    return isNaN(t) || isNaN(t0) ? null : t - t0;
  }

  function longText(text, cls, limit, open) {
    // Long output opens on demand, so one tool result is not a wall; open
    // (true or false) decides instead: a failed check's output is what the
    // reader came for, a passed one's is not.
    var n = lines(text);
    if (open === undefined && n <= (limit || 12) && text.length < 2000) return h("pre", { class: cls || "text" }, text);
    return h("details", { class: "long", open: open ? "" : null }, h("summary", null, plural(n, "line") + ", " + count(text.length) + " characters"), h("pre", { class: cls || "text" }, text));
  }

  function commandArgument(args) {
    // A command is shown as a command, anything else as JSON once.
    if (isObj(args)) {
      var keys = Object.keys(args);
      var code = ["command", "cmd", "script", "code"].filter(function (k) { return typeof args[k] === "string"; })[0];
      if (code && keys.length <= 3) {
        var rest = {};
        keys.forEach(function (k) { if (k !== code) rest[k] = args[k]; });
        return [h("pre", { class: "code" }, h("code", null, args[code])), Object.keys(rest).length ? h("pre", { class: "args" }, JSON.stringify(rest, null, 2)) : ""];
      }
      if (keys.length === 1 && typeof args[keys[0]] === "string") return h("div", { class: "arg" }, h("span", { class: "muted" }, keys[0] + ": "), h("span", { class: "text" }, args[keys[0]]));
    }
    return h("pre", { class: "args" }, JSON.stringify(args, null, 2));
  }

  // Screenshots a tool returned (the computer tool's) are files beside the
  // results file, served by the live viewer; the point the action went to
  // is drawn on the picture (the picture is in the model's coordinates, as
  // the action's are).
  var shownFile = 0;
  function shots(images, args) {
    return h("div", { class: "shots" }, images.map(function (im) {
      var name = isObj(im) && typeof im.file === "string" ? im.file : "";
      if (!live || !/^[0-9a-f]{64}\.[a-z]+$/.test(name)) return h("p", { class: "muted small" }, "screenshot " + name + " (in the results file's .files directory)");
      var img = h("img", { src: "files/" + name + "?file=" + shownFile + "&token=" + encodeURIComponent(boot.token || ""), alt: "the screen after the action" });
      var fig = h("figure", { class: "shot" }, img);
      img.addEventListener("load", function () { markAction(fig, img, args); });
      return fig;
    }));
  }
  function markAction(fig, img, args) {
    if (!isObj(args) || !img.naturalWidth) return;
    var points = [args.start_coordinate, args.coordinate].filter(function (p) { return Array.isArray(p) && p.length === 2; });
    points.forEach(function (p, k) {
      var dot = h("span", { class: "mark" + (k < points.length - 1 ? " from" : ""), title: String(args.action) + " at " + p[0] + ", " + p[1] });
      dot.style.left = (100 * p[0] / img.naturalWidth) + "%";
      dot.style.top = (100 * p[1] / img.naturalHeight) + "%";
      fig.appendChild(dot);
    });
  }

  function toolCall(call, result) {
    var args = call.arguments, parsed = args;
    if (typeof args === "string") {
      try { parsed = args.trim() === "" ? {} : JSON.parse(args); } catch (e) { parsed = null; }
    }
    var body = parsed === null ? h("pre", { class: "args" }, String(args)) : commandArgument(parsed);
    var res = null;
    if (result) {
      result.shown = true;
      var text = textOf(result.content && result.content.result);
      var info = result.info || {};
      var failed = info.is_error === true;
      var meta = plural(lines(text), "line") + (typeof info.latency_ms === "number" ? " \u00b7 " + fmtMs(info.latency_ms) : "") + (failed ? " \u00b7 error" : "");
      res = h("details", { class: "result" + (failed ? " failed" : ""), open: lines(text) <= 12 && text.length < 2000 ? "" : null },
        h("summary", null, "Result ", h("span", { class: "muted" }, meta)), h("pre", { class: "text" }, text));
      var images = result.content && result.content.images;
      if (Array.isArray(images) && images.length) res = [res, shots(images, parsed)];
    }
    return h("div", { class: "call" }, h("div", { class: "call-head" }, h("span", { class: "tool-name" }, call.name || (call.function && call.function.name) || "tool"), " ", h("span", { class: "muted small" }, call.id || "")), body, res);
  }

  function message(role, body, meta, at) {
    return h("li", { class: "msg msg-" + role },
      h("div", { class: "msg-head" }, h("span", { class: "role" }, role), meta ? h("span", { class: "muted small" }, " " + meta) : "", at !== null && at !== undefined ? h("time", null, "+" + fmtMs(at)) : ""),
      body);
  }
  function eventItem(kind, text, at, cls) {
    return h("li", { class: "event " + (cls || "") }, h("span", { class: "role" }, kind), " ", h("span", null, text), at !== null && at !== undefined ? h("time", null, "+" + fmtMs(at)) : "");
  }
  function kvList(obj, open) {
    // Scalars inline; text as text (open: as longText); anything nested as JSON on demand.
    var inline = [], blocks = [];
    Object.keys(obj).forEach(function (k) {
      var v = obj[k];
      if (v === null || typeof v === "number" || typeof v === "boolean") inline.push(k.replace(/_/g, " ") + " " + (typeof v === "number" ? sig(v) : String(v)));
      else if (typeof v === "string") { if (v.indexOf("\n") < 0 && v.length < 120) inline.push(k.replace(/_/g, " ") + " " + (v === "" ? "(empty)" : v)); else blocks.push(h("div", null, h("div", { class: "muted small" }, k), longText(v, "text", undefined, open))); }
      else if (Array.isArray(v) && v.every(function (x) { return typeof x === "number"; })) inline.push(k.replace(/_/g, " ") + ": " + plural(v.length, "value"));
      else blocks.push(h("details", { class: "json" }, h("summary", null, k), h("pre", { class: "args" }, JSON.stringify(v, null, 2))));
    });
    return [inline.length ? h("p", { class: "kv" }, inline.join(" \u00b7 ")) : "", blocks];
  }

  function b64Length(text) {
    var pad = text.slice(-2) === "==" ? 2 : text.slice(-1) === "=" ? 1 : 0;
    return Math.floor((text.length * 3 / 4 - pad) / 4);
  }
  function b64Floats(text) {
    try {
      var bin = atob(text), view = new DataView(new ArrayBuffer(bin.length)), out = [];
      for (var j = 0; j < bin.length; j++) view.setUint8(j, bin.charCodeAt(j));
      for (var k = 0; k + 4 <= bin.length; k += 4) out.push(view.getFloat32(k, true));
      return out;
    } catch (e) { return []; }
  }

  function modelMeta(info) {
    if (!isObj(info)) return "";
    var parts = [];
    if (info.model) parts.push(String(info.model));
    if (typeof info.input_tokens === "number") parts.push(count(info.input_tokens) + " in / " + count(info.output_tokens || 0) + " out tokens");
    if (typeof info.cost_usd === "number") parts.push("$" + sig(info.cost_usd));
    if (typeof info.latency_ms === "number") parts.push(fmtMs(info.latency_ms));
    if (info.finish_reason) parts.push(String(info.finish_reason));
    if (info.attempts > 1) parts.push(info.attempts + " attempts");
    // ChatAgent's tokens (eval/tokens.ts: base64 of little-endian int32 and
    // float32, the prompt past what it shares with the previous call): counts too.
    if (isObj(info.tokens)) {
      var tk = info.tokens;
      if (typeof tk.completion_ids === "string") parts.push("completion token ids: " + b64Length(tk.completion_ids));
      if (typeof tk.prompt_ids === "string") parts.push("prompt token ids: " + ((tk.prompt_shared || 0) + b64Length(tk.prompt_ids)));
      if (typeof tk.logprobs === "string") {
        var lps = b64Floats(tk.logprobs);
        parts.push("logprobs: " + lps.length + (lps.length ? ", mean " + sig(lps.reduce(function (a, b) { return a + b; }, 0) / lps.length) : ""));
      }
    }
    // Token ids and log-probabilities stay compact: a count, not a wall.
    Object.keys(info).forEach(function (k) {
      var v = info[k];
      if (Array.isArray(v) && v.length && v.every(function (x) { return typeof x === "number"; })) {
        var mean = v.reduce(function (a, b) { return a + b; }, 0) / v.length;
        parts.push(k.replace(/_/g, " ") + ": " + v.length + (/logprob/.test(k) ? ", mean " + sig(mean) : ""));
      }
    });
    return parts.join(" \u00b7 ");
  }

  function conversation(trace) {
    var steps = trace.steps || [];
    var t0 = Date.parse(trace.started_at);
    var results = {};
    steps.forEach(function (st) { if (st.type === "tool" && isObj(st.content) && st.content.id) results[st.content.id] = st; });
    // The model read the system prompt before the task's: the first request's system messages
    // go before the prompt, at its time (they come in the model step, after it).
    var prompt = null, promptIndex = -1, promptTime = null, modelSeen = false, items = [];
    steps.forEach(function (st) {
      var at = offsetOf(st, t0), c = st.content, info = st.info || {};
      var type = String(st.type);
      if (type === "setup") items.push(eventItem("task", (isObj(c) ? c.id + " " + JSON.stringify(c.args || {}) : "") + (info.env_version ? " \u00b7 environment " + info.env_version : ""), at, "muted"));
      else if (type === "user") { prompt = textOf(c); promptIndex = items.length; promptTime = at; items.push(message("user", longText(prompt, "text", 40), "prompt", at)); }
      else if (type === "model" && isObj(c)) {
        var first = !modelSeen;
        modelSeen = true;
        (c.request || []).forEach(function (m) {
          if (m.role === "system") {
            if (first && promptIndex >= 0) items.splice(promptIndex++, 0, message("system", longText(textOf(m.content), "text", 6), null, promptTime));
            else items.push(message("system", longText(textOf(m.content), "text", 6), null, at));
          }
          else if (m.role === "user") { if (textOf(m.content) !== prompt) items.push(message("user", longText(textOf(m.content), "text", 40), null, at)); }
          else if (m.role === "tool") { if (!results[m.tool_call_id]) items.push(message("tool", longText(textOf(m.content), "text"), m.tool_call_id || "", at)); }
          else items.push(message(String(m.role), longText(textOf(m.content), "text"), null, at));
        });
        var reply = isObj(c.reply) ? c.reply : {};
        var calls = reply.tool_calls || [];
        var said = textOf(reply.content);
        items.push(message("assistant", [said ? h("div", { class: "text" }, said) : "",
          calls.map(function (call) {
            var fn = call.function || {};
            return toolCall({ id: call.id, name: fn.name || call.name, arguments: fn.arguments !== undefined ? fn.arguments : call.arguments }, results[call.id]);
          })], modelMeta(info), at));
      } else if (type === "tool") {
        if (!st.shown && isObj(c)) items.push(message("tool", toolCall({ id: c.id, name: c.name, arguments: c.arguments }, st), null, at));
      } else if (type === "command") {
        var stderr = typeof info.stderr === "string" ? info.stderr : "";
        items.push(message("agent", [h("p", null, info.signal ? "The command was killed by " + info.signal : "The command exited with code " + info.code),
          stderr ? h("details", { class: "result", open: lines(stderr) <= 12 ? "" : null }, h("summary", null, "stderr ", h("span", { class: "muted" }, plural(lines(stderr), "line"))), h("pre", { class: "text" }, stderr)) : h("p", { class: "muted" }, "nothing on stderr")],
          "command", at));
      } else if (type === "agent") items.push(message("answer", c === null || c === undefined ? h("p", { class: "muted" }, "no answer") : longText(textOf(c), "text content", 40), "graded", at));
      else if (type === "evaluate") items.push(eventItem("grade", isObj(c) ? "score " + sig(c.score !== undefined ? c.score : c.reward) : "", at, "grade"));
      else if (type.slice(0, 13) === "filetracking.") {
        var ps = patchesOf(c);
        var fs = isObj(c) && Array.isArray(c.files) ? c.files : [];
        var what = type === "filetracking.setup" ? "starting files: " + plural(ps.length || fs.length, "file") : ps.length ? ps.map(function (p) { var n = diffCounts(p); return p.path + " +" + n.add + " \u2212" + n.del; }).join(", ") : "snapshot of " + plural(fs.length, "file");
        items.push(eventItem("files", what, at, "files"));
      } else if (type === "error") items.push(eventItem("error", (info.phase || "?") + " phase, " + (info.name || "Error") + ": " + textOf(c), at, "error"));
      else if (type === "cancel") items.push(eventItem("cancelled", "the task was cancelled", at, "error"));
      else if (type === "refusal") items.push(message("refusal", longText(textOf(c), "text"), null, at));
      else items.push(message(type, [typeof c === "string" ? longText(c, "text") : isObj(c) ? kvList(c) : c === undefined || c === null ? "" : longText(textOf(c), "text"), isObj(st.info) ? kvList(st.info) : ""], null, at));
    });
    return h("ol", { class: "conversation", id: "conversation" }, items);
  }

  function gradeSection(steps) {
    var ev = steps.filter(function (st) { return st.type === "evaluate" && isObj(st.content); }).pop();
    if (!ev) return null;
    var c = ev.content;
    var score = c.score !== undefined ? c.score : c.reward;
    var parts = [h("p", { class: "score-line" }, "Score ", h("strong", { class: "score", id: "r-score" }, sig(score)))];
    if (isObj(c.subscores) && Object.keys(c.subscores).length) {
      var names = Object.keys(c.subscores);
      parts.push(h("table", { class: "subscores" }, h("caption", null, "Subscores"),
        h("thead", null, h("tr", null, h("th", { scope: "col" }, "Name"), h("th", { scope: "col", class: "num" }, "Score"), h("th", { scope: "col" }, ""))),
        h("tbody", null, names.map(function (k) {
          var v = c.subscores[k], depth = k.split("/").length - 1;
          var w = typeof v === "number" ? Math.max(0, Math.min(1, v)) * 120 : 0;
          return h("tr", null, h("th", { scope: "row", style: "padding-left:" + (0.5 + depth) + "rem" }, depth ? k.split("/").pop() : k),
            h("td", { class: "num" }, sig(v)),
            h("td", null, s("svg", { width: 124, height: 10, class: "meter", "aria-hidden": "true" }, s("rect", { x: 0, y: 1, width: 120, height: 8, class: "track" }), s("rect", { x: 0, y: 1, width: w, height: 8, class: "bar " + (v >= 1 ? "pass" : v > 0 ? "partial" : "zero") }))));
        }))));
    }
    var info = isObj(c.info) ? c.info : {};
    // A check that failed shows its output open, one that passed folded (a penalty fails at 1).
    var failed = function (value, weight) { return typeof value !== "number" ? undefined : typeof weight === "number" && weight < 0 ? value > 0 : value < 1; };
    if (Array.isArray(info.breakdown)) {
      var node = function (n) {
        var nInfo = isObj(n.info) ? n.info : {};
        return h("li", null, h("div", null, h("strong", null, String(n.name)), " ", sig(n.value), typeof n.weight === "number" ? h("span", { class: "muted" }, " \u00d7 " + sig(n.weight)) : ""),
          kvList(nInfo, failed(n.value, n.weight)), Array.isArray(n.children) && n.children.length ? h("ul", { class: "breakdown" }, n.children.map(node)) : "");
      };
      parts.push(h("h4", null, "What the checks saw"), h("ul", { class: "breakdown" }, info.breakdown.map(node)));
    }
    var rest = {};
    Object.keys(info).forEach(function (k) { if (k !== "breakdown") rest[k] = info[k]; });
    if (Object.keys(rest).length) parts.push(h("div", { class: "grade-info" }, kvList(rest, failed(score))));
    if (c.content !== undefined && c.content !== null) parts.push(h("div", null, h("div", { class: "muted small" }, "The grader said"), longText(textOf(c.content), "text")));
    return h("section", { "aria-labelledby": "grade-h", id: "grade" }, h("h3", { id: "grade-h" }, "Grade"), parts);
  }

  function timeline(trace) {
    var steps = trace.steps || [];
    var t0 = Date.parse(trace.started_at), t1 = Date.parse(trace.ended_at);
    if (isNaN(t0) || isNaN(t1) || t1 <= t0) return null;
    var total = t1 - t0;
    function at(type) { var st = steps.filter(function (x) { return x.type === type; })[0]; return st ? offsetOf(st, t0) : null; }
    var user = at("user"), answer = at("agent"), graded = at("evaluate");
    var phases = [];
    if (user !== null) phases.push({ name: "start", from: 0, to: user });
    if (user !== null) phases.push({ name: "agent", from: user, to: answer !== null ? answer : total });
    if (answer !== null) phases.push({ name: "grading", from: answer, to: graded !== null ? graded : total });
    var W = 1000, X = function (ms) { return ms / total * W; };
    var lanes = steps.some(function (x) { return x.type === "model" || x.type === "tool"; });
    var svg = s("svg", { viewBox: "0 0 " + W + " " + (lanes ? 44 : 22), preserveAspectRatio: "none", class: "timeline" + (lanes ? "" : " short"), role: "img", "aria-label": "Timeline of " + fmtMs(total) });
    phases.forEach(function (p) {
      svg.appendChild(s("rect", { x: X(p.from), y: 2, width: Math.max(1, X(p.to - p.from)), height: 18, class: "phase phase-" + p.name }, s("title", { text: p.name + " " + fmtMs(p.to - p.from) })));
    });
    steps.forEach(function (st) {
      var end = offsetOf(st, t0), info = st.info || {};
      if (end === null || (st.type !== "model" && st.type !== "tool")) return;
      var dur = typeof info.latency_ms === "number" ? info.latency_ms : 0;
      svg.appendChild(s("rect", { x: X(Math.max(0, end - dur)), y: st.type === "model" ? 24 : 34, width: Math.max(2, X(dur)), height: 8, class: "span span-" + st.type },
        s("title", { text: st.type + " " + fmtMs(dur) })));
    });
    var legend = phases.map(function (p) { return h("span", { class: "legend legend-" + p.name }, p.name + " " + fmtMs(p.to - p.from)); });
    var models = steps.filter(function (x) { return x.type === "model"; }), tools = steps.filter(function (x) { return x.type === "tool"; });
    function busy(xs) { return xs.reduce(function (a, x) { return a + ((x.info && x.info.latency_ms) || 0); }, 0); }
    if (models.length) legend.push(h("span", { class: "legend legend-model" }, plural(models.length, "model call") + " " + fmtMs(busy(models))));
    if (tools.length) legend.push(h("span", { class: "legend legend-tool" }, plural(tools.length, "tool call") + " " + fmtMs(busy(tools))));
    return h("section", { "aria-labelledby": "time-h" }, h("h3", { id: "time-h" }, "Timeline ", h("span", { class: "muted" }, fmtMs(total))), svg, h("p", { class: "legends" }, legend));
  }

  function filesSection(steps) {
    var agentSteps = steps.filter(function (st) { return (st.type === "filetracking.diff" || st.type === "filetracking.flush") && patchesOf(st.content).length; });
    var setup = steps.filter(function (st) { return st.type === "filetracking.setup" && isObj(st.content); });
    var snaps = steps.filter(function (st) { return st.type === "filetracking.snapshot" && isObj(st.content) && Array.isArray(st.content.files); });
    if (!agentSteps.length && !setup.length && !snaps.length) return null;
    var parts = [];
    var patches = [];
    agentSteps.forEach(function (st) { patchesOf(st.content).forEach(function (p) { patches.push(p); }); });
    parts.push(h("h4", null, "Changed by the agent"), patches.length ? h("div", { id: "agent-diffs" }, patches.map(function (p) { return diffBlock(p, true); })) : h("p", { class: "muted" }, "no change"));
    setup.forEach(function (st) {
      var ps = patchesOf(st.content);
      var added = ps.reduce(function (a, p) { return a + diffCounts(p).add; }, 0);
      parts.push(h("details", { class: "setup", id: "setup-files" },
        h("summary", null, "Starting files, set up by the environment: " + plural(ps.length, "file") + ", " + plural(added, "line")),
        h("div", null, ps.map(function (p) { return diffBlock(p, false); }))));
    });
    snaps.forEach(function (st) {
      parts.push(h("details", { class: "setup" }, h("summary", null, "Snapshot: " + plural(st.content.files.length, "file")),
        h("ul", { class: "files" }, st.content.files.map(function (fl) { return h("li", null, h("code", null, fl.path), " " + count(fl.size) + " bytes"); }))));
    });
    return h("section", { "aria-labelledby": "files-h", id: "files-section" }, h("h3", { id: "files-h" }, "Files"), parts);
  }

  function history(f, i) {
    var rows = files[f].rows, row = rows[i];
    if (!row) return null;
    var chain = [row];
    for (var r = row; r.prev !== null && rows[r.prev]; r = rows[r.prev]) chain.unshift(rows[r.prev]);
    for (var j = i + 1, last = row; j < rows.length; j++) {
      if (rows[j].prev === last.i) { chain.push(rows[j]); last = rows[j]; }
    }
    if (chain.length < 2) return null;
    return h("p", { class: "history", id: "r-history" }, row.old ? h("strong", null, "This attempt was replaced by a later one and is not counted. ") : "",
      "Attempts of this rollout: ", chain.map(function (a, n) {
        var label = "#" + a.attempt + " " + a.status + (a.reward !== null ? " " + sig(a.reward) : "");
        return [n ? " \u2192 " : "", a.i === i ? h("strong", null, label) : h("a", { href: "#/r/" + f + "/" + a.i }, label)];
      }));
  }

  function showRollout(id, f, i) {
    state.view = "r";
    nav();
    main.replaceChildren(h("p", { class: "muted" }, "Loading rollout " + i + "\u2026"));
    getRecord(f, i).then(function (rec) {
      if (id !== renderId) return;
      shownFile = f;
      var trace = rec.trace || {};
      var steps = trace.steps || [];
      var row = files[f].rows[i] || {};
      var setup = steps.filter(function (st) { return st.type === "setup" && isObj(st.info) && typeof st.info.env_version === "string"; })[0];
      var envVersion = setup ? setup.info.env_version : "";
      var errors = (trace.errors || []).map(function (e) {
        return h("li", null, h("strong", null, e.phase + ": "), (e.class ? "[" + e.class + "] " : "") + e.name + ": " + e.message + (e.at ? " (at " + e.at + ")" : ""),
          e.stack ? h("pre", { class: "args" }, e.stack) : "");
      });
      var agent = rec.agent;
      var tokens = row.tokens === null || row.tokens === undefined ? null : count(row.tokens);
      var raw = h("details", { class: "raw" }, h("summary", null, "The record as JSON"));
      raw.addEventListener("toggle", function () { if (raw.open && raw.children.length === 1) raw.appendChild(h("pre", { class: "args" }, JSON.stringify(rec, null, 2))); });
      var k = files[f].head ? files[f].head.group_size : 0;
      var fromSnap = isObj(trace.from_snapshot) ? trace.from_snapshot : null;
      fill(main, [
        h("p", null, h("a", { href: "#/f/" + f }, "\u2190 Job " + files[f].name)),
        h("h2", { id: "rollout-h" }, rec.task.slug, h("span", { class: "muted" }, " \u00b7 repeat " + (rec.repeat + 1) + (k > 1 ? " of " + k : ""))),
        history(f, i),
        h("dl", { class: "summary facts" },
          h("dt", null, "Reward"), h("dd", { id: "r-reward" }, sig(rec.reward)),
          h("dt", null, "Status"), h("dd", { id: "r-status" }, rec.status + (rec.failed_phase ? " (" + rec.failed_phase + " failed)" : "") + (trace.stop_reason ? ", " + trace.stop_reason : "") + (row.class ? "; " + row.class + (row.graded === false ? ", not graded: its reward is not counted" : "") : "")),
          h("dt", null, "Duration"), h("dd", null, fmtMs(row.duration)),
          h("dt", null, "Agent"), h("dd", { id: "r-agent" }, agentText(agent), agent && agent.settings ? h("span", { class: "muted" }, " " + settingsText(agent.settings)) : ""),
          row.calls ? [h("dt", null, "Steps"), h("dd", null, plural(row.calls, "model call") + ", " + plural(row.tools, "tool call") + (tokens ? ", " + tokens + " tokens" : ""))] : "",
          h("dt", null, "Args"), h("dd", null, h("code", null, JSON.stringify(rec.task.args))),
          h("dt", null, "Environment"), h("dd", { id: "r-env" }, String(rec.task.env) + (envVersion ? " " + envVersion : "")),
          fromSnap ? [h("dt", null, "Started from"), h("dd", { id: "r-from" }, h("code", null, String(fromSnap.id)),
            Array.isArray(fromSnap.parents) && fromSnap.parents.length ? h("span", { class: "muted" }, " after " + fromSnap.parents.join(" \u2190 ")) : "")] : ""),
        errors.length ? h("section", { "aria-labelledby": "err-h" }, h("h3", { id: "err-h" }, "Errors"), h("ul", { class: "errors" }, errors)) : "",
        gradeSection(steps),
        timeline(trace),
        h("section", { "aria-labelledby": "conv-h" }, h("h3", { id: "conv-h" }, "Conversation"), conversation(trace)),
        filesSection(steps),
        raw]);
      ready(id, "rollout");
    }, function (err) {
      if (id !== renderId) return;
      main.replaceChildren(h("p", { class: "error", role: "alert" }, "Cannot load rollout " + i + ": " + err.message));
      ready(id, "rollout");
    });
  }

  function getRecord(f, i) {
    var file = files[f];
    if (file.records) return Promise.resolve(file.records[i]);
    return api("api/record?file=" + f + "&i=" + i).then(function (res) {
      if (!res.ok) throw new Error("HTTP " + res.status);
      return res.json();
    });
  }

  // ------------------------------------------------------------ comparison
  function deltaPlot(rows) {
    var ds = rows.filter(function (r) { return r.d !== null; }).sort(function (p, q) { return q.d - p.d; });
    if (!ds.length) return null;
    var max = Math.max.apply(null, ds.map(function (r) { return Math.abs(r.d); }).concat([0.01]));
    return plot("Change per task", ds.length + " tasks in both, best gain first", function (svg) {
      var x0 = PL, x1 = PW - PR, mid = (PT + PH - PB) / 2, half = (PH - PB - PT) / 2, w = (x1 - x0) / ds.length;
      svg.appendChild(s("line", { x1: x0, x2: x1, y1: mid, y2: mid, class: "axis" }));
      svg.appendChild(s("text", { x: x0 - 4, y: PT + 6, class: "tick", "text-anchor": "end", text: "+" + sig(max) }));
      svg.appendChild(s("text", { x: x0 - 4, y: PH - PB, class: "tick", "text-anchor": "end", text: "\u2212" + sig(max) }));
      ds.forEach(function (r, j) {
        var hh = Math.abs(r.d) / max * half;
        svg.appendChild(s("rect", { x: x0 + j * w + w * 0.1, y: r.d >= 0 ? mid - hh : mid, width: Math.max(1, w * 0.8), height: Math.max(r.d === 0 ? 1 : 0, hh), class: "bar " + (r.d > 0 ? "pass" : r.d < 0 ? "zero" : "") },
          s("title", { text: r.task + ": " + fmtDelta(r.d) })));
      });
      svg.appendChild(s("text", { x: (PL + PW - PR) / 2, y: PH - 4, class: "label", "text-anchor": "middle", text: "mean reward B \u2212 A, per task" }));
    });
  }

  function showCompare(id, a, b) {
    state.view = "compare";
    nav();
    if (!files[a] || !files[b]) { a = 0; b = 1; }
    main.replaceChildren(h("p", { class: "muted" }, "Loading the summaries\u2026"));
    Promise.all([tasksOf(a), tasksOf(b)]).then(function (sums) {
      if (id !== renderId) return;
      var sa = sums[0], sb = sums[1];
      function pick(elId, value) {
        return h("select", { id: elId, onchange: function () {
          var x = +document.getElementById("cmp-a").value, y = +document.getElementById("cmp-b").value;
          location.hash = "#/compare/" + x + "/" + y;
        } }, files.map(function (f, i) { return h("option", { value: i, selected: i === value ? "" : null }, f.name); }));
      }
      var A = {}, B = {};
      (sa ? sa.tasks : []).forEach(function (t) { A[t.slug] = t; });
      (sb ? sb.tasks : []).forEach(function (t) { B[t.slug] = t; });
      var keys = Object.keys(A).concat(Object.keys(B).filter(function (k) { return !(k in A); }));
      var rows = keys.map(function (k) {
        var x = A[k], y = B[k];
        var d = x && y && x.mean_reward !== null && y.mean_reward !== null ? change(x.mean_reward, y.mean_reward) : null;
        return { task: k, args: JSON.stringify((x || y).args), a: x ? x.mean_reward : null, b: y ? y.mean_reward : null, d: d, inA: !!x, inB: !!y };
      });
      rows.sort(function (p, q) {
        var dp = p.d === null ? -1 : Math.abs(p.d), dq = q.d === null ? -1 : Math.abs(q.d);
        return dq - dp || (p.task < q.task ? -1 : 1);
      });
      var better = rows.filter(function (r) { return r.d !== null && r.d > 0; }).length;
      var worse = rows.filter(function (r) { return r.d !== null && r.d < 0; }).length;
      var same = rows.filter(function (r) { return r.d === 0; }).length;
      main.replaceChildren(
        h("h2", null, "Compare"),
        h("p", { class: "tools" }, h("label", { for: "cmp-a" }, "A "), pick("cmp-a", a), " ", h("label", { for: "cmp-b" }, "B "), pick("cmp-b", b)),
        h("dl", { class: "summary" },
          h("dt", null, "A"), h("dd", null, agentText(sa && sa.agent) + ": mean reward " + fmtMean(sa && sa.mean_reward, sa && sa.stderr) + ", pass@1 " + sig(sa && sa.pass_at["1"])),
          h("dt", null, "B"), h("dd", null, agentText(sb && sb.agent) + ": mean reward " + fmtMean(sb && sb.mean_reward, sb && sb.stderr) + ", pass@1 " + sig(sb && sb.pass_at["1"])),
          h("dt", null, "Tasks"), h("dd", { id: "cmp-counts" }, better + " better, " + worse + " worse, " + same + " same, " +
            rows.filter(function (r) { return !r.inB; }).length + " only in A, " + rows.filter(function (r) { return !r.inA; }).length + " only in B")),
        h("div", { class: "plots" }, deltaPlot(rows)),
        h("table", { id: "compare" },
          h("caption", null, rows.length + " tasks, largest change first"),
          h("thead", null, h("tr", null, ["Task", "Args", "Reward A", "Reward B", "\u0394 (B \u2212 A)"].map(function (t) { return h("th", { scope: "col" }, t); }))),
          h("tbody", null, rows.map(function (r) {
            return h("tr", { class: r.d === null ? "" : r.d > 0 ? "up" : r.d < 0 ? "down" : "" },
              h("th", { scope: "row" }, r.task), h("td", null, r.args),
              h("td", { class: "num" }, r.inA ? sig(r.a) : "absent"), h("td", { class: "num" }, r.inB ? sig(r.b) : "absent"),
              h("td", { class: "num delta" }, fmtDelta(r.d)));
          }))));
      ready(id, "compare");
    }, function (err) {
      if (id !== renderId) return;
      main.replaceChildren(h("p", { class: "error", role: "alert" }, "Cannot load the summaries: " + err.message));
      ready(id, "compare");
    });
  }

  // ------------------------------------------------------------ live updates
  function poll() {
    Promise.all(files.map(function (file, f) {
      return api("api/rows?file=" + f + "&from=" + file.rows.length + "&generation=" + file.generation)
        .then(function (res) { return res.ok ? res.json() : null; })
        .then(function (body) {
          if (!body) return false;
          if (body.generation !== file.generation) { file.generation = body.generation; file.rows = []; }
          else if (!body.rows.length) return false;
          addRows(file, body.rows);
          file.head = body.summary;
          file.subscores = body.subscores || file.subscores;
          file.tasks = null;
          return true;
        });
    })).then(function (changed) {
      if (changed.some(Boolean)) {
        if (table && state.view === "f" + table.file) table.refresh();
        else if (state.view === "compare") route();
      }
    }, function () {}).then(function () { setTimeout(poll, boot.pollInterval || 1000); });
  }

  window.addEventListener("hashchange", route);
  route();
  if (live) setTimeout(poll, boot.pollInterval || 1000);
})();
`;
