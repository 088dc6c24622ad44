"""The catalog page (tasks/commands/catalog/page.py) in headless Chromium, driven through the DevTools
protocol (scripts/chromium_page.py), at 1280x900 and 400x800: real models by default and the
switch that adds the other rows, the filters (fits in N GB among them) loaded from the URL
fragment and changed through the page's controls, one chart per metric family with every point
labelled, our ceilings beside the figures others measured, the layout (no sideways scrolling, no
clipped column), the sort and the details rows; the page loads nothing but itself and raises no
script error; the same rows give the same bytes.

The project: the tiny BERT built at w8a16 (``t8``, x-elite), at w4a16 for two targets (``t4``),
``t8-strict`` (t8's stages with a bar no model meets: verify-failed), ``t8-again`` (t8's recipe
under another name: an alias), the tiny trained Qwen2 from ``.fixtures/`` built with a CPU
verify (``tq8``: a fixture) and, not built, its HTP recipe, four of the field's LLM recipes
(``qwen7b-int4`` an alias of ``qwen2.5-7b-w4a16``; estimated on-device figures from
recipes/models/), a shape build and an unsupported recipe. ``t8`` is published.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import REPO, TINY_RECIPE, Project
from llm_fixtures import tiny_model

sys.path.insert(0, str(REPO / "scripts"))
from chromium_page import CHROMIUM, Chromium  # noqa: E402  (scripts/: the DevTools client)

LLM_DATA = [
    "tasks/llm/data/tiny-corpus.txt",
    "recipes/data/prompts-tiny.txt",
    "recipes/data/ppl-tiny.txt",
    "recipes/data/calib-chat.jsonl",
]
FIELD = ["qwen7b-int4", "qwen2.5-7b-w4a16", "qwen2.5-0.5b-w4a16", "llama3.2-1b-w4a16"]  # not built: estimated
OTHERS = ["qwen2.5-0.5b-shape", "gemma2-2b-w4a16"]  # a shape build, an unsupported model
LISTING = {
    "t8": "model",
    "t4": "model",
    "t8-strict": "model",
    "t8-again": "alias",
    "tq8": "fixture",
    "tiny-qwen2-w8a16": "fixture",
    "qwen7b-int4": "alias",
    "qwen2.5-7b-w4a16": "model",
    "qwen2.5-0.5b-w4a16": "model",
    "llama3.2-1b-w4a16": "model",
    "qwen2.5-0.5b-shape": "shape",
    "gemma2-2b-w4a16": "unsupported",
}
MODELS = sorted(n for n, k in LISTING.items() if k == "model")


@pytest.fixture(scope="module")
def page(tmp_path_factory, tiny_bert):
    """(project, {name: catalog.json row}) after ``doit catalog``."""
    p = Project(tmp_path_factory.mktemp("catalog-page") / "proj", tiny_bert)
    p.recipe("t8")
    p.recipe("t8-again")
    p.recipe("t4", precision="w4a16", targets="[x-elite, 8gen2]")
    strict = TINY_RECIPE.format(precision="w8a16", targets="[x-elite]", backend="cpu-qdq")
    p.recipe("t8-strict", strict.replace("pooled_cosine_mean: 0.9", "max_abs_error: 1.0e-9"))
    for rel in LLM_DATA:
        (p.root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / rel, p.root / rel)
    for name in ["tiny-qwen2-w8a16", *FIELD, *OTHERS]:
        shutil.copyfile(REPO / "recipes" / f"{name}.yaml", p.root / "recipes" / f"{name}.yaml")
    shutil.copytree(REPO / "recipes" / "models", p.root / "recipes" / "models")
    shutil.copytree(tiny_model("qwen2"), p.root / ".fixtures" / "tiny-qwen2")
    p.recipe(
        "tq8",
        "extends: tiny-qwen2-w8a16\ndescription: the tiny Qwen2, verified on the CPU\n"
        "verify: {backend: cpu-qdq, data: {samples: 2}, max_new_tokens: 8}\n",
    )
    for r in ("t8", "t4", "tq8"):
        p.doit("run", f"build:{r}")
    assert p.doit("run", "build:t8-strict", check=False).code != 0  # verify judges it below its bar
    p.doit("run", "publish:t8")
    p.doit("run", "catalog")
    rows = {r["name"]: r for r in json.loads((p.root / "catalog" / "catalog.json").read_text())["recipes"]}
    assert {n: r["listing"] for n, r in rows.items()} == LISTING
    assert {n: r["alias_of"] for n, r in rows.items() if r["alias_of"]} == {
        "t8-again": "t8",
        "qwen7b-int4": "qwen2.5-7b-w4a16",
    }
    assert {
        n: r["state"] for n, r in rows.items() if n in ("t8", "t8-again", "t8-strict", "tq8", "gemma2-2b-w4a16")
    } == {
        "t8": "verified",
        "t8-again": "verified",
        "t8-strict": "verify-failed",
        "tq8": "verified",
        "gemma2-2b-w4a16": "unsupported",
    }
    return p, rows


@pytest.fixture(scope="module")
def chromium():
    assert CHROMIUM.is_file(), f"no {CHROMIUM}: apt-get install chromium (.ci/run does); this test does not skip"
    with Chromium(width=1280, height=900) as c:
        yield c


def _open(c: Chromium, index: Path, fragment: str = "", size: tuple[int, int] = (1280, 900)) -> None:
    """Open the page in a fresh tab of ``size`` (CSS pixels), after :func:`_judge_tab` on the tab
    it closes (``open`` forgets a tab's requests and errors: checked only at the end, they
    covered the last tab)."""
    _judge_tab(c)
    c.width, c.height = size
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
    """Names (catalog, in the order shown) or [name, target] (device) of the rows the page shows."""
    if table == "catalog":
        return c.evaluate(
            "Array.from(document.querySelectorAll('#catalog tbody.recipe')).filter(b => !b.hidden)"
            ".map(b => b.dataset.name)"
        )
    return c.evaluate(
        "Array.from(document.querySelectorAll('#device tbody tr')).filter(r => !r.hidden)"
        ".map(r => [r.dataset.name, r.dataset.target])"
    )


def _points(c: Chromium, chart: str) -> list[dict]:
    """What the chart says it drew (``data-points``), checked against its ``data-count``, and
    every point named by exactly one label, the labels' boxes inside the canvas and apart."""
    el = f"document.getElementById('{chart}')"
    pts = json.loads(c.evaluate(f"{el}.dataset.points"))
    assert int(c.evaluate(f"{el}.dataset.count")) == len(pts)
    labels = json.loads(c.evaluate(f"{el}.dataset.labels"))
    named = sorted(tuple(n) for lab in labels for n in lab["names"])
    assert named == sorted((p["name"], p["target"], p["series"]) for p in pts), (named, pts)
    if pts:
        w, h = c.evaluate(f"[{el}.querySelector('canvas').clientWidth, {el}.querySelector('canvas').clientHeight]")
        for lab in labels:
            x, y, bw, bh = lab["box"]
            assert 0 <= x and x + bw <= w + 0.5 and 0 <= y and y + bh <= h + 0.5, (lab, w, h)
        for i, a in enumerate(labels):
            for b in labels[i + 1 :]:
                apart = (
                    a["box"][0] + a["box"][2] <= b["box"][0]
                    or b["box"][0] + b["box"][2] <= a["box"][0]
                    or a["box"][1] + a["box"][3] <= b["box"][1]
                    or b["box"][1] + b["box"][3] <= a["box"][1]
                )
                assert apart, (a, b)
        keyed = [lab for lab in labels if lab["text"].isdigit()]  # numbered labels are listed under the chart
        listed = c.evaluate(f"[...document.querySelectorAll('#{chart}-key li')].map(li => [li.value, li.textContent])")
        assert [int(lab["text"]) for lab in keyed] == [v for v, _ in listed] == list(range(1, len(keyed) + 1))
    return pts


