// The catalog page's script (tasks/commands/catalog/page.py): filters and the sort kept in the URL
// fragment, the real models by default (a switch adds the other rows), one uPlot scatter chart per
// metric family with every point labelled, sortable tables, details rows. Works from the JSON in
// #catalog-data; no network.
(function () {
  "use strict";
  var DATA = JSON.parse(document.getElementById("catalog-data").textContent);
  var FILTERS = DATA.filters;
  var KEYS = FILTERS.concat(["sort", "all"]);
  var controls = {};
  FILTERS.forEach(function (k) { controls[k] = document.getElementById("filter-" + k); });
  controls.sort = document.getElementById("sort");
  controls.all = document.getElementById("all");
  var byName = {};
  DATA.recipes.forEach(function (r) { byName[r.name] = r; });
  var PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"];

  function value(k) { return k === "all" ? (controls.all.checked ? "1" : "") : controls[k].value; }
  function setValue(k, v) { if (k === "all") controls.all.checked = v === "1"; else controls[k].value = v; }
  function defaultOf(k) { return k === "sort" ? controls.sort.options[0].value : ""; }

  // ------------------------------------------------------------ the fragment: #task=text-generation&fits=8

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
    return KEYS.filter(function (k) { return st[k] && st[k] !== defaultOf(k); })
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
    KEYS.forEach(function (k) { setValue(k, defaultOf(k)); });
    parseHash().forEach(function (kv) {
      var k = kv[0], c = controls[k], ok;
      if (k === "all") ok = kv[1] === "1" || kv[1] === "";
      else ok = c && Array.prototype.some.call(c.options, function (o) { return o.value === kv[1]; });
      if (ok) setValue(k, k === "all" ? "1" : kv[1]);
      else ignored.push(k + "=" + kv[1] + (c ? " (no recipe has it)" : " (no such filter)"));
    });
    var note = document.getElementById("hash-note");
    note.hidden = !ignored.length;
    note.textContent = ignored.length ? "Ignored in the address: " + ignored.join(", ") : "";
  }

  function current() {
    var st = {};
    KEYS.forEach(function (k) { st[k] = value(k); });
    return st;
  }

  // ------------------------------------------------------------ which recipes and targets pass

  function targetOk(tv, t, st) {
    return (!st.target || t === st.target) && (!st.runs_on || tv.runs_on === st.runs_on) &&
      (!st.runtime || tv.runtimes.indexOf(st.runtime) >= 0) &&
      (!st.fits || (tv.memory != null && tv.memory <= +st.fits * 1e9));
  }

  function recipeOk(r, st, ignoreListing) {
    if (!ignoreListing && !st.all && r.listing !== "model") return false;
    if (["task", "license", "family", "size", "precision", "state"].some(function (k) {
      return st[k] && r[k] !== st[k];
    })) return false;
    return Object.keys(r.targets).some(function (t) { return targetOk(r.targets[t], t, st); });
  }

  function passing(st, ignoreListing) {  // [[recipe, target, figures]] of the recipes and targets that pass
    var out = [];
    DATA.recipes.forEach(function (r) {
      if (!recipeOk(r, st, ignoreListing)) return;
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

  // Label every drawn point: points closer than 4 px share one label; a label is the point's name
  // where a free spot next to it takes it, else a number keyed under the chart. Spots are free when
  // inside the plot and clear of the other labels and points. Returns [{text, names, box, keyed}].
  function placeLabels(u, pts, ctx, px) {
    var b = u.bbox, h = 13 * px, clusters = [];
    pts.forEach(function (p) {
      var cx = u.valToPos(p.x, "x", true), cy = u.valToPos(p.y, "y", true);
      var c = clusters.filter(function (c) { return Math.abs(c.cx - cx) < 4 * px && Math.abs(c.cy - cy) < 4 * px; })[0];
      if (!c) { c = {cx: cx, cy: cy, pts: []}; clusters.push(c); }
      c.pts.push(p);
    });
    clusters.sort(function (a, b2) { return a.cx - b2.cx || a.cy - b2.cy; });
    var taken = clusters.map(function (c) { return [c.cx - 6 * px, c.cy - 6 * px, 12 * px, 12 * px, c]; });
    var gap = 3 * px;  // between a label and anything else
    function free(x, y, w, own) {
      if (x < b.left || x + w > b.left + b.width || y - h / 2 < b.top || y + h / 2 > b.top + b.height) return false;
      return !taken.some(function (t) {
        return t[4] !== own && x < t[0] + t[2] + gap && t[0] < x + w + gap && y - h / 2 < t[1] + t[3] + gap &&
          t[1] < y + h / 2 + gap;
      });
    }
    var out = [], n = 0;
    clusters.forEach(function (c) {
      var names = c.pts.map(function (p) { return p.label; });
      var full = names.filter(function (v, i) { return names.indexOf(v) === i; }).join(", ");
      var spot = null, text = full, keyed = false;
      [full, null].some(function (cand) {
        if (cand === null) { n++; text = String(n); keyed = true; }
        var w = ctx.measureText(text).width + (keyed ? 4 : 2) * px;
        var spots = [];  // beside the point, then farther out (a number only), with a leader line
        (cand === null ? [1, 2, 3, 4] : [1]).forEach(function (k) {
          var dx = (6 + 10 * (k - 1)) * px, dy = h * (0.9 + 0.9 * (k - 1));
          spots.push([c.cx + dx + 2 * px, c.cy], [c.cx - dx - 2 * px - w, c.cy], [c.cx - w / 2, c.cy - h * k],
                     [c.cx - w / 2, c.cy + h * k], [c.cx + dx, c.cy - dy], [c.cx + dx, c.cy + dy],
                     [c.cx - dx - w, c.cy - dy], [c.cx - dx - w, c.cy + dy]);
        });
        var at = spots.map(function (s) { return free(s[0], s[1], w, c); }).indexOf(true);
        if (at >= 0) { spot = [spots[at][0], spots[at][1], w, at >= 8]; return true; }
        if (cand === null) spot = [spots[0][0], spots[0][1], w, false];  // no free spot: beside it anyway
        return false;
      });
      taken.push([spot[0], spot[1] - h / 2, spot[2], h, c]);
      out.push({text: text, names: c.pts.map(function (p) { return [p.name, p.target, p.series]; }), keyed: keyed,
                leader: spot[3] ? [c.cx, c.cy] : null,
                box: [spot[0] / px, (spot[1] - h / 2) / px, spot[2] / px, h / px].map(function (v) { return +v.toFixed(1); }),
                at: [spot[0], spot[1]], long: names});
    });
    return out;
  }

  // spec: {empty, xLabel, yLabel, xLog, yLog, xFmt, yFmt, series: [{label, color, hollow, pts: [{name, target, x, y, label}]}], tip}
  function scatter(el, spec) {
    if (el._plot) { el._plot.destroy(); el._plot = null; }
    el.textContent = "";
    var key = document.getElementById(el.id + "-key");
    key.textContent = "";
    var series = spec.series.filter(function (s) { return s.pts.length; });
    if (!series.length) {
      var empty = document.createElement("div");
      empty.className = "empty";
      empty.textContent = spec.empty;
      el.appendChild(empty);
      el.dataset.count = "0";
      el.dataset.points = "[]";
      el.dataset.labels = "[]";
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

    function publish(u) {  // what was drawn, for readers without eyes on the canvas, and its labels
      var pts = [];
      series.forEach(function (s, i) {
        if (u.series[i + 1].show) (drawnBy[i + 1] || []).forEach(function (p) {
          pts.push({name: p.name, target: p.target, series: s.label, x: p.x, y: p.y, label: p.label});
        });
      });
      pts.sort(function (a, b) {
        return a.name < b.name ? -1 : a.name > b.name ? 1 : a.target < b.target ? -1 : a.target > b.target ? 1 :
          a.series < b.series ? -1 : a.series > b.series ? 1 : 0;
      });
      el.dataset.count = String(pts.length);
      el.dataset.points = JSON.stringify(pts.map(function (p) {
        return {name: p.name, target: p.target, series: p.series, x: p.x, y: p.y};
      }));
      var ctx = u.ctx, px = uPlot.pxRatio;
      ctx.save();
      ctx.font = Math.round(11 * px) + "px system-ui, sans-serif";
      ctx.textAlign = "left";
      ctx.textBaseline = "middle";
      var labels = placeLabels(u, pts, ctx, px);
      labels.forEach(function (l) {  // leader lines first, under every label
        if (!l.leader) return;  // a label set apart from its point: a line to it
        ctx.strokeStyle = "#c8a27a";
        ctx.lineWidth = px;
        ctx.beginPath();
        ctx.moveTo(l.leader[0], l.leader[1]);
        ctx.lineTo(l.at[0] + l.box[2] * px / 2, l.at[1]);
        ctx.stroke();
      });
      labels.forEach(function (l) {
        if (l.keyed) {  // a number: boxed, so that two side by side read as two
          var w = l.box[2] * px, hh = l.box[3] * px;
          ctx.fillStyle = "#fff8ee";
          ctx.strokeStyle = "#c8a27a";
          ctx.lineWidth = px;
          ctx.fillRect(l.at[0], l.at[1] - hh / 2, w, hh);
          ctx.strokeRect(l.at[0], l.at[1] - hh / 2, w, hh);
        }
        ctx.fillStyle = l.keyed ? "#8a3b00" : "#333";
        ctx.fillText(l.text, l.at[0] + (l.keyed ? 2 : 1) * px, l.at[1]);
      });
      ctx.restore();
      el.dataset.labels = JSON.stringify(labels.map(function (l) { return {text: l.text, names: l.names, box: l.box}; }));
      key.textContent = "";
      labels.filter(function (l) { return l.keyed; }).forEach(function (l) {
        var li = document.createElement("li");
        li.value = +l.text;
        li.textContent = l.long.join(", ");
        key.appendChild(li);
      });
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
      tip.style.left = Math.max(0, x + 12 + tip.offsetWidth > el.clientWidth ? x - 12 - tip.offsetWidth : x + 12) + "px";
      tip.style.top = (box.top - outer.top + u.valToPos(best.p.y, "y") - 10) + "px";
    }

    var narrow = el.clientWidth < 500;
    var opts = {
      mode: 2,
      width: Math.max(200, el.clientWidth),
      height: narrow ? 260 : 300,
      legend: {live: false},
      cursor: {x: false, y: false, points: {show: false}, drag: {x: false, y: false, setScale: false}},
      scales: {
        x: {time: false, distr: spec.xLog ? 3 : 1, range: spec.xLog ? logRange : linRange},
        y: {distr: spec.yLog ? 3 : 1, range: spec.yLog ? logRange : linRange},
      },
      axes: [
        {label: spec.xLabel, values: spec.xLog ? logValues(spec.xFmt) : function (u, s) { return s.map(spec.xFmt); }},
        {label: spec.yLabel, size: narrow ? 58 : 70,
         values: spec.yLog ? logValues(spec.yFmt) : function (u, s) { return s.map(spec.yFmt); }},
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
      open(hovered.p.name, true);
    });
  }

  function hiddenNote(st, count) {  // what the listing switch would add, for an empty chart
    if (st.all) return "";
    var n = count(passing(st, true)) - count(passing(st, false));
    return n > 0 ? " " + n + " more with “also shape builds, fixtures, …” ticked." : "";
  }

  function narrowChart() {
    return document.getElementById("device-chart").clientWidth < 500;
  }

  function pointLabel(r, t) {
    return r.name + (Object.keys(r.targets).length > 1 ? " (" + t + ")" : "");
  }

  function qualityChart(st, pass, chart) {  // chart: [element id, family, metric]
    var id = chart[0], family = chart[1], m = chart[2];
    var ok = {label: m, color: PALETTE[family === "llm" ? 1 : 0], hollow: false, pts: []};
    var bad = {label: m + " (below a verify bar)", color: PALETTE[family === "llm" ? 1 : 0], hollow: true, pts: []};
    function pick(list) {
      return list.filter(function (x) {
        return x[0].family === family && x[0].plotted && x[2].bytes != null && x[2].quality[m] != null;
      });
    }
    pick(pass).forEach(function (x) {
      (x[2].failed ? bad : ok).pts.push({name: x[0].name, target: x[1], x: x[2].bytes, y: x[2].quality[m],
                                         label: pointLabel(x[0], x[1])});
    });
    scatter(document.getElementById(id), {
      empty: "No built " + (family === "llm" ? "LLM" : "encoder") + " with " + m + " passes the filters." +
        hiddenNote(st, function (l) { return pick(l).length; }),
      xLabel: "bytes shipped for the target (log)", yLabel: m,
      xLog: true, yLog: false, xFmt: fmtBytes, yFmt: function (v) { return +v.toFixed(6) + ""; },
      series: [ok, bad],
      tip: function (p, s) {
        return [p.name + " on " + p.target, m + " = " + p.y.toFixed(5) + (s.hollow ? " (below a bar)" : ""),
                "shipped: " + fmtBytes(p.x)];
      },
    });
  }

  function deviceChart(st, pass) {
    var S = DATA.series;
    var built = {label: S["read back"], color: PALETTE[0], hollow: false, pts: []};
    var estimated = {label: S.estimated, color: PALETTE[4], hollow: true, pts: []};
    var measured = {label: S.measured, color: PALETTE[2], hollow: false, pts: []};
    function pick(list) {
      return list.filter(function (x) { return x[2].decode && x[2].memory != null; });
    }
    pick(pass).forEach(function (x) {
      var tv = x[2], label = pointLabel(x[0], x[1]);
      (tv.decode.from === "read back" ? built : estimated).pts.push(
        {name: x[0].name, target: x[1], x: tv.memory, y: tv.decode.ceiling, label: label, tv: tv});
      tv.measured.forEach(function (m) {
        measured.pts.push({name: x[0].name, target: x[1], x: tv.memory, y: m.tps, label: label + " measured",
                           tv: tv, m: m});
      });
    });
    scatter(document.getElementById("device-chart"), {
      empty: "No LLM with on-device figures passes the filters." +
        hiddenNote(st, function (l) { return pick(l).length; }),
      xLabel: narrowChart() ? "memory on the device (log)" : "memory on the device, without the runtime (log)",
      yLabel: "decode tokens/s (log)",
      xLog: true, yLog: true, xFmt: fmtBytes, yFmt: fmtRate,
      series: [built, estimated, measured],
      tip: function (p, s) {
        if (p.m) {
          return [p.name + " on " + p.target + ": measured " + fmtRate(p.y) + " on " + p.m.device,
                  p.m.ratio == null ? "no ceiling of ours to compare" : p.m.ratio.toFixed(2) + " of our ceiling"];
        }
        return [p.name + " on " + p.target + " (" + s.label + ")", "memory: " + fmtBytes(p.x),
                "decode ≤ " + fmtRate(p.y)];
      },
    });
  }

  // ------------------------------------------------------------ tables

  function open(name, scroll) {  // show a recipe's details row
    var tb = document.getElementById("recipe-" + name);
    if (!tb) return;
    var btn = tb.querySelector("button.more"), det = tb.querySelector("tr.details");
    det.hidden = false;
    btn.setAttribute("aria-expanded", "true");
    Array.prototype.forEach.call(document.querySelectorAll("tbody.picked"), function (t) { t.classList.remove("picked"); });
    tb.classList.add("picked");
    if (scroll) tb.scrollIntoView({block: "center"});
  }

  Array.prototype.forEach.call(document.querySelectorAll("button.more"), function (btn) {
    btn.addEventListener("click", function () {
      var det = document.getElementById(btn.getAttribute("aria-controls"));
      det.hidden = !det.hidden;
      btn.setAttribute("aria-expanded", det.hidden ? "false" : "true");
    });
  });

  function sortRows(table, col, numeric, desc) {
    var groups = table.id === "catalog";
    var body = groups ? table : table.tBodies[0];
    var units = Array.prototype.slice.call(groups ? table.tBodies : body.rows);
    var keyOf = function (unit) {
      var row = groups ? unit.rows[0] : unit;
      var v = row.cells[col].getAttribute("data-sort");
      return numeric ? parseFloat(v) : v.toLowerCase();
    };
    units.sort(function (a, b) {
      var x = keyOf(a), y = keyOf(b);
      var c = (x < y ? -1 : x > y ? 1 : 0) * (desc ? -1 : 1);
      if (c) return c;
      var na = a.dataset.name || "", nb = b.dataset.name || "";
      return na < nb ? -1 : na > nb ? 1 : 0;
    });
    units.forEach(function (u) { body.appendChild(u); });
    var heads = table.tHead.rows[0].cells;
    Array.prototype.forEach.call(heads, function (h) { h.removeAttribute("aria-sort"); });
    heads[col].setAttribute("aria-sort", desc ? "descending" : "ascending");
  }

  function sortCatalog(sortValue) {
    var table = document.getElementById("catalog"), how = DATA.sorts[sortValue] || DATA.sorts.name;
    var th = table.querySelector('th[data-key="' + how[0] + '"]');
    sortRows(table, th.cellIndex, th.getAttribute("data-type") === "num", how[1]);
  }

  Array.prototype.forEach.call(document.querySelectorAll("table.sortable"), function (table) {
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, i) {
      th.addEventListener("click", function () {
        sortRows(table, i, th.getAttribute("data-type") === "num", th.getAttribute("aria-sort") === "ascending");
      });
    });
  });

  // ------------------------------------------------------------ render

  function render() {
    var st = current();
    var pass = passing(st, false);
    var shown = 0;
    Array.prototype.forEach.call(document.querySelectorAll("#catalog tbody.recipe"), function (tb) {
      var ok = recipeOk(byName[tb.dataset.name], st, false);
      tb.hidden = !ok;
      if (ok) shown++;
    });
    Array.prototype.forEach.call(document.querySelectorAll("#device tbody tr"), function (tr) {
      var r = byName[tr.dataset.name], t = tr.dataset.target, tv = r.targets[t];
      tr.hidden = !recipeOk(r, st, false) || (tv ? !targetOk(tv, t, st) : !!st.target && st.target !== t);
    });
    Array.prototype.forEach.call(document.querySelectorAll("#filters option[data-real]"), function (o) {
      o.textContent = o.textContent.replace(/\(\d+\)$/, "(" + (st.all ? o.dataset.all : o.dataset.real) + ")");
    });
    FILTERS.forEach(function (k) { controls[k].classList.toggle("active", !!st[k]); });
    var p = document.getElementById("shown");
    p.dataset.count = String(shown);
    var total = DATA.recipes.filter(function (r) { return st.all || r.listing === "model"; }).length;
    var h = hashFor(st);
    p.textContent = "Showing " + shown + " of " + total + (st.all ? " recipes" : " models") +
      (h ? " (" + h.replace(/&/g, ", ") + ")." : ".");
    DATA.charts.forEach(function (c) { qualityChart(st, pass, c); });
    deviceChart(st, pass);
    document.body.dataset.rendered = String((+document.body.dataset.rendered || 0) + 1);
  }

  function changed(ev) {
    writeHash(current());
    if (ev && ev.target === controls.sort) sortCatalog(controls.sort.value);
    render();
  }

  KEYS.forEach(function (k) { controls[k].addEventListener("change", changed); });
  document.getElementById("reset").addEventListener("click", function () {
    KEYS.forEach(function (k) { setValue(k, defaultOf(k)); });
    sortCatalog(controls.sort.value);
    changed();
  });
  window.addEventListener("hashchange", function () { applyHash(); sortCatalog(controls.sort.value); render(); });
  var resizing = null, width = window.innerWidth;
  window.addEventListener("resize", function () {
    if (window.innerWidth === width) return;
    width = window.innerWidth;
    clearTimeout(resizing);
    resizing = setTimeout(render, 150);
  });

  applyHash();
  sortCatalog(controls.sort.value);
  render();
})();
