"""The catalog page, ``catalog/index.html``: one self-contained file to pick a model with.

It opens from disk with no network: its CSS, scripts and data are inline, and nothing on it
loads a resource (its only URLs are links a reader may follow: the source model's card on the
Hugging Face Hub or PyPI, a published bundle's card, folder and archive under ``dist/``, and the
public pages the measured figures come from).

What it shows, all from the catalog rows (:mod:`tasks.core.row`, :func:`.write.catalog_rows`):

- **Real models by default.** A switch (``#all``, fragment ``all=1``) adds the rows whose
  ``listing`` is not ``model``: shape builds, fixtures, unsupported recipes and aliases
  (:mod:`.listing`).
- **Filters** (``<form id="filters">``, one ``<select>`` each, :data:`FILTERS`): task, licence,
  family, size (parameter-count ranges, :data:`SIZES`), fits in N GB (:data:`FITS`: the
  memory on the device of some target, known and at most N x 10^9 bytes), precision, target,
  state, runs on and runtime (what a bundle serves: as verify checked it once built, else as
  the recipe states it). The filters and the sort live in the URL's fragment
  (``#task=text-generation&fits=8``, in :data:`FILTERS` order): a filtered view can be linked.
- **One chart per metric family**, each point labelled (its name, else a number keyed under
  the chart; points on the same spot share a label): encoder quality (mean-pooled cosine vs
  fp32 against the bytes shipped), LLM quality (greedy token agreement vs fp32 against the
  bytes shipped) and LLM decode speed (tokens/s against memory on the device: our ceilings,
  read back or estimated, and the figures others measured on devices, :data:`SERIES`).
- **The recipes** (``#catalog``): :data:`PICK` columns, which fit a 1280-pixel screen; every
  other fact of a row (:data:`.table.COLUMNS`, the reason it is not verified, its links) in a
  details row its name's button opens. Below 760 pixels each row is a card (no sideways
  scrolling). A click on a header, or the ``sort`` selector, sorts.
- **Ceilings beside measurements** (``#device``): per LLM and target, memory on the device,
  the decode ceiling and the first-token bound (:mod:`tasks.llm.figures`), and beside them what
  others measured on a device for the same model and precision (``published.json``: the
  figure, its page and date), with measured / ceiling.

For tests and readers without eyes on the canvas, each chart's container holds what it drew:
``data-count`` (points drawn), ``data-points`` (JSON ``[{name, target, series, x, y}]``,
sorted) and ``data-labels`` (JSON ``[{text, names, box: [x, y, w, h]}]``: each label drawn, the
points it names, its box in CSS pixels of the plot); ``#shown`` holds ``data-count`` (recipes
shown). ``body[data-rendered]`` counts renders (a script waits for it).

Charting library: **uPlot 1.6.32** (MIT, https://github.com/leeoniya/uPlot), vendored from the
npm tarball ``uplot-1.6.32.tgz`` into ``tasks/commands/catalog/assets/``: ``uPlot.iife.min.js`` (51,081
bytes, sha256 19c8d4c6...), ``uPlot.min.css`` (1,857 bytes) and ``uPlot.LICENSE`` (whose text is
copied into the page, as the license asks). Chosen because it is the smallest maintained library
with scatter plots (``mode: 2``) and log axes, draws on a canvas with no dependencies, and is
made for static pages; Chart.js 4.6.1 (MIT, ``chart.umd.min.js`` 210,082 bytes, 4.1 x) has
built-in tooltips and labels, which for a few dozen points are some 80 lines of ``page.js`` here;
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
from pathlib import Path

from tasks.commands.catalog.listing import LISTINGS
from tasks.commands.catalog.page_tables import PICK, device_table, published_bundles, ratio, recipe_rows, sources_note
from tasks.commands.catalog.table import COLUMNS, STATES

ASSETS = Path(__file__).resolve().parent / "assets"

#: the filters, in the order the page shows them and writes them into the URL fragment
FILTERS = (
    ("task", "Task"),
    ("license", "Licence"),
    ("family", "Family"),
    ("size", "Size"),
    ("fits", "Fits in"),
    ("precision", "Precision"),
    ("target", "Target"),
    ("state", "State"),
    ("runs_on", "Runs on"),
    ("runtime", "Runtime"),
)

#: parameter-count ranges: (fragment value, label, from (inclusive), to (exclusive))
SIZES = (
    ("lt100m", "under 100 M", 0, 1e8),
    ("100m-1b", "100 M to 1 B", 1e8, 1e9),
    ("1b-3b", "1 B to 3 B", 1e9, 3e9),
    ("3b-5b", "3 B to 5 B", 3e9, 5e9),
    ("5b-10b", "5 B to 10 B", 5e9, 1e10),
    ("10b-up", "10 B and more", 1e10, math.inf),
)

#: the "fits in" choices, GB of memory on the device (10^9 bytes): phones have 8 to 16 GB of
#: RAM shared with everything else, X Elite laptops 16 to 64 GB
FITS = (1, 2, 4, 6, 8, 12, 16, 24, 32)

UNKNOWN = "unknown"


def quality_charts() -> list[tuple[str, str, str, str, str, str]]:
    """One chart per model family that declares one (``Family.catalog_chart``), in registry
    order: (element id ``<family>-chart``, title, family, metric plotted, its description, what
    one point is built from)."""
    from tasks.contract import families

    return [
        (f"{f.name}-chart", title, f.name, metric, what, noun)
        for f in families()
        if f.catalog_chart
        for title, noun, metric, what in [f.catalog_chart]
    ]


#: the decode chart's series
SERIES = {"read back": "our ceiling, built", "estimated": "our ceiling, estimated", "measured": "measured by others"}

#: the sort selector's choices: (fragment value, label, column key, descending)
SORTS = (
    ("name", "name", "name", False),
    ("size", "size, smallest first", "parameters", False),
    ("memory", "memory, smallest first", "memory", False),
    ("decode", "decode, fastest first", "decode", True),
    ("state", "state, verified first", "state", False),
)


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
    """The target's shipped bytes, the quality charts' x: an LLM's bundle (its context
    binaries read back by verify), else the compile artifacts of that target."""
    dev = (row.get("device") or {}).get(target) or {}
    if dev.get("bundle_bytes") and str(dev.get("bundle_bytes_from", "")).startswith("read back"):
        return dev["bundle_bytes"]
    files = (row.get("artifacts") or {}).get(target)
    return sum(files.values()) if files else None


def memory(row: dict, target: str) -> tuple[int | None, str]:
    """(bytes, where from) of the memory the model holds on the device on ``target``, without
    the runtime's own: an LLM's ``device`` figure (weights + KV cache, + spill-fill and I/O
    buffers once built: :mod:`tasks.llm.figures`); a built encoder's context binaries as verify
    read them back, each with its largest graph's spill-fill and I/O buffers; else unknown."""
    dev = (row.get("device") or {}).get(target)
    if dev and dev.get("memory_bytes") is not None:
        built = str(dev.get("bundle_bytes_from", "")).startswith("read back")
        return dev["memory_bytes"], ("read back" if built else "estimated")
    bins = ((row.get("verify") or {}).get(target) or {}).get("binaries") or {}
    if bins and all(b.get("bytes") for b in bins.values()):
        extra = sum(
            max(
                ((g.get("spill_fill_bytes") or 0) + (g.get("io_bytes") or 0) for g in (b.get("graphs") or {}).values()),
                default=0,
            )
            for b in bins.values()
        )
        return sum(b["bytes"] for b in bins.values()) + extra, "read back"
    return None, UNKNOWN