def _choose(c: Chromium, control: str, value: str) -> None:
    """Pick ``value`` in the page's <select id=control> as a user does: set it, fire "change"."""
    n = c.evaluate("document.body.dataset.rendered")
    ok = c.evaluate(
        f"(() => {{ const s = document.getElementById({json.dumps(control)});"
        f" if (![...s.options].some(o => o.value === {json.dumps(value)})) return false;"
        f" s.value = {json.dumps(value)}; s.dispatchEvent(new Event('change')); return true; }})()"
    )
    assert ok, f"#{control} has no option {value!r}"
    c.wait_for(f"document.body.dataset.rendered !== {json.dumps(n)}", timeout=10)  # the page rendered again


def _tick(c: Chromium, on: bool) -> None:
    """Set the "also shape builds, fixtures, ..." switch as a user does."""
    n = c.evaluate("document.body.dataset.rendered")
    c.evaluate(
        f"(() => {{ const b = document.getElementById('all'); b.checked = {json.dumps(on)};"
        f" b.dispatchEvent(new Event('change')); }})()"
    )
    c.wait_for(f"document.body.dataset.rendered !== {json.dumps(n)}", timeout=10)


def _quality(rows: dict, name: str, target: str, metric: str, failed: bool = False) -> dict:
    """The quality chart's point of ``name`` on ``target``, computed from its catalog row."""
    r = rows[name]
    dev = (r["device"] or {}).get(target)
    x = dev["bundle_bytes"] if dev else sum(r["artifacts"][target].values())
    return {
        "name": name,
        "target": target,
        "series": metric + (" (below a verify bar)" if failed else ""),
        "x": x,
        "y": r["verify"][target]["metrics"][metric],
    }


