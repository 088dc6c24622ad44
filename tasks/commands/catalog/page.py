"""The catalog page, ``catalog/index.html``: one self-contained file a maintainer chooses models with.

It opens from disk with no network: its CSS, scripts and data are inline, and nothing on it
loads a resource (its only URLs are links a reader may follow: the source model's card on the
Hugging Face Hub or PyPI, and a published bundle's card, folder and archive under ``dist/``).

What it shows, all from the catalog rows (:mod:`tasks.core.row`):

- **Filters** (``<form id="filters">``, one ``<select>`` each): family, size (parameter-count
  ranges, :data:`SIZES`, from ``parameters`` once built, else ``parameters_estimate``),
  precision, target, state, runs on (``npu`` / ``npu+cpu``) and runtime (what a bundle serves,
  as verify checked it: ``onnxruntime-qnn``, ``onnxruntime-genai``, ``genie``). A recipe that
  is not built has ``unknown`` size (encoders), runs-on and runtime. The filter state lives in
  the URL's fragment (``#family=llm&target=x-elite``, in :data:`FILTERS` order): a filtered
  view can be linked, and changing a filter rewrites the fragment.
- **Quality versus size** (``#quality-chart``): one point per built recipe and target
  (verified or verify-failed; shape builds are left out: their verify figures are a random
  network's). x = the target's shipped bytes (LLMs: the bundle's context binaries as verify
  read them back, ``device.<target>.bundle_bytes``; encoders: the compile artifacts, the
  EPContext model and its binary), log scale; y = a verify metric against fp32 (1 = identical),
  the row's first of :data:`QUALITY` unless the ``quality`` selector (``#quality=...``) names
  one; one series per metric, verify-failed points hollow. A chart of at most 12 points names
  them beside the points; hovering a point shows its figures, clicking it marks its table row.
- **Decode ceiling versus memory on the device** (``#device-chart``) and the table of on-device
  figures per LLM and target (``#device``): bundle bytes, KV-cache bytes, memory on the device,
  the decode ceiling (tokens/s) and the first-token lower bound (:mod:`tasks.llm.figures`,
  read back once built, estimated before). The page says, beside both, that they are ceilings
  and bounds from published figures, not measurements.
- **The catalog table** (``#catalog``): :data:`.table.COLUMNS` plus links (a recipe not
  built shows its parameters from the config, ``~``); every cell carries its sort value in
  ``data-sort``; a click on a header sorts (both tables).

For tests and readers without eyes on the canvas, each chart's container holds what it drew:
``data-count`` (points drawn) and ``data-points`` (JSON ``[{name, target, series, x, y}]``,
sorted), and ``#shown`` holds ``data-count`` (table rows shown). ``body[data-rendered]`` counts
renders (a script waits for it).

Charting library: **uPlot 1.6.32** (MIT, https://github.com/leeoniya/uPlot), vendored from the
npm tarball ``uplot-1.6.32.tgz`` into ``tasks/commands/catalog/assets/``: ``uPlot.iife.min.js`` (51,081
bytes, sha256 19c8d4c6...), ``uPlot.min.css`` (1,857 bytes) and ``uPlot.LICENSE`` (whose text is
copied into the page, as the license asks). Chosen because it is the smallest maintained library
with scatter plots (``mode: 2``) and log axes, draws on a canvas with no dependencies, and is
made for static pages; Chart.js 4.6.1 (MIT, ``chart.umd.min.js`` 210,082 bytes, 4.1 x) has
built-in tooltips and labels, which for a few dozen points are some 50 lines of ``page.js`` here;
Vega-Lite needs Vega (together several hundred kB). The page's own script and style are
``page.js`` and ``page.css`` beside it.

Deterministic: :func:`render_page` is a pure function of the rows and the published bundles
(no time, no paths other than the relative links, JSON with sorted keys): the same inputs give
byte-identical pages.
"""

from __future__ import annotations

import html
import json
import math
import os
from pathlib import Path
from urllib.parse import quote

from tasks.commands.catalog.table import COLUMNS, STATES, human_bytes, human_count

ASSETS = Path(__file__).resolve().parent / "assets"

#: the filters, in the order the page shows them and writes them into the URL fragment
FILTERS = (("family", "Family"), ("size", "Size (parameters)"), ("precision", "Precision"),
           ("target", "Target"), ("state", "State"), ("runs_on", "Runs on"), ("runtime", "Runtime"))