def page_data(rows: list[dict]) -> dict:
    """What the page's script works from: per recipe its facets (task, licence, family, size,
    precision, state, listing) and per target its runs-on kind, runtimes, shipped bytes,
    quality metrics, memory and on-device figures with the measured ones; plus the filter
    names, the charts and the sorts."""
    recipes, charts = [], quality_charts()
    for r in rows:
        targets = {}
        for t in r["targets"]:
            v = (r.get("verify") or {}).get(t)
            dev = (r.get("device") or {}).get(t)
            built = v is not None  # verify results: a build whose every stage has an entry
            mem, mem_from = memory(r, t)
            ceiling = dev.get("decode_tokens_per_s_ceiling") if dev else None
            targets[t] = {
                "runs_on": runs_on_kind(v["runs_on"]) if v else UNKNOWN,
                "runtimes": (sorted(v.get("runtimes") or {}) if v else []) or r.get("runtimes") or [UNKNOWN],
                "failed": bool(v and v.get("failures")),
                "bytes": shipped_bytes(r, t) if built else None,
                "quality": {
                    m: v["metrics"][m]
                    for _, _, _, m, *_ in charts
                    if isinstance((v or {}).get("metrics", {}).get(m), (int, float))
                }
                if built
                else {},
                "memory": mem,
                "memory_from": mem_from,
                "decode": None if ceiling is None else {"ceiling": ceiling, "from": mem_from},
                "measured": [
                    {
                        "tps": m["decode_tokens_per_s"],
                        "device": m["device"],
                        "url": m["url"],
                        "ratio": ratio(m["decode_tokens_per_s"], ceiling),
                    }
                    for m in (r.get("measured") or {}).get(t, [])
                ],
            }
        recipes.append(
            {
                "name": r["name"],
                "family": r["family"],
                "task": r["task"],
                "license": r["license"],
                "size": size_bucket(r),
                "precision": r["precision"],
                "state": r["state"],
                "listing": r.get("listing") or "model",
                "targets": targets,
                "plotted": bool(r.get("verify")) and not r.get("shape_build"),
            }
        )
    return {
        "filters": [k for k, _ in FILTERS],
        "charts": [[c[0], c[2], c[3]] for c in charts],
        "series": SERIES,
        "sorts": {v: [col, desc] for v, _, col, desc in SORTS},
        "recipes": recipes,
    }