def _device(rows: dict, name: str, target: str = "x-elite") -> list[dict]:
    """The decode chart's points of ``name`` on ``target``: our ceiling, and what others measured."""
    f = rows[name]["device"][target]
    built = f["bundle_bytes_from"].startswith("read back")
    out = [
        {
            "name": name,
            "target": target,
            "series": "our ceiling, " + ("built" if built else "estimated"),
            "x": f["memory_bytes"],
            "y": f["decode_tokens_per_s_ceiling"],
        }
    ]
    out += [
        {
            "name": name,
            "target": target,
            "series": "measured by others",
            "x": f["memory_bytes"],
            "y": m["decode_tokens_per_s"],
        }
        for m in rows[name]["measured"].get(target, [])
    ]
    return out


def _sorted(points: list[dict]) -> list[dict]:
    return sorted(points, key=lambda p: (p["name"], p["target"], p["series"]))


def test_real_models_by_default_and_the_switch(page, chromium):
    proj, rows = page
    c, index = chromium, proj.root / "catalog" / "index.html"

    # by default the real models: no fixture, shape build, unsupported recipe or alias
    _open(c, index)
    assert _shown(c) == MODELS  # sorted by name
    assert (
        c.evaluate("document.getElementById('shown').textContent") == f"Showing {len(MODELS)} of {len(MODELS)} models."
    )
    assert _points(c, "encoder-chart") == [
        _quality(rows, "t4", "8gen2", "pooled_cosine_mean"),
        _quality(rows, "t4", "x-elite", "pooled_cosine_mean"),
        _quality(rows, "t8", "x-elite", "pooled_cosine_mean"),
        _quality(rows, "t8-strict", "x-elite", "pooled_cosine_mean", failed=True),
    ]
    assert _points(c, "llm-chart") == []  # the only built LLM is a fixture: the chart says how to see it
    assert c.evaluate("document.getElementById('llm-chart').textContent") == (
        "No built LLM with token_agreement passes the filters. 1 more with “also shape builds, fixtures, …” ticked."
    )
    device = _points(c, "device-chart")
    assert device == _sorted(
        _device(rows, "llama3.2-1b-w4a16") + _device(rows, "qwen2.5-0.5b-w4a16") + _device(rows, "qwen2.5-7b-w4a16")
    )
    assert [p["y"] for p in device if p["series"] == "measured by others"] == [12.33811]  # Qwen2.5-7B on X Elite
    assert c.evaluate("location.hash") == ""

    # the switch adds every other row, and its points; the fragment keeps it
    _tick(c, True)
    assert c.evaluate("location.hash") == "#all=1"
    assert _shown(c) == sorted(rows)
    assert _points(c, "llm-chart") == [_quality(rows, "tq8", "x-elite", "token_agreement")]
    assert [p["name"] for p in _points(c, "encoder-chart")] == ["t4", "t4", "t8", "t8-again", "t8-strict"]
    assert {p["name"] for p in _points(c, "device-chart")} == {n for n, r in rows.items() if r["device"]}
    assert c.evaluate("[...document.querySelectorAll('#filter-task option')].map(o => o.textContent)") == [
        "all",
        "feature-extraction (4)",
        "text-generation (8)",
    ]  # counts of every recipe now
    _tick(c, False)
    assert c.evaluate("location.hash") == "" and _shown(c) == MODELS
    assert c.evaluate("[...document.querySelectorAll('#filter-task option')].map(o => o.textContent)") == [
        "all",
        "feature-extraction (3)",
        "text-generation (3)",
    ]
    _open(c, index, "#all=1")
    assert _shown(c) == sorted(rows) and c.evaluate("document.getElementById('all').checked") is True
    _judge_tab(c)


