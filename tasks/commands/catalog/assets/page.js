// The catalog page's script (tasks/commands/catalog/page.py): filters kept in the URL fragment, the two
// uPlot scatter charts, sortable tables. Works from the JSON in #catalog-data; no network.
(function () {
  "use strict";
  var DATA = JSON.parse(document.getElementById("catalog-data").textContent);
  var KEYS = DATA.filters.concat(["quality"]);
  var controls = {};
  KEYS.forEach(function (k) {
    controls[k] = document.getElementById(k === "quality" ? "quality" : "filter-" + k);
  });
  var byName = {};
  DATA.recipes.forEach(function (r) { byName[r.name] = r; });
  var LABELLED = 12;  // a chart with at most this many points names each on the canvas
  var PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"];

  // ------------------------------------------------------------ the fragment: #family=llm&target=x-elite

  function parseHash() {
    var out = [];
    location.hash.replace(/^#/, "").split("&").forEach(function (part) {
      if (!part) return;
      var i = part.indexOf("=");
      var k = i < 0 ? part : part.slice(0, i), v = i < 0 ? "" : part.slice(i + 1);
      try { k = decodeURIComponent(k); v = decodeURIComponent(v); } catch (e) { /* kept as written */ }
      out.push([k, v]);
    });
    return out;
  }

  function hashFor(st) {
    return KEYS.filter(function (k) { return st[k]; })
      .map(function (k) { return k + "=" + encodeURIComponent(st[k]); }).join("&");
  }

  function writeHash(st) {
    var h = hashFor(st);
    if (location.hash.replace(/^#/, "") === h) return;
    try {
      history.replaceState(null, "", h ? "#" + h : location.pathname + location.search);
    } catch (e) {
      location.replace("#" + h);  // a browser that refuses replaceState here
    }
  }

  function applyHash() {
    var ignored = [];
    KEYS.forEach(function (k) { controls[k].value = ""; });
    parseHash().forEach(function (kv) {
      var c = controls[kv[0]];
      var ok = c && Array.prototype.some.call(c.options, function (o) { return o.value === kv[1]; });
      if (ok) c.value = kv[1];
      else ignored.push(kv[0] + "=" + kv[1] + (c ? " (no recipe has it)" : " (no such filter)"));
    });
    var note = document.getElementById("hash-note");
    note.hidden = !ignored.length;
    note.textContent = ignored.length ? "Ignored in the address: " + ignored.join(", ") : "";
  }

  function current() {
    var st = {};
    KEYS.forEach(function (k) { st[k] = controls[k].value; });
    return st;
  }

  // ------------------------------------------------------------ which recipes and targets pass

  function targetOk(tv, t, st) {
    return (!st.target || t === st.target) && (!st.runs_on || tv.runs_on === st.runs_on) &&
      (!st.runtime || tv.runtimes.indexOf(st.runtime) >= 0);
  }

  function recipeOk(r, st) {
    if ((st.family && r.family !== st.family) || (st.size && r.size !== st.size) ||
        (st.precision && r.precision !== st.precision) || (st.state && r.state !== st.state)) return false;
    return Object.keys(r.targets).some(function (t) { return targetOk(r.targets[t], t, st); });
  }

  function passing(st) {  // [[recipe, target, figures]] of the recipes and targets that pass
    var out = [];
    DATA.recipes.forEach(function (r) {
      if (!recipeOk(r, st)) return;
      Object.keys(r.targets).sort().forEach(function (t) {
        if (targetOk(r.targets[t], t, st)) out.push([r, t, r.targets[t]]);
      });
    });
    return out;
  }

  // ------------------------------------------------------------ charts (uPlot, mode 2: x/y scatter)

  function fmtBytes(n) {
    var units = ["B", "kB", "MB", "GB", "TB"], i = 0;
    while (n >= 1000 && i < units.length - 1) { n /= 1000; i++; }
    return (i ? String(+n.toFixed(1)) : String(Math.round(n))) + " " + units[i];
  }

  function fmtRate(v) {
    return v >= 1000 ? +(v / 1000).toFixed(1) + "k tok/s" : +v.toFixed(1) + " tok/s";
  }

  function logRange(u, min, max) {
    if (min == null || !(min > 0)) return [1, 10];
    return [Math.pow(10, Math.floor(Math.log10(min) - 0.15)), Math.pow(10, Math.ceil(Math.log10(max) + 0.15))];
  }

  function linRange(u, min, max) {
    if (min == null) return [0, 1];
    var pad = Math.max((max - min) * 0.12, Math.abs(max) * 0.0005, 1e-4);
    return [min - pad, max <= 1 ? Math.min(max + pad, 1 + pad / 4) : max + pad];  // metrics top out at 1
  }

  function logValues(fmt) {  // label 1, 2 and 5 x 10^k only
    return function (u, splits) {
      return splits.map(function (v) {
        var m = Math.round(v / Math.pow(10, Math.floor(Math.log10(v) + 1e-9)));
        return m === 1 || m === 2 || m === 5 ? fmt(v) : "";
      });
    };
  }

  // spec: {empty, xLabel, yLabel, xLog, yLog, xFmt, yFmt, series: [{label, color, hollow, pts: [{name, target, x, y}]}], tip}
  function scatter(el, spec) {
    if (el._plot) { el._plot.destroy(); el._plot = null; }
    el.textContent = "";
    var series = spec.series.filter(function (s) { return s.pts.length; });
    if (!series.length) {
      var empty = document.createElement("div");
      empty.className = "empty";
      empty.textContent = spec.empty;
      el.appendChild(empty);
      el.dataset.count = "0";
      el.dataset.points = "[]";
      return;
    }
    var drawnBy = {};  // series index -> the points its path builder drew
    var drawPoints = uPlot.paths.points();
    var tip = document.createElement("div");
    tip.className = "tip";
    tip.hidden = true;
    var hovered = null;

    function recording(u, si, i0, i1, filt) {
      var s = series[si - 1], xs = u.scales.x, ys = u.scales.y;
      drawnBy[si] = s.pts.filter(function (p, i) {
        return i >= i0 && i <= i1 && p.y != null && p.x >= xs.min && p.x <= xs.max && p.y >= ys.min && p.y <= ys.max;
      });
      return drawPoints(u, si, i0, i1, filt);
    }

    function publish(u) {  // what was drawn, for readers without eyes on the canvas
      var pts = [];
      series.forEach(function (s, i) {
        if (u.series[i + 1].show) (drawnBy[i + 1] || []).forEach(function (p) {
          pts.push({name: p.name, target: p.target, series: s.label, x: p.x, y: p.y});
        });
      });
      pts.sort(function (a, b) {
        return a.name < b.name ? -1 : a.name > b.name ? 1 : a.target < b.target ? -1 : a.target > b.target ? 1 : 0;
      });
      el.dataset.count = String(pts.length);
      el.dataset.points = JSON.stringify(pts);
      if (pts.length <= LABELLED) {  // few points: name them on the canvas
        var ctx = u.ctx, px = uPlot.pxRatio;
        ctx.save();
        ctx.font = Math.round(11 * px) + "px system-ui, sans-serif";
        ctx.fillStyle = "#333";
        ctx.textAlign = "left";
        ctx.textBaseline = "middle";
        var taken = [];  // label boxes drawn: a label that would overlap one is left to the tooltip
        var b = u.bbox, h = 13 * px;
        pts.forEach(function (p) {
          var label = p.name + (Object.keys(byName[p.name].targets).length > 1 ? " (" + p.target + ")" : "");
          var w = ctx.measureText(label).width, cx = u.valToPos(p.x, "x", true), cy = u.valToPos(p.y, "y", true);
          var spots = [[cx + 8 * px, cy], [cx - 8 * px - w, cy], [cx - w / 2, cy - h], [cx - w / 2, cy + h]];
          var spot = spots.filter(function (s) {
            return s[0] >= b.left && s[0] + w <= b.left + b.width && s[1] - h / 2 >= 0 && s[1] + h / 2 <= b.top + b.height &&
              !taken.some(function (t) { return s[0] < t[0] + t[2] && t[0] < s[0] + w && Math.abs(s[1] - t[1]) < h; });
          })[0];
          if (!spot) return;
          taken.push([spot[0], spot[1], w]);
          ctx.fillText(label, spot[0], spot[1]);
        });
        ctx.restore();
      }
    }

    function hover(u) {
      var l = u.cursor.left, t = u.cursor.top, best = null, bestD = 100;  // within 10 px
      if (l != null && l >= 0) {
        series.forEach(function (s, i) {
          if (!u.series[i + 1].show) return;
          (drawnBy[i + 1] || []).forEach(function (p) {
            var dx = u.valToPos(p.x, "x") - l, dy = u.valToPos(p.y, "y") - t, d = dx * dx + dy * dy;
            if (d < bestD) { bestD = d; best = {p: p, s: s}; }
          });
        });
      }
      hovered = best;
      if (!best) { tip.hidden = true; return; }
      tip.innerHTML = "";
      spec.tip(best.p, best.s).forEach(function (line, i) {
        if (i) tip.appendChild(document.createElement("br"));
        tip.appendChild(document.createTextNode(line));
      });
      var box = u.over.getBoundingClientRect(), outer = el.getBoundingClientRect();
      tip.hidden = false;
      var x = box.left - outer.left + u.valToPos(best.p.x, "x");
      tip.style.left = (x + 12 + tip.offsetWidth > el.clientWidth ? x - 12 - tip.offsetWidth : x + 12) + "px";
      tip.style.top = (box.top - outer.top + u.valToPos(best.p.y, "y") - 10) + "px";
    }

    var opts = {
      mode: 2,
      width: Math.max(320, el.clientWidth),
      height: 300,
      legend: {live: false},
      cursor: {x: false, y: false, points: {show: false}, drag: {x: false, y: false, setScale: false}},
      scales: {
        x: {time: false, distr: spec.xLog ? 3 : 1, range: spec.xLog ? logRange : linRange},
        y: {distr: spec.yLog ? 3 : 1, range: spec.yLog ? logRange : linRange},
      },
      axes: [
        {label: spec.xLabel, values: spec.xLog ? logValues(spec.xFmt) : function (u, s) { return s.map(spec.xFmt); }},
        {label: spec.yLabel, size: 70, values: spec.yLog ? logValues(spec.yFmt) : function (u, s) { return s.map(spec.yFmt); }},
      ],
      series: [{}].concat(series.map(function (s) {
        return {label: s.label, stroke: s.color, fill: s.hollow ? "#ffffff" : s.color, width: 2,
                points: {size: 10, width: 2}, paths: recording,
                facets: [{scale: "x", auto: true}, {scale: "y", auto: true}]};
      })),
      hooks: {draw: [publish], setCursor: [hover], setSeries: [function (u) { u.redraw(); }]},
    };
    var data = [null].concat(series.map(function (s) {
      return [s.pts.map(function (p) { return p.x; }), s.pts.map(function (p) { return p.y; })];
    }));
    el._plot = new uPlot(opts, data, el);
    el.appendChild(tip);
    el._plot.over.addEventListener("click", function () {
      if (!hovered) return;
      var row = document.getElementById("recipe-" + hovered.p.name);
      Array.prototype.forEach.call(document.querySelectorAll("tr.picked"), function (r) { r.classList.remove("picked"); });
      if (row) { row.classList.add("picked"); row.scrollIntoView({block: "center"}); }
    });
  }

  function qualityChart(st, pass) {
    var groups = {}, order = [];
    pass.forEach(function (x) {
      var r = x[0], t = x[1], tv = x[2];
      if (!r.plotted || tv.bytes == null) return;
      var m = st.quality || DATA.quality.filter(function (q) { return q in tv.quality; })[0];
      if (!m || tv.quality[m] == null) return;
      var key = m + (tv.failed ? " (below a verify threshold)" : "");
      if (!groups[key]) {
        groups[key] = {label: key, hollow: tv.failed, pts: [],
                       color: PALETTE[DATA.quality.indexOf(m) % PALETTE.length], metric: m};
        order.push(key);
      }
      groups[key].pts.push({name: r.name, target: t, x: tv.bytes, y: tv.quality[m]});
    });
    order.sort();
    scatter(document.getElementById("quality-chart"), {
      empty: "No built recipe passes the filters" + (st.quality ? " with " + st.quality : "") + ".",
      xLabel: "bytes shipped for the target (log)", yLabel: "quality: verify metric vs fp32",
      xLog: true, yLog: false, xFmt: fmtBytes, yFmt: function (v) { return +v.toFixed(6) + ""; },
      series: order.map(function (k) { return groups[k]; }),
      tip: function (p, s) {
        return [p.name + " on " + p.target, s.metric + " = " + p.y.toFixed(5), "shipped: " + fmtBytes(p.x)];
      },
    });
  }

  function deviceChart(st, pass) {
    var built = {label: "read back from a build", color: PALETTE[0], hollow: false, pts: []};
    var estimated = {label: "estimated before a build", color: PALETTE[4], hollow: true, pts: []};
    pass.forEach(function (x) {
      var d = x[2].device;
      if (!d || d.decode_tokens_per_s_ceiling == null || d.memory_bytes == null) return;
      (d.estimated ? estimated : built).pts.push({name: x[0].name, target: x[1], x: d.memory_bytes,
                                                   y: d.decode_tokens_per_s_ceiling, d: d});
    });
    scatter(document.getElementById("device-chart"), {
      empty: "No LLM with on-device figures passes the filters.",
      xLabel: "memory on the device, without the runtime (log)", yLabel: "decode ceiling, tokens/s (log)",
      xLog: true, yLog: true, xFmt: fmtBytes, yFmt: fmtRate,
      series: [built, estimated],
      tip: function (p, s) {
        var ft = p.d.first_token_s_lower_bound;
        return [p.name + " on " + p.target + " (" + s.label + ")", "memory: " + fmtBytes(p.x) + ", bundle " +
                fmtBytes(p.d.bundle_bytes) + ", KV cache " + fmtBytes(p.d.kv_cache_bytes),
                "decode <= " + fmtRate(p.y) + (ft == null ? "" : ", first token >= " + (ft * 1000).toFixed(1) + " ms")];
      },
    });
  }

  // ------------------------------------------------------------ render

  function render() {
    var st = current();
    var pass = passing(st);
    var shown = 0;
    Array.prototype.forEach.call(document.querySelectorAll("#catalog tbody tr"), function (tr) {
      var ok = recipeOk(byName[tr.dataset.name], st);
      tr.hidden = !ok;
      if (ok) shown++;
    });
    var keep = {};
    pass.forEach(function (x) { keep[x[0].name + "\n" + x[1]] = true; });
    Array.prototype.forEach.call(document.querySelectorAll("#device tbody tr"), function (tr) {
      tr.hidden = !keep[tr.dataset.name + "\n" + tr.dataset.target];
    });
    KEYS.forEach(function (k) { controls[k].classList.toggle("active", !!st[k]); });
    var p = document.getElementById("shown");
    p.dataset.count = String(shown);
    p.textContent = "Showing " + shown + " of " + DATA.recipes.length + " recipes" +
      (hashFor(st) ? " (filtered: " + hashFor(st).replace(/&/g, ", ") + ")." : ".");
    qualityChart(st, pass);
    deviceChart(st, pass);
    document.body.dataset.rendered = String((+document.body.dataset.rendered || 0) + 1);
  }

  function changed() {
    writeHash(current());
    render();
  }

  KEYS.forEach(function (k) { controls[k].addEventListener("change", changed); });
  document.getElementById("reset").addEventListener("click", function () {
    KEYS.forEach(function (k) { controls[k].value = ""; });
    changed();
  });
  window.addEventListener("hashchange", function () { applyHash(); render(); });
  var resizing = null;
  window.addEventListener("resize", function () {
    clearTimeout(resizing);
    resizing = setTimeout(render, 150);
  });

  // ------------------------------------------------------------ sortable tables

  Array.prototype.forEach.call(document.querySelectorAll("table.sortable"), function (table) {
    var heads = table.tHead.rows[0].cells;
    Array.prototype.forEach.call(heads, function (th, i) {
      th.addEventListener("click", function () {
        var numeric = th.getAttribute("data-type") === "num";
        var asc = th.getAttribute("aria-sort") !== "ascending";
        Array.prototype.forEach.call(heads, function (h) { h.removeAttribute("aria-sort"); });
        th.setAttribute("aria-sort", asc ? "ascending" : "descending");
        var body = table.tBodies[0];
        var key = function (row) {
          var v = row.cells[i].getAttribute("data-sort");
          return numeric ? parseFloat(v) : v.toLowerCase();
        };
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (a, b) {
          var x = key(a), y = key(b);
          return (x < y ? -1 : x > y ? 1 : 0) * (asc ? 1 : -1);
        });
        rows.forEach(function (r) { body.appendChild(r); });
      });
    });
  });

  applyHash();
  render();
})();