#: parameter-count ranges: (fragment value, label, from (inclusive), to (exclusive))
SIZES = (("lt100m", "under 100 M", 0, 1e8), ("100m-1b", "100 M to 1 B", 1e8, 1e9),
         ("1b-3b", "1 B to 3 B", 1e9, 3e9), ("3b-5b", "3 B to 5 B", 3e9, 5e9),
         ("5b-10b", "5 B to 10 B", 5e9, 1e10), ("10b-up", "10 B and more", 1e10, math.inf))

UNKNOWN = "unknown"

#: verify metrics the quality chart can plot (each against fp32, higher is better, 1 = identical),
#: in the order a row's default ("primary") metric is picked
QUALITY = {"pooled_cosine_mean": "mean-pooled cosine vs fp32 (encoders)",
           "token_agreement": "greedy token agreement vs fp32 (LLMs)",
           "logits_cosine_mean": "prefill logits cosine vs fp32 (LLMs)",
           "cosine_mean": "per-token cosine vs fp32 (encoders)"}

BUILT = ("verified", "verify-failed")


def size_bucket(row: dict) -> str:
    """The :data:`SIZES` value of the row's parameters (counted once built, else estimated
    from the config), ``unknown`` when neither is known."""
    n = row.get("parameters") or row.get("parameters_estimate")
    if n is None:
        return UNKNOWN
    return next(v for v, _, lo, hi in SIZES if lo <= n < hi)


def runs_on_kind(said: str | None) -> str:
    """``npu`` / ``npu+cpu`` from a ``runs_on`` string (:func:`tasks.contract.report.runs_on`), else unknown."""
    if not said:
        return UNKNOWN
    return "npu+cpu" if "cpu" in said else "npu"


def shipped_bytes(row: dict, target: str) -> int | None:
    """The target's shipped bytes, the quality chart's x: an LLM's bundle (its context
    binaries read back by verify), else the compile artifacts of that target."""
    dev = (row.get("device") or {}).get(target) or {}
    if dev.get("bundle_bytes") and str(dev.get("bundle_bytes_from", "")).startswith("read back"):
        return dev["bundle_bytes"]
    files = (row.get("artifacts") or {}).get(target)
    return sum(files.values()) if files else None


def page_data(rows: list[dict]) -> dict:
    """What the page's script works from: per recipe its facets (family, size, precision,
    state) and per target its runs-on kind, runtimes, shipped bytes, quality metrics and
    on-device figures; plus the filter names and the quality metrics, in order."""
    recipes = []
    for r in rows:
        targets = {}
        for t in r["targets"]:
            v = (r.get("verify") or {}).get(t)
            dev = (r.get("device") or {}).get(t)
            built = v is not None and r["state"] in BUILT
            targets[t] = {
                "runs_on": runs_on_kind(v["runs_on"]) if v else UNKNOWN,
                "runtimes": (sorted(v.get("runtimes") or {}) if v else []) or [UNKNOWN],
                "failed": bool(v and v.get("failures")),
                "bytes": shipped_bytes(r, t) if built else None,
                "quality": {m: v["metrics"][m] for m in QUALITY
                            if isinstance((v or {}).get("metrics", {}).get(m), (int, float))} if built else {},
                "device": None if not dev else {
                    k: dev.get(k) for k in ("bundle_bytes", "kv_cache_bytes", "kv_dtype", "runtime", "memory_bytes",
                                            "bytes_per_token", "decode_tokens_per_s_ceiling",
                                            "first_token_s_lower_bound")}
                | {"estimated": not str(dev.get("bundle_bytes_from", "")).startswith("read back")},
            }
        recipes.append({"name": r["name"], "family": r["family"], "size": size_bucket(r),
                        "precision": r["precision"], "state": r["state"], "targets": targets,
                        "plotted": r["state"] in BUILT and not r.get("shape_build")})
    return {"filters": [k for k, _ in FILTERS], "quality": list(QUALITY), "recipes": recipes}


def _facets(recipe: dict, key: str) -> set[str]:
    """The values a :func:`page_data` recipe has for filter ``key`` (several for per-target ones)."""
    tvs = recipe["targets"].values()
    if key == "target":
        return set(recipe["targets"])
    if key == "runs_on":
        return {tv["runs_on"] for tv in tvs}
    if key == "runtime":
        return {rt for tv in tvs for rt in tv["runtimes"]}
    return {recipe[key]}