def test_filters_from_the_fragment_and_the_controls(page, chromium, tmp_path):
    proj, rows = page
    c, index = chromium, proj.root / "catalog" / "index.html"

    # fits in 1 GB: the built encoders (their context binaries read back) and the two small LLMs (estimated)
    _open(c, index, "#fits=1")
    assert _shown(c) == ["llama3.2-1b-w4a16", "qwen2.5-0.5b-w4a16", "t4", "t8", "t8-strict"]
    assert (
        rows["llama3.2-1b-w4a16"]["device"]["x-elite"]["memory_bytes"]
        <= 1e9
        < rows["qwen2.5-7b-w4a16"]["device"]["x-elite"]["memory_bytes"]
    )
    assert _points(c, "device-chart") == _sorted(
        _device(rows, "llama3.2-1b-w4a16") + _device(rows, "qwen2.5-0.5b-w4a16")
    )
    _choose(c, "filter-fits", "8")
    assert c.evaluate("location.hash") == "#fits=8" and "qwen2.5-7b-w4a16" in _shown(c)
    assert (
        "qwen2.5-7b-w4a16"
        not in c.evaluate(
            "[...document.getElementById('filter-fits').options].filter(o => o.value === '1').map(o => o.textContent)"
        )[0]
    )

    # task and licence; the fragment follows the controls
    _choose(c, "filter-fits", "")
    _choose(c, "filter-task", "text-generation")
    _choose(c, "filter-license", "llama3.2")
    assert c.evaluate("location.hash") == "#task=text-generation&license=llama3.2"
    assert _shown(c) == ["llama3.2-1b-w4a16"]
    assert _points(c, "encoder-chart") == []

    # a target: the rows that have it, the points and figures of that target only
    _open(c, index, "#precision=w4a16&target=8gen2")
    assert _shown(c) == ["t4"] and _shown(c, "device") == []
    assert _points(c, "encoder-chart") == [_quality(rows, "t4", "8gen2", "pooled_cosine_mean")]
    assert _points(c, "device-chart") == []

    # state, size, runs-on and runtime (as verify checked it once built, else as the recipe states it)
    _open(c, index, "#state=verify-failed")
    assert _shown(c) == ["t8-strict"]
    _open(c, index, "#size=100m-1b")  # Qwen2.5-0.5B: 494 M parameters, from its config
    assert _shown(c) == ["qwen2.5-0.5b-w4a16"] and rows["qwen2.5-0.5b-w4a16"]["parameters_estimate"] == 494032768
    _open(c, index, "#runtime=onnxruntime-genai")  # not built, yet stated by the recipes
    assert _shown(c) == ["llama3.2-1b-w4a16", "qwen2.5-0.5b-w4a16", "qwen2.5-7b-w4a16"]
    _open(c, index, "#runs_on=npu&runtime=onnxruntime-genai&all=1")
    assert _shown(c) == ["tq8"]

    # the reset button: everything again, no fragment
    c.evaluate("document.getElementById('reset').click()")
    c.wait_for("location.hash === ''")
    assert _shown(c) == MODELS
    _judge_tab(c)


def test_measured_figures_beside_our_ceilings(page, chromium):
    """Per LLM and target the ceiling, what others measured (its page and date) and the ratio."""
    proj, rows = page
    c = chromium
    _open(c, proj.root / "catalog" / "index.html")
    cells = c.evaluate(
        "Object.fromEntries([...document.querySelectorAll('#device tbody tr')].filter(r => !r.hidden)"
        ".map(r => [r.dataset.name + ' ' + r.dataset.target, [...r.cells].map(td => td.textContent)]))"
    )
    assert sorted(cells) == [
        "llama3.2-1b-w4a16 8elite",
        "llama3.2-1b-w4a16 x-elite",
        "qwen2.5-0.5b-w4a16 x-elite",
        "qwen2.5-7b-w4a16 8elite",
        "qwen2.5-7b-w4a16 x-elite",
    ]
    q = rows["qwen2.5-7b-w4a16"]
    ceiling = q["device"]["x-elite"]["decode_tokens_per_s_ceiling"]
    (m,) = q["measured"]["x-elite"]
    assert (m["decode_tokens_per_s"], m["device"], m["published"]) == (12.33811, "Snapdragon X Elite CRD", "2026-02-11")
    row = cells["qwen2.5-7b-w4a16 x-elite"]
    assert row[3] == f"{ceiling:.1f} tok/s" and row[4] == "12.3 tok/s" and row[5] == f"{12.33811 / ceiling:.2f}"
    assert row[7] == "Snapdragon X Elite CRD, qnn_context_binary (AI Hub Models v0.46.0, 2026-02-11)"
    assert "measured 175 to 5,598 ms" in row[6]
    href = c.evaluate(
        'document.querySelector(\'#device tr[data-name="qwen2.5-7b-w4a16"][data-target="x-elite"] a\').href'
    )
    assert (
        href
        == ("https://github.com/quic/ai-hub-models/blob/v0.46.0/qai_hub_models/models/qwen2_5_7b_instruct/perf.yaml")
        == m["url"]
    )
    # a measurement on a target the recipe does not build for: shown, without a ratio
    assert cells["llama3.2-1b-w4a16 8elite"][3:6] == ["not a target of llama3.2-1b-w4a16", "53.6 tok/s", ""]
    assert cells["qwen2.5-0.5b-w4a16 x-elite"][4:6] == ["", ""]
    assert (
        c.evaluate("document.getElementById('recipe-qwen2.5-7b-w4a16').rows[0].cells[7].textContent")
        == f"≤ {ceiling:.1f} tok/s (measured: 12.3)"
    )
    _judge_tab(c)