def _facets(recipe: dict, key: str) -> set[str]:
    """The values a :func:`page_data` recipe has for filter ``key`` (several for per-target
    ones; ``fits``: every :data:`FITS` choice some target's known memory is within)."""
    tvs = recipe["targets"].values()
    if key == "target":
        return set(recipe["targets"])
    if key == "runs_on":
        return {tv["runs_on"] for tv in tvs}
    if key == "runtime":
        return {rt for tv in tvs for rt in tv["runtimes"]}
    if key == "fits":
        return {str(n) for n in FITS for tv in tvs if tv["memory"] is not None and tv["memory"] <= n * 1e9}
    return {recipe[key]}


def _options(data: dict) -> dict[str, list[tuple[str, str, int]]]:
    """{filter: [(value, label, recipes that have it)]}, counted over the real models
    (``listing`` model) and, after a slash, all recipes: sizes, fits and states in their own
    order, other values sorted, ``unknown`` last; values no recipe has are left out."""
    from collections import Counter

    fixed = {"size": [v for v, *_ in SIZES], "state": list(STATES), "fits": [str(n) for n in FITS]}
    labels = {v: lab for v, lab, *_ in SIZES} | {str(n): f"{n} GB" for n in FITS} | {UNKNOWN: "unknown (not built)"}
    out = {}
    for key, _ in FILTERS:
        every = Counter(v for r in data["recipes"] for v in _facets(r, key))
        real = Counter(v for r in data["recipes"] if r["listing"] == "model" for v in _facets(r, key))
        order = fixed.get(key, [])
        vals = sorted(every, key=lambda v: (v == UNKNOWN, order.index(v) if v in order else len(order), v))
        out[key] = [(v, labels.get(v, v), real[v], every[v]) for v in vals]
    return out


# ------------------------------------------------------------ rendering


def _asset(name: str) -> str:
    return (ASSETS / name).read_text(encoding="utf-8")


def _script_json(obj) -> str:
    """JSON safe inside a <script> element (no "</", no "<!--")."""
    text = json.dumps(obj, sort_keys=True, ensure_ascii=True, separators=(",", ":"))
    return text.replace("<", "\\u003c")


