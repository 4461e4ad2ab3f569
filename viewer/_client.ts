// The viewer page's script, as text. It builds every element with DOM calls
// and puts data in only as text nodes or attribute values, never as markup,
// so agent output cannot inject anything. Kept free of backticks and "${"
// so that it can live in a template literal.

/** The page script. */
export const CLIENT_JS: string = String.raw`
"use strict";
(function () {
  performance.mark("hud-script-start");
  var ROW_H = 30, OVERSCAN = 12;
  var boot = JSON.parse(document.getElementById("hud-data").textContent);
  var FIELDS = boot.fields;
  function unpack(a) {
    var o = {};
    for (var k = 0; k < FIELDS.length; k++) o[FIELDS[k]] = a[k];
    return o;
  }
  var files = boot.files.map(function (f) {
    return { name: f.name, rows: (f.rows || []).map(unpack), records: f.records || null, generation: f.generation || 0 };
  });
  var live = boot.live === true;
  // The live viewer's requests carry its token (the page came with it).
  function api(path) {
    return fetch(path, { headers: boot.token ? { authorization: "Bearer " + boot.token } : {} });
  }
  var main = document.getElementById("main");
  var state = { sort: { key: "i", dir: 1 }, filter: "", view: null };

  function h(tag, attrs) {
    var el = document.createElement(tag);
    if (attrs) {
      for (var k in attrs) {
        if (attrs[k] === null || attrs[k] === undefined || attrs[k] === false) continue;
        if (k === "text") el.textContent = String(attrs[k]);
        else if (k === "class") el.className = attrs[k];
        else if (k.slice(0, 2) === "on") el.addEventListener(k.slice(2), attrs[k]);
        else el.setAttribute(k, String(attrs[k]));
      }
    }
    function add(c) {
      if (c === null || c === undefined || c === false) return;
      if (Array.isArray(c)) c.forEach(add);
      else el.appendChild(typeof c === "string" || typeof c === "number" ? document.createTextNode(String(c)) : c);
    }
    for (var i = 2; i < arguments.length; i++) add(arguments[i]);
    return el;
  }
  function fmtReward(r) { return r === null || r === undefined ? "\u2013" : r.toFixed(2); }
  function fmtMs(ms) {
    if (ms === null || ms === undefined) return "\u2013";
    if (ms < 1000) return Math.round(ms) + " ms";
    if (ms < 120000) return (ms / 1000).toFixed(1) + " s";
    return (ms / 60000).toFixed(1) + " min";
  }
  function fmtDelta(d) { return d === null ? "\u2013" : (d > 0 ? "+" : d < 0 ? "\u2212" : "\u00b1") + Math.abs(d).toFixed(2); }
  function json(v) { return typeof v === "string" ? v : JSON.stringify(v, null, 2); }

  // ------------------------------------------------------------ statistics
  function choose(n, k) {
    if (k < 0 || k > n) return 0;
    var r = 1;
    for (var i = 1; i <= k; i++) r = r * (n - k + i) / i;
    return r;
  }
  function stats(rows) {
    var graded = rows.filter(function (r) { return r.reward !== null; });
    var n = graded.length, sum = 0, sq = 0;
    graded.forEach(function (r) { sum += r.reward; });
    var mean = n ? sum / n : null;
    graded.forEach(function (r) { sq += (r.reward - mean) * (r.reward - mean); });
    var se = n > 1 ? Math.sqrt(sq / (n - 1)) / Math.sqrt(n) : null;
    var phases = {};
    rows.forEach(function (r) { if (r.phase) phases[r.phase] = (phases[r.phase] || 0) + 1; });
    var groups = {};
    rows.forEach(function (r) { (groups[r.group] = groups[r.group] || []).push(r); });
    var sizes = Object.keys(groups).map(function (g) { return groups[g].length; });
    var k = sizes.length ? Math.min.apply(null, sizes) : 0;
    function passAt(kk) {
      var keys = Object.keys(groups), total = 0;
      if (!keys.length || kk < 1) return null;
      keys.forEach(function (g) {
        var rs = groups[g], c = rs.filter(function (r) { return r.reward !== null && r.reward >= 1; }).length;
        total += 1 - choose(rs.length - c, kk) / choose(rs.length, kk);
      });
      return total / keys.length;
    }
    var first = null, last = null;
    rows.forEach(function (r) {
      if (r.started !== null && (first === null || r.started < first)) first = r.started;
      if (r.ended !== null && (last === null || r.ended > last)) last = r.ended;
    });
    return {
      total: rows.length, graded: n, mean: mean, se: se, phases: phases,
      groups: sizes.length, k: k, pass1: passAt(1), passK: k > 1 ? passAt(k) : null,
      errored: rows.filter(function (r) { return r.phase !== null || r.reward === null; }).length,
      duration: first !== null && last !== null ? last - first : null,
    };
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
    var parts = (location.hash || "#/f/0").slice(2).split("/");
    if (parts[0] === "r" && files[+parts[1]]) return showRollout(+parts[1], +parts[2]);
    if (parts[0] === "compare" && files.length > 1) return showCompare(+parts[1] || 0, parts[2] === undefined ? 1 : +parts[2]);
    var f = parts[0] === "f" && files[+parts[1]] ? +parts[1] : 0;
    showTable(f);
  }

  // ------------------------------------------------------------ job summary + table
  var COLUMNS = [
    { key: "task", label: "Task" }, { key: "args", label: "Args" }, { key: "group", label: "Group" },
    { key: "reward", label: "Reward", num: true }, { key: "status", label: "Status" },
    { key: "duration", label: "Duration", num: true }, { key: "error", label: "Error" },
  ];
  var table = null;

  function summaryList(s) {
    var phases = Object.keys(s.phases).map(function (p) { return p + " " + s.phases[p]; }).join(", ");
    function item(label, value, id) { return [h("dt", null, label), h("dd", { id: id }, value)]; }
    return h("dl", { class: "summary" },
      item("Rollouts", s.total + " (" + s.graded + " graded)", "s-total"),
      item("Mean reward", s.mean === null ? "\u2013" : s.mean.toFixed(3) + (s.se === null ? "" : " \u00b1 " + s.se.toFixed(3)), "s-mean"),
      item("pass@1", s.pass1 === null ? "\u2013" : s.pass1.toFixed(3), "s-pass1"),
      s.passK === null ? null : item("pass@" + s.k, s.passK.toFixed(3), "s-passk"),
      item("Errored", s.errored + (phases ? " (" + phases + ")" : ""), "s-errored"),
      item("Duration", fmtMs(s.duration), "s-duration"));
  }

  function showTable(f) {
    state.view = "f" + f;
    nav();
    var file = files[f];
    var filter = h("input", { id: "filter", type: "search", value: state.filter, placeholder: "task, args, status, error\u2026",
      oninput: function (e) { state.filter = e.target.value; table.update(); } });
    var caption = h("caption", { id: "count", "aria-live": "polite" });
    var head = h("tr", null, COLUMNS.map(function (c) {
      var sorted = state.sort.key === c.key;
      return h("th", { scope: "col", "data-key": c.key, "aria-sort": sorted ? (state.sort.dir > 0 ? "ascending" : "descending") : "none" },
        h("button", { type: "button", onclick: function () {
          state.sort = { key: c.key, dir: state.sort.key === c.key ? -state.sort.dir : 1 };
          route();
        } }, c.label, h("span", { class: "arrow", "aria-hidden": "true" }, sorted ? (state.sort.dir > 0 ? " \u25b2" : " \u25bc") : "")));
    }));
    var tbody = h("tbody");
    var scroller = h("div", { class: "scroller", tabindex: "0", role: "region", "aria-label": "Rollouts" },
      h("table", { id: "rollouts" }, caption, h("thead", null, head), tbody));
    var summary = h("section", { "aria-labelledby": "sum-h" }, h("h2", { id: "sum-h" }, "Job: " + file.name), summaryList(stats(file.rows)));
    main.replaceChildren(summary,
      h("section", { "aria-labelledby": "roll-h" }, h("h2", { id: "roll-h" }, "Rollouts"),
        h("p", { class: "tools" }, h("label", { for: "filter" }, "Filter "), filter), scroller));
    var view = [];
    var shown = { start: -1, end: -1, len: -1 };
    function compare(a, b) {
      var k = state.sort.key, x = a[k], y = b[k];
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
        out.push(h("tr", { class: "row " + (r.phase ? "failed" : r.reward === null ? "" : r.reward >= 1 ? "pass" : r.reward > 0 ? "partial" : "zero"), "aria-rowindex": j + 2, "data-i": r.i },
          h("td", null, h("a", { href: "#/r/" + f + "/" + r.i }, r.task)),
          h("td", { title: r.args }, r.args),
          h("td", { title: r.group }, r.group.slice(-24)),
          h("td", { class: "num reward" }, fmtReward(r.reward)),
          h("td", { class: "status" }, r.status + (r.phase ? " (" + r.phase + ")" : "")),
          h("td", { class: "num" }, fmtMs(r.duration)),
          h("td", { class: "error", title: r.error }, r.error)));
      }
      out.push(h("tr", { class: "spacer", "aria-hidden": "true", style: "height:" + (view.length - end) * ROW_H + "px" }));
      tbody.replaceChildren.apply(tbody, out);
    }
    function update() {
      var q = state.filter.trim().toLowerCase();
      view = file.rows.filter(function (r) {
        return !q || (r.task + " " + r.args + " " + r.status + " " + (r.phase || "") + " " + r.error + " " + r.group).toLowerCase().indexOf(q) >= 0;
      });
      view.sort(compare);
      document.getElementById("rollouts").setAttribute("aria-rowcount", String(view.length + 1));
      caption.textContent = "Showing " + view.length + " of " + file.rows.length + " rollouts";
      paint(true);
    }
    scroller.addEventListener("scroll", function () { requestAnimationFrame(function () { paint(false); }); });
    table = { file: f, update: function () { update(); var s = main.querySelector("dl.summary"); if (s) s.replaceWith(summaryList(stats(file.rows))); } };
    update();
    document.body.setAttribute("data-ready", "table");
    // For benchmarks: when the table first showed, in ms since navigation.
    if (!performance.getEntriesByName("hud-table-ready").length) performance.mark("hud-table-ready");
  }

  // ------------------------------------------------------------ one rollout
  function diffBlock(patch) {
    var lines = String(patch.patch || "").split("\n");
    if (lines.length && lines[lines.length - 1] === "") lines.pop();
    return h("details", { class: "file", open: "" },
      h("summary", null, h("code", null, patch.path), " ", h("span", { class: "badge" }, patch.status || "")),
      patch.patch ? h("pre", { class: "diff" }, lines.map(function (l) {
        var cls = l.slice(0, 3) === "+++" || l.slice(0, 3) === "---" ? "meta" : l[0] === "+" ? "add" : l[0] === "-" ? "del" : l.slice(0, 2) === "@@" ? "hunk" : "ctx";
        return h("span", { class: "line " + cls }, l + "\n");
      })) : h("p", { class: "muted" }, "no content shown (" + (patch.status === "deleted" ? "removed" : (patch.size_after + " bytes")) + ")"));
  }

  function stepBody(step) {
    var c = step.content;
    if (step.type.slice(0, 13) === "filetracking." && c && typeof c === "object") {
      // A flush nests its diff (HUD's shape): { diff: { patches }, capture }.
      var d = c.diff && typeof c.diff === "object" ? c.diff : c;
      if (Array.isArray(d.patches)) return h("div", null, d.patches.map(diffBlock));
      if (Array.isArray(c.files)) {
        return h("ul", { class: "files" }, c.files.map(function (f) { return h("li", null, h("code", null, f.path), " " + f.size + " bytes"); }));
      }
    }
    if (step.type === "evaluate" && c && typeof c === "object") {
      var parts = [h("p", null, "Score ", h("strong", { class: "score" }, String(c.score !== undefined ? c.score : c.reward)))];
      if (c.subscores && typeof c.subscores === "object") {
        parts.push(h("table", { class: "subscores" }, h("caption", null, "Subscores"),
          h("thead", null, h("tr", null, h("th", { scope: "col" }, "Name"), h("th", { scope: "col" }, "Score"))),
          h("tbody", null, Object.keys(c.subscores).map(function (k) {
            return h("tr", null, h("th", { scope: "row" }, k), h("td", { class: "num" }, String(c.subscores[k])));
          }))));
      }
      if (c.info && typeof c.info === "object") {
        parts.push(h("dl", { class: "info" }, Object.keys(c.info).map(function (k) {
          return [h("dt", null, k), h("dd", null, h("pre", null, json(c.info[k])))];
        })));
      }
      var rest = {};
      Object.keys(c).forEach(function (k) { if (["score", "reward", "subscores", "info"].indexOf(k) < 0) rest[k] = c[k]; });
      if (Object.keys(rest).length) parts.push(h("pre", null, json(rest)));
      return h("div", null, parts);
    }
    if (step.type === "error") {
      var info = step.info || {};
      return h("p", { class: "error", role: "note" }, h("strong", null, (info.phase || "?") + " phase, " + (info.name || "Error") + ": "), String(c));
    }
    var body = [];
    if (c !== undefined && c !== null) body.push(h("pre", { class: "content" }, json(c)));
    if (step.info) body.push(h("pre", { class: "muted" }, json(step.info)));
    return h("div", null, body);
  }

  function showRollout(f, i) {
    state.view = "r";
    nav();
    main.replaceChildren(h("p", null, "Loading\u2026"));
    document.body.removeAttribute("data-ready");
    getRecord(f, i).then(function (rec) {
      var trace = rec.trace || {};
      var row = files[f].rows.find(function (r) { return r.i === i; }) || {};
      var errors = (trace.errors || []).map(function (e) {
        return h("li", null, h("strong", null, e.phase + ": "), e.name + ": " + e.message);
      });
      var steps = (trace.steps || []).map(function (s, n) {
        return h("li", { class: "step step-" + s.type.replace(/[^a-z0-9_-]/gi, "-") },
          h("h3", null, s.type, " ", h("time", { datetime: s.timestamp }, String(s.timestamp || "").slice(11, 23))),
          stepBody(s));
      });
      main.replaceChildren(
        h("p", null, h("a", { href: "#/f/" + f }, "\u2190 All rollouts of " + files[f].name)),
        h("h2", { id: "rollout-h" }, rec.task.slug + " #" + rec.repeat),
        h("dl", { class: "summary" },
          h("dt", null, "Reward"), h("dd", { id: "r-reward" }, fmtReward(rec.reward)),
          h("dt", null, "Status"), h("dd", { id: "r-status" }, rec.status + (rec.failed_phase ? " (" + rec.failed_phase + " failed)" : "") + (trace.stop_reason ? ", " + trace.stop_reason : "")),
          h("dt", null, "Duration"), h("dd", null, fmtMs(row.duration)),
          h("dt", null, "Args"), h("dd", null, h("code", null, JSON.stringify(rec.task.args))),
          h("dt", null, "Group"), h("dd", null, String(rec.group_id))),
        errors.length ? h("section", { "aria-labelledby": "err-h" }, h("h3", { id: "err-h" }, "Errors"), h("ul", { class: "errors" }, errors)) : "",
        h("section", { "aria-labelledby": "steps-h" }, h("h3", { id: "steps-h" }, "Steps"), h("ol", { class: "steps" }, steps)));
      document.body.setAttribute("data-ready", "rollout");
    }, function (err) {
      main.replaceChildren(h("p", { class: "error", role: "alert" }, "Cannot load rollout " + i + ": " + err.message));
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
  function byTask(rows) {
    var out = {};
    rows.forEach(function (r) {
      var e = out[r.task] = out[r.task] || { task: r.task, args: r.args, sum: 0, n: 0, runs: 0 };
      e.runs++;
      if (r.reward !== null) { e.sum += r.reward; e.n++; }
    });
    Object.keys(out).forEach(function (k) { out[k].mean = out[k].n ? out[k].sum / out[k].n : null; });
    return out;
  }

  function showCompare(a, b) {
    state.view = "compare";
    nav();
    if (!files[a] || !files[b]) { a = 0; b = 1; }
    function pick(id, value, other) {
      return h("select", { id: id, onchange: function () {
        var x = +document.getElementById("cmp-a").value, y = +document.getElementById("cmp-b").value;
        location.hash = "#/compare/" + x + "/" + y;
      } }, files.map(function (f, i) { return h("option", { value: i, selected: i === value ? "" : null }, f.name); }));
    }
    var A = byTask(files[a].rows), B = byTask(files[b].rows);
    var keys = Object.keys(A).concat(Object.keys(B).filter(function (k) { return !(k in A); }));
    var rows = keys.map(function (k) {
      var x = A[k], y = B[k];
      var d = x && y && x.mean !== null && y.mean !== null ? y.mean - x.mean : null;
      return { task: k, args: (x || y).args, a: x ? x.mean : null, b: y ? y.mean : null, d: d, inA: !!x, inB: !!y };
    });
    rows.sort(function (p, q) {
      var dp = p.d === null ? -1 : Math.abs(p.d), dq = q.d === null ? -1 : Math.abs(q.d);
      return dq - dp || (p.task < q.task ? -1 : 1);
    });
    var better = rows.filter(function (r) { return r.d !== null && r.d > 0; }).length;
    var worse = rows.filter(function (r) { return r.d !== null && r.d < 0; }).length;
    var same = rows.filter(function (r) { return r.d === 0; }).length;
    var sa = stats(files[a].rows), sb = stats(files[b].rows);
    main.replaceChildren(
      h("h2", null, "Compare"),
      h("p", { class: "tools" }, h("label", { for: "cmp-a" }, "A "), pick("cmp-a", a), " ", h("label", { for: "cmp-b" }, "B "), pick("cmp-b", b)),
      h("dl", { class: "summary" },
        h("dt", null, "Mean reward A"), h("dd", null, sa.mean === null ? "\u2013" : sa.mean.toFixed(3)),
        h("dt", null, "Mean reward B"), h("dd", null, sb.mean === null ? "\u2013" : sb.mean.toFixed(3)),
        h("dt", null, "Tasks"), h("dd", { id: "cmp-counts" }, better + " better, " + worse + " worse, " + same + " same, " +
          rows.filter(function (r) { return !r.inB; }).length + " only in A, " + rows.filter(function (r) { return !r.inA; }).length + " only in B")),
      h("table", { id: "compare" },
        h("caption", null, rows.length + " tasks, largest change first"),
        h("thead", null, h("tr", null, ["Task", "Args", "Reward A", "Reward B", "\u0394 (B \u2212 A)"].map(function (t) { return h("th", { scope: "col" }, t); }))),
        h("tbody", null, rows.map(function (r) {
          return h("tr", { class: r.d === null ? "" : r.d > 0 ? "up" : r.d < 0 ? "down" : "" },
            h("th", { scope: "row" }, r.task), h("td", null, r.args),
            h("td", { class: "num" }, r.inA ? fmtReward(r.a) : "absent"), h("td", { class: "num" }, r.inB ? fmtReward(r.b) : "absent"),
            h("td", { class: "num delta" }, fmtDelta(r.d)));
        }))));
    document.body.setAttribute("data-ready", "compare");
  }

  // ------------------------------------------------------------ live updates
  function poll() {
    Promise.all(files.map(function (file, f) {
      return api("api/rows?file=" + f + "&from=" + file.rows.length + "&generation=" + file.generation)
        .then(function (res) { return res.ok ? res.json() : null; })
        .then(function (body) {
          if (!body) return false;
          var rows = body.rows.map(unpack);
          if (body.generation !== file.generation) { file.generation = body.generation; file.rows = rows; return true; }
          if (!rows.length) return false;
          Array.prototype.push.apply(file.rows, rows);
          return true;
        });
    })).then(function (changed) {
      if (changed.some(Boolean)) {
        if (table && state.view === "f" + table.file) table.update();
        else if (state.view === "compare") route();
      }
    }, function () {}).then(function () { setTimeout(poll, boot.pollInterval || 1000); });
  }

  window.addEventListener("hashchange", route);
  route();
  if (live) setTimeout(poll, boot.pollInterval || 1000);
})();
`;