@pytest.mark.parametrize("size", [(1280, 900), (400, 800)])
def test_layout_at_a_laptop_and_a_phone_width(page, chromium, tmp_path, size):
    """No sideways scrolling of the page, no column clipped or scrolled out of a table, the
    charts within their panels; a phone gets cards (no header row), a laptop the table."""
    proj, _ = page
    c = chromium
    _open(c, proj.root / "catalog" / "index.html", "#all=1", size=size)
    c.evaluate("[...document.querySelectorAll('button.more')].slice(0, 2).forEach(b => b.click())")  # two details rows
    assert c.evaluate("document.documentElement.scrollWidth") <= size[0]
    wide = c.evaluate(
        "[...document.querySelectorAll('.scroll, .chart, .panel, #filters')]"
        ".filter(e => e.scrollWidth > e.clientWidth).map(e => e.id || e.className)"
    )
    assert wide == [], wide
    charts = c.evaluate(
        "[...document.querySelectorAll('.chart canvas')].map(cv => [cv.getBoundingClientRect().right,"
        " cv.closest('.panel').getBoundingClientRect().right])"
    )
    assert charts and all(right <= panel for right, panel in charts), charts
    cards = c.evaluate("getComputedStyle(document.querySelector('#catalog thead')).display") == "none"
    assert cards == (size[0] < 760)
    shot = c.screenshot(tmp_path / f"catalog-{size[0]}.png")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    shutil.copyfile(shot, Path(tempfile.gettempdir()) / f"npubuild-catalog-page-{size[0]}.png")  # for a human look
    _judge_tab(c)


@pytest.fixture(scope="module")
def repo_catalog(tmp_path_factory) -> tuple[Path, dict]:
    """(index.html, {name: row}) of this checkout's own recipes, nothing built (a cache of its
    own), the Hub offline: the dense view a user opens first."""
    tmp = tmp_path_factory.mktemp("repo-catalog")
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        NPUBUILD_CACHE=str(tmp / "cache"),
        NPUBUILD_BUILD=str(tmp / "build"),
        NPUBUILD_HOME=str(tmp / "home"),
        NPUBUILD_CATALOG=str(tmp / "catalog"),
        NPUBUILD_DIST=str(tmp / "dist"),
    )
    env.pop("NPUBUILD_ROOT", None)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "doit",
            "run",
            "-f",
            str(REPO / "dodo.py"),
            "-d",
            str(tmp),
            "--db-file",
            str(tmp / ".doit.db"),
            "catalog",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    rows = {r["name"]: r for r in json.loads((tmp / "catalog" / "catalog.json").read_text())["recipes"]}
    return tmp / "catalog" / "index.html", rows


