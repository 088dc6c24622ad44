"""The catalog page (tasks/commands/catalog/page.py) in headless Chromium, driven through the DevTools
protocol (scripts/chromium_page.py): filters loaded from the URL fragment and changed through
the page's controls, the table rows and chart points they leave, the fragment they write; the
page loads nothing but itself and raises no script error; the same rows give the same bytes.

The project: the tiny BERT built at w8a16 (``t8``, x-elite), at w4a16 for two targets (``t4``),
``t8-strict`` (t8's stages with a threshold no model meets: verify-failed), the tiny trained
Qwen2 built with a CPU verify (``tq8``) and, not built, its HTP recipe and three of the
field's LLM recipes (estimated on-device figures from recipes/models/). ``t8`` is published.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import REPO, TINY_RECIPE, Project
from llm_fixtures import tiny_model

sys.path.insert(0, str(REPO / "scripts"))
from chromium_page import CHROMIUM, Chromium  # noqa: E402  (scripts/: the DevTools client)

LLM_DATA = ["tasks/llm/data/tiny-corpus.txt", "recipes/data/prompts-tiny.txt", "recipes/data/ppl-tiny.txt",
            "recipes/data/calib-chat.jsonl"]
FIELD = ["qwen7b-int4", "qwen2.5-0.5b-w4a16", "llama3.2-1b-w4a16"]  # not built: estimated figures
LLMS = {"llama3.2-1b-w4a16", "qwen2.5-0.5b-w4a16", "qwen7b-int4", "tiny-qwen2-w8a16", "tq8"}
ENCODERS = {"t4", "t8", "t8-strict"}


@pytest.fixture(scope="module")
def page(tmp_path_factory, tiny_bert):
    """(project, {name: catalog.json row}) after ``doit catalog``."""
    p = Project(tmp_path_factory.mktemp("catalog-page") / "proj", tiny_bert)
    p.recipe("t8")
    p.recipe("t4", precision="w4a16", targets="[x-elite, 8gen2]")
    strict = TINY_RECIPE.format(precision="w8a16", targets="[x-elite]", backend="cpu-qdq")
    p.recipe("t8-strict", strict.replace("pooled_cosine_mean: 0.9", "max_abs_error: 1.0e-9"))
    for rel in LLM_DATA:
        (p.root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / rel, p.root / rel)
    for name in ["tiny-qwen2-w8a16", *FIELD]:
        shutil.copyfile(REPO / "recipes" / f"{name}.yaml", p.root / "recipes" / f"{name}.yaml")
    shutil.copytree(REPO / "recipes" / "models", p.root / "recipes" / "models")
    shutil.copytree(tiny_model("qwen2"), p.root / ".fixtures" / "tiny-qwen2")
    p.recipe("tq8", "extends: tiny-qwen2-w8a16\ndescription: the tiny Qwen2, verified on the CPU\n"
                    "verify: {backend: cpu-qdq, data: {samples: 2}, max_new_tokens: 8}\n")
    for r in ("t8", "t4", "tq8"):
        p.doit("run", f"build:{r}")
    assert p.doit("run", "build:t8-strict", check=False).code != 0  # verify judges it below its bar
    p.doit("run", "publish:t8")
    p.doit("run", "catalog")
    rows = {r["name"]: r for r in json.loads((p.root / "catalog" / "catalog.json").read_text())["recipes"]}
    assert {n: r["state"] for n, r in rows.items()} == {
        "t8": "verified", "t4": "verified", "t8-strict": "verify-failed", "tq8": "verified",
        "tiny-qwen2-w8a16": "not-built", "qwen7b-int4": "not-built", "qwen2.5-0.5b-w4a16": "not-built",
        "llama3.2-1b-w4a16": "not-built"}
    return p, rows


@pytest.fixture(scope="module")
def chromium():
    assert CHROMIUM.is_file(), f"no {CHROMIUM}: apt-get install chromium (.ci/run does); this test does not skip"
    with Chromium(width=1400, height=1000) as c:
        yield c


def _open(c: Chromium, index: Path, fragment: str = "") -> None:
    """Open the page in a fresh tab, after :func:`_judge_tab` on the tab it closes (``open``
    forgets a tab's requests and errors: checked only at the end, they covered the last tab)."""
    _judge_tab(c)
    c.open(index.as_uri() + fragment)
    c.opened = index.as_uri() + fragment
    c.wait_for("document.body.dataset.rendered")


def _judge_tab(c: Chromium) -> None:
    """The open tab (every interaction in it since :func:`_open`) loaded nothing but the page
    itself and no script raised."""
    url = getattr(c, "opened", None)
    if url is None:
        return
    assert c.requests == [url.split("#")[0]], (url, c.requests)
    assert c.errors == [], (url, c.errors)


def _shown(c: Chromium, table: str = "catalog") -> list:
    """Names (catalog) or [name, target] (device) of the table rows the page shows."""
    if table == "catalog":
        return c.evaluate("Array.from(document.querySelectorAll('#catalog tbody tr')).filter(r => !r.hidden)"
                          ".map(r => r.cells[0].textContent)")
    return c.evaluate("Array.from(document.querySelectorAll('#device tbody tr')).filter(r => !r.hidden)"
                      ".map(r => [r.dataset.name, r.dataset.target])")


def _points(c: Chromium, chart: str) -> list[dict]:
    """What the chart says it drew (``data-points``), checked against its ``data-count``."""
    el = f"document.getElementById('{chart}')"
    pts = json.loads(c.evaluate(f"{el}.dataset.points"))
    assert int(c.evaluate(f"{el}.dataset.count")) == len(pts)
    return pts


def _choose(c: Chromium, control: str, value: str) -> None:
    """Pick ``value`` in the page's <select id=control> as a user does: set it, fire "change"."""
    n = c.evaluate("document.body.dataset.rendered")
    ok = c.evaluate(f"(() => {{ const s = document.getElementById({json.dumps(control)});"
                    f" if (![...s.options].some(o => o.value === {json.dumps(value)})) return false;"
                    f" s.value = {json.dumps(value)}; s.dispatchEvent(new Event('change')); return true; }})()")
    assert ok, f"#{control} has no option {value!r}"
    c.wait_for(f"document.body.dataset.rendered !== {json.dumps(n)}", timeout=10)  # the page rendered again


def _quality(rows: dict, name: str, target: str, metric: str, series: str | None = None) -> dict:
    """The quality chart's point of ``name`` on ``target``, computed from its catalog row."""
    r = rows[name]
    dev = (r["device"] or {}).get(target)
    x = dev["bundle_bytes"] if dev else sum(r["artifacts"][target].values())
    return {"name": name, "target": target, "series": series or metric, "x": x,
            "y": r["verify"][target]["metrics"][metric]}


def _device(rows: dict, name: str, target: str = "x-elite") -> dict:
    f = rows[name]["device"][target]
    series = "read back from a build" if f["bundle_bytes_from"].startswith("read back") else "estimated before a build"
    return {"name": name, "target": target, "series": series, "x": f["memory_bytes"], "y": f["decode_tokens_per_s_ceiling"]}


def test_filters_from_the_fragment_and_the_controls(page, chromium, tmp_path):
    proj, rows = page
    c, index = chromium, proj.root / "catalog" / "index.html"

    # no filter: every recipe, and a quality point per built recipe and target
    _open(c, index)
    assert sorted(_shown(c)) == sorted(rows) and len(rows) == 8
    everything = _points(c, "quality-chart")
    assert everything == [
        _quality(rows, "t4", "8gen2", "pooled_cosine_mean"), _quality(rows, "t4", "x-elite", "pooled_cosine_mean"),
        _quality(rows, "t8", "x-elite", "pooled_cosine_mean"),
        _quality(rows, "t8-strict", "x-elite", "pooled_cosine_mean", "pooled_cosine_mean (below a verify threshold)"),
        _quality(rows, "tq8", "x-elite", "token_agreement")]
    assert everything[-1]["x"] == rows["tq8"]["device"]["x-elite"]["bundle_bytes"] > 3_000_000  # the read-back bundle
    assert len(_points(c, "device-chart")) == 5 and c.evaluate("location.hash") == ""

    # loaded with a filter in the fragment: the LLMs only
    _open(c, index, "#family=llm")
    assert c.evaluate("document.getElementById('filter-family').value") == "llm"
    assert sorted(_shown(c)) == sorted(LLMS)
    assert _points(c, "quality-chart") == [_quality(rows, "tq8", "x-elite", "token_agreement")]
    assert _points(c, "device-chart") == [_device(rows, n) for n in sorted(LLMS)]
    assert sorted(map(tuple, _shown(c, "device"))) == [(n, "x-elite") for n in sorted(LLMS)]
    assert c.evaluate("document.getElementById('shown').dataset.count") == "5"

    # a control changed through the page: precision w4a16 on top; the fragment follows
    _choose(c, "filter-precision", "w4a16")
    assert c.evaluate("location.hash") == "#family=llm&precision=w4a16"
    assert sorted(_shown(c)) == sorted(FIELD)
    assert _points(c, "quality-chart") == []  # no built LLM at w4a16: the chart says so
    assert "No built recipe passes the filters" in c.evaluate("document.getElementById('quality-chart').textContent")
    assert _points(c, "device-chart") == [_device(rows, n) for n in sorted(FIELD)]

    _choose(c, "filter-family", "")
    assert c.evaluate("location.hash") == "#precision=w4a16"
    assert sorted(_shown(c)) == sorted(FIELD + ["t4"])
    assert _points(c, "quality-chart") == [_quality(rows, "t4", "8gen2", "pooled_cosine_mean"),
                                           _quality(rows, "t4", "x-elite", "pooled_cosine_mean")]

    # a target: the rows that have it, the points and figures of that target only
    _choose(c, "filter-target", "8gen2")
    assert c.evaluate("location.hash") == "#precision=w4a16&target=8gen2"
    assert _shown(c) == ["t4"] and _shown(c, "device") == []
    assert _points(c, "quality-chart") == [_quality(rows, "t4", "8gen2", "pooled_cosine_mean")]
    assert _points(c, "device-chart") == []
    shot = c.screenshot(tmp_path / "filtered.png")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # state, size, runs-on and runtime filters, and the quality metric, each from a fragment
    _open(c, index, "#state=verify-failed")
    assert _shown(c) == ["t8-strict"]
    assert [p["series"] for p in _points(c, "quality-chart")] == ["pooled_cosine_mean (below a verify threshold)"]
    _open(c, index, "#size=100m-1b")  # Qwen2.5-0.5B: 494 M parameters, from its config
    assert _shown(c) == ["qwen2.5-0.5b-w4a16"] and rows["qwen2.5-0.5b-w4a16"]["parameters_estimate"] == 494032768
    _open(c, index, "#runs_on=npu&runtime=onnxruntime-genai")
    assert _shown(c) == ["tq8"]
    _open(c, index, "#family=encoder&quality=cosine_mean")
    assert sorted(_shown(c)) == sorted(ENCODERS)
    assert _points(c, "quality-chart") == [
        _quality(rows, "t4", "8gen2", "cosine_mean"), _quality(rows, "t4", "x-elite", "cosine_mean"),
        _quality(rows, "t8", "x-elite", "cosine_mean"),
        _quality(rows, "t8-strict", "x-elite", "cosine_mean", "cosine_mean (below a verify threshold)")]

    # the reset button: everything again, no fragment
    c.evaluate("document.getElementById('reset').click()")
    c.wait_for("location.hash === ''")
    assert sorted(_shown(c)) == sorted(rows) and _points(c, "quality-chart") == everything

    # nothing but the page itself was loaded, and no script raised: this tab (each earlier one
    # was judged as _open closed it)
    _judge_tab(c)
    shutil.copyfile(shot, Path(tempfile.gettempdir()) / "npubuild-catalog-page.png")  # for a human look


def test_unknown_fragment_values_are_named_and_ignored(page, chromium):
    proj, rows = page
    _open(chromium, proj.root / "catalog" / "index.html", "#family=nosuch&colour=red&target=x-elite")
    text = chromium.evaluate("document.getElementById('hash-note').textContent")
    assert text == "Ignored in the address: family=nosuch (no recipe has it), colour=red (no such filter)", text
    assert sorted(_shown(chromium)) == sorted(rows)  # every recipe has x-elite
    _judge_tab(chromium)


def test_columns_sort_and_links_resolve(page, chromium):
    proj, rows = page
    index = proj.root / "catalog" / "index.html"
    _open(chromium, index)
    chromium.evaluate("[...document.querySelectorAll('#catalog th')].find(th => th.textContent === 'Parameters').click()")
    order = _shown(chromium)  # counted once built, else from the config (shown as ~7.62 B)
    params = [rows[n]["parameters"] or rows[n]["parameters_estimate"] or 0 for n in order]
    assert params == sorted(params) and order[-1] == "qwen7b-int4" and params[-1] == 7615616512, (order, params)
    assert params[order.index("t8")] == rows["t8"]["parameters"] > 900_000
    assert chromium.evaluate("document.getElementById('recipe-qwen7b-int4').cells[4].textContent") == "~7.62 B"
    chromium.evaluate("[...document.querySelectorAll('#device th')].find(th => th.textContent === 'Decode ceiling')"
                      ".click()")
    assert [n for n, _ in _shown(chromium, "device")] == [
        "qwen7b-int4", "llama3.2-1b-w4a16", "qwen2.5-0.5b-w4a16", "tq8", "tiny-qwen2-w8a16"]
    # t8 is published: its card, bundle folder and archive are links that resolve to files here
    links = chromium.evaluate("[...document.querySelectorAll('#recipe-t8 a')].map(a => [a.textContent, a.href])")
    assert [t for t, _ in links] == ["card", "bundle", "archive"], links
    for _, href in links:
        assert href.startswith("file://") and Path(href.removeprefix("file://")).exists(), href
    assert links[2][1].endswith(".tar.gz")
    hub = chromium.evaluate("[...document.querySelectorAll('#recipe-qwen7b-int4 a')].map(a => a.href)")
    assert hub == ["https://huggingface.co/Qwen/Qwen2.5-7B-Instruct"]
    assert "not published: doit publish:t4" in chromium.evaluate("document.getElementById('recipe-t4').textContent")
    _judge_tab(chromium)  # the sorts and links raised nothing either


def test_same_rows_same_bytes(page):
    """The page is a function of catalog.json's rows and the published bundles: rendered here
    from the rows as written, it is the file ``doit catalog`` wrote, byte for byte, and a
    second ``doit catalog`` writes the same bytes."""
    proj, _ = page
    written = (proj.root / "catalog" / "index.html").read_bytes()
    rows = json.loads((proj.root / "catalog" / "catalog.json").read_text())["recipes"]
    from tasks.commands.catalog import page as catalog_page

    published = catalog_page.published_bundles(rows, proj.root / "dist", proj.root / "catalog")
    assert set(published) == {"t8"} and published["t8"]["current"] is True
    assert catalog_page.render_page(rows, published).encode() == written
    proj.doit("run", "catalog")
    assert (proj.root / "catalog" / "index.html").read_bytes() == written
    # uPlot is inline, with its license
    assert (catalog_page.ASSETS / "uPlot.iife.min.js").read_bytes() in written
    assert b"Copyright (c) 2022 Leon Sorokin" in written