def _options(data: dict) -> dict[str, list[tuple[str, str, int]]]:
    """{filter: [(value, label, recipes that have it)]}: sizes and states in their own order,
    other values sorted, ``unknown`` last; values no recipe has are left out."""
    from collections import Counter


    fixed = {"size": [v for v, *_ in SIZES], "state": list(STATES)}
    labels = {v: lab for v, lab, *_ in SIZES} | {UNKNOWN: "unknown (not built)"}
    out = {}
    for key, _ in FILTERS:
        counts = Counter(v for r in data["recipes"] for v in _facets(r, key))
        order = fixed.get(key, [])
        vals = sorted(counts, key=lambda v: (v == UNKNOWN, order.index(v) if v in order else 0, v))
        out[key] = [(v, labels.get(v, v), counts[v]) for v in vals]
    return out


# ------------------------------------------------------------ links


def published_bundles(rows: list[dict], dist_dir: Path, catalog_dir: Path) -> dict[str, dict]:
    """{recipe: {"card", "folder", "archive", "build_key", "current"}} of each recipe published
    in ``dist_dir`` (``<recipe>/manifest.json`` readable, with its ``build_key``): the links are
    relative to ``catalog_dir`` (where index.html is); ``archive`` is None when
    ``<recipe>-<build_key>.tar.gz`` is absent; ``current`` says whether the bundle is of the
    row's present stage keys (:func:`tasks.commands.publish.bundle.short_key`'s digest)."""
    from tasks.store.digest import digest_json

    out = {}
    for r in rows:
        folder = Path(dist_dir) / r["name"]
        try:
            key = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))["build_key"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        keys = r.get("stage_keys") or {}
        current = bool(keys) and None not in keys.values() and digest_json(keys)[:12] == key
        archive = Path(dist_dir) / f"{r['name']}-{key}.tar.gz"
        out[r["name"]] = {"card": _rel(folder / "README.md", catalog_dir), "folder": _rel(folder, catalog_dir) + "/",
                          "archive": _rel(archive, catalog_dir) if archive.is_file() else None,
                          "build_key": key, "current": current}
    return out


def _rel(path: Path, start: Path) -> str:
    """``path`` as a URL relative to the folder ``start`` (an absolute file URL when there is
    no relative path, e.g. another drive)."""
    try:
        rel = os.path.relpath(path, start)
    except ValueError:
        return Path(path).resolve().as_uri()
    return quote(Path(rel).as_posix())


def _source_link(row: dict) -> tuple[str, str] | None:
    """(URL, text) of the source model's page: its Hub card (hf and shape sources) or PyPI."""
    s = row["source"]
    if s.get("repo") and s["kind"] in ("hf", "shape"):
        return f"https://huggingface.co/{quote(s['repo'])}", "source card"
    if s.get("package"):
        return f"https://pypi.org/project/{quote(s['package'])}/", "source package"
    return None


def _links_cell(row: dict, pub: dict | None) -> tuple[str, str]:
    """(HTML, sort value) of a row's links cell."""
    esc = html.escape
    parts = []
    src = _source_link(row)
    if src:
        parts.append(f'<a href="{esc(src[0])}">{esc(src[1])}</a>')
    if pub:
        parts.append(f'<a href="{esc(pub["card"])}">card</a>')
        parts.append(f'<a href="{esc(pub["folder"])}">bundle</a>')
        if pub["archive"]:
            parts.append(f'<a href="{esc(pub["archive"])}">archive</a>')
        if not pub["current"]:
            parts.append(f'<span class="note">(published from another build: {esc(pub["build_key"])})</span>')
    elif row["state"] == "verified" and not row.get("shape_build"):
        parts.append(f'<span class="note">not published: <code>doit publish:{esc(row["name"])}</code></span>')
    sort = ("2" if pub and pub["current"] else "1" if pub else "0") + (src[1] if src else "")
    return " ".join(parts), sort


# ------------------------------------------------------------ rendering


def _asset(name: str) -> str:
    return (ASSETS / name).read_text(encoding="utf-8")


def _script_json(obj) -> str:
    """JSON safe inside a <script> element (no "</", no "<!--")."""
    text = json.dumps(obj, sort_keys=True, ensure_ascii=True, separators=(",", ":"))
    return text.replace("<", "\\u003c")


def _bytes(n) -> str:

    return human_bytes(n) if n is not None else "unknown"


def _human_count(n) -> str:
    return human_count(n)


def _device_rows(rows: list[dict]) -> list[tuple[dict, str, dict]]:
    return [(r, t, f) for r in rows for t, f in sorted((r.get("device") or {}).items())]


#: the on-device table's columns: header, cell text, sort value, numeric
DEVICE_COLUMNS = [
    ("Recipe", lambda r, t, f: r["name"], lambda r, t, f: r["name"], False),
    ("Target", lambda r, t, f: t, lambda r, t, f: t, False),
    ("State", lambda r, t, f: r["state"], lambda r, t, f: r["state"], False),
    ("Bundle", lambda r, t, f: _bytes(f.get("bundle_bytes")), lambda r, t, f: f.get("bundle_bytes") or 0, True),
    ("Bundle from", lambda r, t, f: "read back" if str(f.get("bundle_bytes_from", "")).startswith("read back")
     else "estimated", lambda r, t, f: str(f.get("bundle_bytes_from", "")), False),
    ("KV cache", lambda r, t, f: f"{_bytes(f.get('kv_cache_bytes'))} at {f.get('context_length')}"
     + (f" ({f['kv_dtype']}, {f.get('runtime')})" if f.get("kv_dtype") else ""),
     lambda r, t, f: f.get("kv_cache_bytes") or 0, True),
    ("Memory on device", lambda r, t, f: _bytes(f.get("memory_bytes")), lambda r, t, f: f.get("memory_bytes") or 0, True),
    ("Memory includes", lambda r, t, f: ", ".join(f.get("memory_includes") or []),
     lambda r, t, f: ", ".join(f.get("memory_includes") or []), False),
    ("Decode ceiling", lambda r, t, f: "unknown" if f.get("decode_tokens_per_s_ceiling") is None
     else f"{f['decode_tokens_per_s_ceiling']:.1f} tok/s", lambda r, t, f: f.get("decode_tokens_per_s_ceiling") or 0, True),
    ("DRAM", lambda r, t, f: "unknown" if f.get("dram_gbps") is None else f"{f['dram_gbps']} GB/s",
     lambda r, t, f: f.get("dram_gbps") or 0, True),
    ("First token >=", lambda r, t, f: "unknown" if f.get("first_token_s_lower_bound") is None
     else f"{f['first_token_s_lower_bound'] * 1000:.1f} ms for {f.get('prefill_length')} tokens",
     lambda r, t, f: f.get("first_token_s_lower_bound") or 0, True),
    ("NPU peak", lambda r, t, f: "unknown" if f.get("npu_tops") is None else f"{f['npu_tops']} TOPS",
     lambda r, t, f: f.get("npu_tops") or 0, True),
]


def _table(table_id: str, heads: list[tuple[str, bool]], body: list[str]) -> str:
    esc = html.escape
    th = "".join(f'<th data-type="{"num" if num else "text"}">{esc(h)}</th>' for h, num in heads)
    return (f'<div class="scroll"><table id="{table_id}" class="sortable">\n<thead><tr>{th}</tr></thead>\n<tbody>\n'
            + "".join(body) + "</tbody>\n</table></div>\n")


def _td(text, sort, cls: str = "", title: str = "", raw: bool = False) -> str:
    esc = html.escape
    c = f' class="{esc(cls)}"' if cls else ""
    t = f' title="{esc(title)}"' if title else ""
    return f'<td{c}{t} data-sort="{esc(str(sort))}">{text if raw else esc(str(text))}</td>'


def render_page(rows: list[dict], published: dict | None = None) -> str:
    """The page (module docstring) for catalog ``rows`` and the ``published`` bundles
    (:func:`published_bundles`; None: no links to bundles)."""
    from tasks.llm.figures import CEILING_NOTE

    esc = html.escape
    published = published or {}
    data = page_data(rows)
    options = _options(data)

    out = ['<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n',
           '<meta name="viewport" content="width=device-width, initial-scale=1">\n',
           "<title>npubuild model catalog</title>\n",
           "<!-- uPlot 1.6.32 (https://github.com/leeoniya/uPlot), inlined below:\n",
           _asset("uPlot.LICENSE").replace("--", "- -"), "-->\n",
           "<style>\n", _asset("uPlot.min.css"), "\n", _asset("page.css"), "</style>\n</head>\n<body>\n",
           "<h1>npubuild model catalog</h1>\n",
           f"<p>Generated by <code>doit catalog</code> from recipes and the build cache: {len(rows)} recipes. "
           "Filters are kept in the address's <code>#</code> part, so a filtered view can be linked. "
           "Click a column header to sort.</p>\n"]

    out.append('<form id="filters">\n')
    for key, label in FILTERS:
        opts = "".join(f'<option value="{esc(v)}">{esc(lab)} ({n})</option>' for v, lab, n in options[key])
        out.append(f'<label>{esc(label)} <select name="{key}" id="filter-{key}"><option value="">all</option>'
                   f"{opts}</select></label>\n")
    out.append('<button type="button" id="reset">all recipes</button>\n</form>\n'
               '<p id="shown" data-count="">&nbsp;</p>\n<p id="hash-note" hidden></p>\n')

    metrics = sorted({m for r in data["recipes"] for tv in r["targets"].values() for m in tv["quality"]},
                     key=list(QUALITY).index)
    qopts = "".join(f'<option value="{esc(m)}" title="{esc(QUALITY[m])}">{esc(m)}</option>' for m in metrics)
    out.append('<div class="charts">\n<section class="panel">\n<h2>Quality versus size (built models)</h2>\n'
               f'<label>Quality <select id="quality" name="quality" title="the first of {esc(", ".join(QUALITY))} '
               f'that a point has, unless one is chosen"><option value="">automatic: the first of these a point has'
               f'</option>{qopts}</select></label>\n'
               '<div class="chart" id="quality-chart" data-count="" data-points=""></div>\n'
               '<p class="note">One point per built recipe and target: x = the bytes shipped for that target '
               "(LLMs: the bundle's context binaries as verify read them back; encoders: the EPContext model and its "
               "binary), y = a verify metric against fp32 (1 = identical). Hollow: below a verify threshold. "
               "Shape builds (random weights) are left out.</p>\n</section>\n"
               '<section class="panel">\n<h2>Decode ceiling versus memory on the device (LLMs)</h2>\n'
               '<div class="chart" id="device-chart" data-count="" data-points=""></div>\n'
               '<p class="note ceiling"><strong>Ceilings and bounds, not measurements</strong>: nothing here ran on a '
               "Snapdragon device. Per target, from its published DRAM bandwidth and NPU peak "
               f"(<code>tasks/qnn/targets.py</code>): {esc(CEILING_NOTE.removeprefix('ceilings, not measurements: '))}. "
               "Filled: the bundle read back from a build; "
               "hollow: estimated from the model's config before a build. Targets without a published figure "
               "are left out.</p>\n</section>\n</div>\n")

    out.append("<h2>Recipes</h2>\n")
    body = []
    for r in rows:
        cells = []
        for head, text, sort, _ in COLUMNS:
            if head == "State":
                why = r["reason"] or "; ".join(r["failures"])
                cells.append(_td(text(r), sort(r), cls=r["state"], title=why or ""))
            elif head == "Parameters" and r["parameters"] is None and r.get("parameters_estimate"):
                cells.append(_td("~" + _human_count(r["parameters_estimate"]), r["parameters_estimate"],
                                 title="from the model's config (not counted: not built)"))
            else:
                cells.append(_td(text(r), sort(r)))
        links, lsort = _links_cell(r, published.get(r["name"]))
        cells.append(_td(links, lsort, raw=True))
        body.append(f'<tr id="recipe-{esc(r["name"])}" data-name="{esc(r["name"])}">{"".join(cells)}</tr>\n')
    out.append(_table("catalog", [(h, num) for h, _, _, num in COLUMNS] + [("Links", False)], body))

    out.append('<h2>On-device figures per LLM and target: ceilings and bounds, not measurements</h2>\n'
               '<p class="note ceiling">Bundle bytes are read back from a build, else estimated from the model\'s '
               "config and the recipe's precision; memory on the device is weights + KV cache (+ spill-fill and I/O "
               "buffers once built), without the runtime's own (not measured; no public figure); the decode ceiling is "
               "DRAM bandwidth / bytes read per token, the first-token bound the prefill's ops / the NPU's INT8 peak "
               "(<code>tasks/llm/figures.py</code>). A real device is slower.</p>\n")
    body = []
    for r, t, f in _device_rows(rows):
        cells = "".join(_td(text(r, t, f), sort(r, t, f), cls=r["state"] if head == "State" else "")
                        for head, text, sort, _ in DEVICE_COLUMNS)
        body.append(f'<tr data-name="{esc(r["name"])}" data-target="{esc(t)}">{cells}</tr>\n')
    out.append(_table("device", [(h, num) for h, _, _, num in DEVICE_COLUMNS], body))

    out.append(f'<script type="application/json" id="catalog-data">{_script_json(data)}</script>\n')
    out.append("<script>\n" + _asset("uPlot.iife.min.js") + "</script>\n")
    out.append("<script>\n" + _asset("page.js") + "</script>\n</body>\n</html>\n")
    return "".join(out)


def catalog_page(rows: list[dict], catalog_dir: Path) -> str:
    """index.html for ``catalog_dir``: :func:`render_page` with the bundles published in
    :func:`tasks.store.paths.dist_dir`, linked relative to ``catalog_dir``."""
    from tasks.store import paths

    return render_page(rows, published_bundles(rows, paths.dist_dir(), Path(catalog_dir)))