@pytest.mark.parametrize("size", [(1280, 900), (400, 800)])
def test_the_repos_own_catalog_at_a_laptop_and_a_phone_width(repo_catalog, chromium, size):
    """This checkout's recipes: the field's models listed, the 7B's two names one build, the
    shape builds and fixtures behind the switch; every point of the dense decode chart labelled,
    no label on another, nothing wider than the screen, with and without the switch."""
    index, rows = repo_catalog
    assert rows["qwen7b-int4"]["alias_of"] == "qwen2.5-7b-w4a16" and rows["qwen2.5-7b-w4a16"]["listing"] == "model"
    # a sequence length only where the family's export reads one (an image or audio graph has its own dims)
    assert rows["minilm-l6-w8a16"]["sequence_length"] == 128 and rows["silero-vad-w8a16"]["sequence_length"] is None
    assert rows["ppocrv4-rec-w8a16"]["sequence_length"] is None and rows["ppocrv4-rec-w8a16"]["batch_size"] is None
    assert {r["listing"] for n, r in rows.items() if n.endswith("-shape")} == {"shape"}
    assert rows["gemma2-2b-w4a16"]["listing"] == "unsupported"
    assert [m["decode_tokens_per_s"] for m in rows["qwen2.5-7b-w4a16"]["measured"]["x-elite"]] == [12.33811]
    models = sorted(n for n, r in rows.items() if r["listing"] == "model")
    assert "qwen2.5-7b-w4a16" in models and "llama3.1-8b-w4a16" in models and len(models) >= 15
    c = chromium
    for fragment, shown in (("", models), ("#all=1", sorted(rows))):
        _open(c, index, fragment, size=size)
        assert _shown(c) == shown
        points = _points(c, "device-chart")
        assert {p["name"] for p in points} == {n for n in shown if rows[n]["device"]}
        assert c.evaluate("document.documentElement.scrollWidth") <= size[0]
        assert (
            c.evaluate(
                "[...document.querySelectorAll('.scroll, .chart, .panel, #filters')]"
                ".filter(e => e.scrollWidth > e.clientWidth).length"
            )
            == 0
        )
    _judge_tab(c)


def test_sort_details_and_links(page, chromium):
    proj, rows = page
    c = chromium
    _open(c, proj.root / "catalog" / "index.html", "#sort=memory&all=1")
    order = _shown(c)
    from tasks.commands.catalog.page import memory

    mem = [memory(rows[n], rows[n]["targets"][0])[0] or 0 for n in order]
    assert mem == sorted(mem) and order[-2:] == ["qwen2.5-7b-w4a16", "qwen7b-int4"], (order, mem)  # ties by name
    c.evaluate("[...document.querySelectorAll('#catalog th')].find(th => th.textContent === 'Size').click()")
    order = _shown(c)  # counted once built, else from the config (shown as ~7.62 B)
    params = [rows[n]["parameters"] or rows[n]["parameters_estimate"] or 0 for n in order]
    assert params == sorted(params), (order, params)
    assert c.evaluate("document.getElementById('recipe-qwen7b-int4').rows[0].cells[3].textContent") == "~7.62 B"

    # a name opens its details row: every other fact of the row
    assert c.evaluate("document.getElementById('details-t8').hidden") is True
    c.evaluate("document.querySelector('#recipe-t8 button.more').click()")
    facts = c.evaluate(
        "Object.fromEntries([...document.querySelectorAll('#details-t8 dt')]"
        ".map(dt => [dt.textContent, dt.nextElementSibling.textContent]))"
    )
    assert facts["QNN SDK"] == rows["t8"]["tools"]["qnn-sdk"] and facts["Runtimes"] == "onnxruntime-qnn"
    assert facts["Architecture"] == "bert (BertModel)"
    alias = c.evaluate("document.querySelector('#details-qwen7b-int4 dd').parentElement.textContent")
    assert "Alias ofqwen2.5-7b-w4a16 (the same stage keys" in alias

    # t8 is published: its card, bundle folder and archive are links that resolve to files here
    links = c.evaluate("[...document.querySelectorAll('#recipe-t8 tr.main a')].map(a => [a.textContent, a.href])")
    assert [t for t, _ in links] == ["card", "bundle", "archive"], links
    for _, href in links:
        assert href.startswith("file://") and Path(href.removeprefix("file://")).exists(), href
    hub = c.evaluate("[...document.querySelectorAll('#recipe-qwen7b-int4 a')].map(a => a.href)")
    assert hub == ["https://huggingface.co/Qwen/Qwen2.5-7B-Instruct"]
    assert "not published: doit publish:t4" in c.evaluate("document.getElementById('details-t4').textContent")
    _judge_tab(c)  # the sorts and links raised nothing either


def test_unknown_fragment_values_are_named_and_ignored(page, chromium):
    proj, rows = page
    _open(chromium, proj.root / "catalog" / "index.html", "#family=nosuch&colour=red&target=x-elite")
    text = chromium.evaluate("document.getElementById('hash-note').textContent")
    assert text == "Ignored in the address: family=nosuch (no recipe has it), colour=red (no such filter)", text
    assert _shown(chromium) == MODELS  # every model has x-elite
    _judge_tab(chromium)


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