def render_page(rows: list[dict], published: dict | None = None) -> str:
    """The page (module docstring) for catalog ``rows`` and the ``published`` bundles
    (:func:`published_bundles`; None: no links to bundles)."""
    from tasks.contract import families

    esc = html.escape
    ceilings = " ".join(f.catalog_note for f in families() if f.catalog_note)  # how each family's are made
    published = published or {}
    data = page_data(rows)
    options = _options(data)
    real = sum(r["listing"] == "model" for r in data["recipes"])
    others = {k: sum(r["listing"] == k for r in data["recipes"]) for k in LISTINGS[1:]}

    out = [
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n',
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n',
        "<title>npubuild model catalog</title>\n",
        "<!-- uPlot 1.6.32 (https://github.com/leeoniya/uPlot), inlined below:\n",
        _asset("uPlot.LICENSE").replace("--", "- -"),
        "-->\n",
        "<style>\n",
        _asset("uPlot.min.css"),
        "\n",
        _asset("page.css"),
        "</style>\n</head>\n<body>\n",
        "<h1>npubuild model catalog</h1>\n",
        f"<p>{real} models to build for Snapdragon NPUs, from <code>doit catalog</code> (recipes and the local "
        "build cache). Filter by what you need; the address keeps the filters, so a view can be linked. "
        "Open a recipe's name for every fact of it.</p>\n",
    ]

    out.append('<form id="filters">\n')
    for key, label in FILTERS:
        opts = "".join(
            f'<option value="{esc(v)}" data-real="{n}" data-all="{a}">{esc(lab)} ({n})</option>'
            for v, lab, n, a in options[key]
        )
        first = "any size" if key == "fits" else "all"
        out.append(
            f'<label>{esc(label)} <select name="{key}" id="filter-{key}"><option value="">{first}</option>'
            f"{opts}</select></label>\n"
        )
    sorts = "".join(f'<option value="{esc(v)}">{esc(lab)}</option>' for v, lab, *_ in SORTS)
    out.append(f'<label>Sort by <select name="sort" id="sort">{sorts}</select></label>\n')
    also = ", ".join(f"{n} {k}{'' if n == 1 else ('es' if k.endswith('s') else 's')}" for k, n in others.items() if n)
    out.append(
        f'<label class="switch"><input type="checkbox" id="all" name="all"> also shape builds, fixtures, '
        f"unsupported recipes and aliases{f' ({esc(also)})' if also else ''}</label>\n"
        '<button type="button" id="reset">reset</button>\n</form>\n'
        '<p id="shown" data-count="">&nbsp;</p>\n<p id="hash-note" hidden></p>\n'
    )

    out.append('<div class="charts">\n')
    for cid, title, _, metric, what, noun in quality_charts():
        out.append(
            f'<section class="panel">\n<h2>{esc(title)}</h2>\n'
            f'<div class="chart" id="{cid}" data-count="" data-points="" data-labels=""></div>\n'
            f'<ol class="key" id="{cid}-key"></ol>\n'
            f'<p class="note">One point per built {esc(noun)} and target: '
            f"x = the bytes shipped for the target, y = <code>{esc(metric)}</code> "
            f"({esc(what)}, 1 = identical). "
            "Hollow: below a verify bar. Shape builds (random weights) are never plotted.</p>\n</section>\n"
        )
    out.append(
        '<section class="panel">\n<h2>LLMs: decode speed versus memory</h2>\n'
        '<div class="chart" id="device-chart" data-count="" data-points="" data-labels=""></div>\n'
        '<ol class="key" id="device-chart-key"></ol>\n'
        '<p class="note ceiling"><strong>Our figures are ceilings, not measurements</strong>: nothing here ran '
        f"on a Snapdragon device ({esc(ceilings)}). "
        "Green: decode rates others measured on a device for the same model and precision (their own "
        "bundles), drawn at our build's memory; the table below gives each with its page, date and the "
        "ratio to our ceiling.</p>\n</section>\n</div>\n"
    )

    out.append("<h2>Recipes</h2>\n")
    shown = [(head, text) for head, text, _, _ in COLUMNS if head not in ("Recipe", "State", "Precision")]
    body = [
        recipe_rows(r, d, published.get(r["name"]), [(head, text(r)) for head, text in shown])
        for r, d in zip(rows, data["recipes"])
    ]
    th = "".join(f'<th data-key="{k}" data-type="{"num" if num else "text"}">{esc(h)}</th>' for k, h, num in PICK)
    out.append(
        f'<div class="scroll"><table id="catalog" class="sortable cards">\n<thead><tr>{th}</tr></thead>\n'
        + "".join(body)
        + "</table></div>\n"
    )

    out.append(
        '<h2 id="ceilings">Our ceilings beside measurements on devices</h2>\n'
        '<p class="note ceiling">Memory on the device is weights + KV cache (+ spill-fill and I/O buffers once '
        "built), without the runtime's own (not measured; no public figure); ~ marks an estimate before a "
        "build. The decode ceiling is DRAM bandwidth / bytes read and written per token, the first-token bound "
        "the prefill's ops / the NPU's INT8 peak (<code>tasks/llm/figures.py</code>): a real device is slower, "
        "and the measured figures show by how much.</p>\n"
    )
    out.append(device_table(rows, data))
    out.append(sources_note())

    out.append(f'<script type="application/json" id="catalog-data">{_script_json(data)}</script>\n')
    out.append("<script>\n" + _asset("uPlot.iife.min.js") + "</script>\n")
    out.append("<script>\n" + _asset("page.js") + "</script>\n</body>\n</html>\n")
    return "".join(out)


def catalog_page(rows: list[dict], catalog_dir: Path) -> str:
    """index.html for ``catalog_dir``: :func:`render_page` with the bundles published in
    :func:`tasks.store.paths.dist_dir`, linked relative to ``catalog_dir``."""
    from tasks.store import paths

    return render_page(rows, published_bundles(rows, paths.dist_dir(), Path(catalog_dir)))
