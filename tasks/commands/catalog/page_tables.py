"""The catalog page's tables as HTML (:mod:`.page` lays out the page): the recipes table's rows
(:func:`recipe_rows`: the :data:`PICK` columns and a details row of every other fact), the
ceilings-beside-measurements table (:func:`device_table`), the sources of the measured figures
(:func:`sources_note`) and the links to published bundles (:func:`published_bundles`). Every
cell carries its sort value in ``data-sort`` and its header in ``data-label`` (what a card shows
on a narrow screen)."""

from __future__ import annotations

import html
import json
import os
from pathlib import Path
from urllib.parse import quote

from tasks.commands.catalog.measured import published_figures
from tasks.commands.catalog.formats import human_bytes, human_count, state_order

#: the recipes table's columns, narrow enough for 1280 pixels: (key, header, numeric)
PICK = (
    ("name", "Recipe", False),
    ("task", "Task", False),
    ("license", "Licence", False),
    ("parameters", "Size", True),
    ("precision", "Precision", False),
    ("context", "Context", True),
    ("memory", "Memory", True),
    ("decode", "Decode", True),
    ("state", "State", True),
    ("links", "Links", False),
)


def ratio(measured: float | None, ceiling: float | None) -> float | None:
    """measured / ceiling (decode tokens/s), None when either is unknown."""
    return measured / ceiling if measured and ceiling else None


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
        out[r["name"]] = {
            "card": _rel(folder / "README.md", catalog_dir),
            "folder": _rel(folder, catalog_dir) + "/",
            "archive": _rel(archive, catalog_dir) if archive.is_file() else None,
            "build_key": key,
            "current": current,
        }
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
        return f"https://huggingface.co/{quote(s['repo'])}", "source"
    if s.get("package"):
        return f"https://pypi.org/project/{quote(s['package'])}/", "source"
    return None


def _links(row: dict, pub: dict | None) -> tuple[str, str, str]:
    """(links cell HTML, its sort value, a note for the details row) of a row."""
    esc = html.escape
    parts, note = [], ""
    src = _source_link(row)
    if src:
        parts.append(f'<a href="{esc(src[0])}">{esc(src[1])}</a>')
    if pub:
        parts.append(f'<a href="{esc(pub["card"])}">card</a>')
        parts.append(f'<a href="{esc(pub["folder"])}">bundle</a>')
        if pub["archive"]:
            parts.append(f'<a href="{esc(pub["archive"])}">archive</a>')
        if not pub["current"]:
            note = f"published from another build ({pub['build_key']}): publish again to ship this one"
    elif row["state"] == "verified" and row.get("listing", "model") == "model":
        note = f"not published: doit publish:{row['name']}"
    sort = ("2" if pub and pub["current"] else "1" if pub else "0") + (src[1] if src else "")
    return " ".join(parts), sort, note


def _bytes(n) -> str:
    return human_bytes(n) if n is not None else "unknown"


def _rate(v) -> str:
    return f"{v:.1f} tok/s" if v is not None else "unknown"


def _td(text, sort, label: str = "", cls: str = "", title: str = "", raw: bool = False) -> str:
    esc = html.escape
    c = f' class="{esc(cls)}"' if cls else ""
    t = f' title="{esc(title)}"' if title else ""
    lab = f' data-label="{esc(label)}"' if label else ""
    return f'<td{c}{t}{lab} data-sort="{esc(str(sort))}">{text if raw else esc(str(text))}</td>'


def _per_target(row: dict, data: dict, fmt) -> tuple[str, float]:
    """(cell text, sort value) of a per-target figure: ``fmt(target, figures)`` -> (text, value)
    per target, joined with the target's name when the recipe has several."""
    vals = [(t, *fmt(t, tv)) for t, tv in sorted(data["targets"].items())]
    vals = [(t, text, v) for t, text, v in vals if text]
    if not vals:
        return "", 0
    text = vals[0][1] if len(vals) == 1 else "; ".join(f"{t}: {text}" for t, text, _ in vals)
    return text, vals[0][2] if vals[0][2] is not None else 0


def _context(row: dict) -> tuple[str, int]:
    if row["context_length"]:
        return f"{row['context_length']:,} tokens", row["context_length"]
    if row["sequence_length"]:
        return f"{row['sequence_length']} tokens in", row["sequence_length"]
    return "", 0


def _decode(t: str, tv: dict) -> tuple[str, float | None]:
    d = tv["decode"]
    if d is None:
        return "", None
    text = f"≤ {d['ceiling']:.1f} tok/s"
    if tv["measured"]:
        text += f" (measured: {tv['measured'][0]['tps']:.1f})"
    return text, d["ceiling"]


def recipe_rows(r: dict, data: dict, pub: dict | None, facts: list[tuple[str, str]]) -> str:
    """The ``<tbody>`` of one recipe (catalog row ``r``, its :func:`.page.page_data` entry
    ``data``, its published bundle ``pub`` or None): its :data:`PICK` row and its details row,
    which lists ``facts`` ([(header, text)]: every other column of the catalog) after the
    description, the alias, the reason and before the runtimes and the publishing note."""
    esc = html.escape
    name = r["name"]
    params = r["parameters"] or r.get("parameters_estimate")
    ptext = human_count(r["parameters"]) if r["parameters"] else ("~" + human_count(params) if params else "")
    why = r["reason"] or "; ".join(r["failures"])
    mem = _per_target(
        r,
        data,
        lambda t, tv: (
            (("" if tv["memory_from"] != "estimated" else "~") + _bytes(tv["memory"]), tv["memory"])
            if tv["memory"] is not None
            else ("", None)
        ),
    )
    dec = _per_target(r, data, _decode)
    ctx = _context(r)
    links, lsort, note = _links(r, pub)
    kind = "" if data["listing"] == "model" else f' <span class="tag">{esc(data["listing"])}</span>'
    button = (
        f'<button type="button" class="more" aria-expanded="false" aria-controls="details-{esc(name)}" '
        f'title="every fact of {esc(name)}">{esc(name)}</button>{kind}'
    )
    cells = [
        _td(button, name, "Recipe", raw=True),
        _td(r["task"], r["task"], "Task"),
        _td(r["license"], r["license"], "Licence"),
        _td(
            ptext,
            params or 0,
            "Size",
            title="" if r["parameters"] else "from the model's config (not counted: not built)",
        ),
        _td(r["precision"], r["precision"], "Precision"),
        _td(ctx[0], ctx[1], "Context"),
        _td(mem[0], mem[1], "Memory", title="on the device, without the runtime's own; ~ estimated before a build"),
        _td(dec[0], dec[1], "Decode", title="our ceiling (DRAM bandwidth / bytes per token), and what others measured"),
        _td(r["state"], state_order(r["state"]), "State", cls=r["state"], title=why or ""),
        _td(links, lsort, "Links", raw=True),
    ]
    shown = [("Description", r["description"])]
    if r.get("alias_of"):
        shown.append(("Alias of", f"{r['alias_of']} (the same stage keys: one build under two names)"))
    if why:
        shown.append(("Why not verified" if r["state"] != "verified" else "Note", why))
    shown += facts
    shown.append(("Runtimes", ", ".join(sorted({rt for tv in data["targets"].values() for rt in tv["runtimes"]}))))
    if note:
        shown.append(("Published", note))
    dl = "".join(f"<dt>{esc(k)}</dt><dd>{esc(str(v))}</dd>" for k, v in shown if v not in ("", None))
    return (
        f'<tbody class="recipe" data-name="{esc(name)}" id="recipe-{esc(name)}">\n'
        f'<tr class="main">{"".join(cells)}</tr>\n'
        f'<tr class="details" id="details-{esc(name)}" hidden><td colspan="{len(PICK)}"><dl>{dl}</dl></td></tr>\n'
        "</tbody>\n"
    )


def device_table(rows: list[dict], data: dict) -> str:
    """``#device``: per LLM and target (also the targets only a measurement exists for) the
    ceilings beside what others measured."""
    esc = html.escape
    heads = [
        ("Recipe", False),
        ("Target", False),
        ("Memory", True),
        ("Decode ceiling", True),
        ("Measured decode", True),
        ("Measured / ceiling", True),
        ("First token", True),
        ("Measured on", False),
    ]
    body = []
    by_name = {d["name"]: d for d in data["recipes"]}
    for r in rows:
        if not (r.get("device") or r.get("measured")):  # a family that states no device figures (encoders)
            continue
        figs = r.get("device") or {}
        for t in sorted(set(figs) | set(r.get("measured") or {})):
            f = figs.get(t) or {}
            tv = by_name[r["name"]]["targets"].get(t)
            ceiling = f.get("decode_tokens_per_s_ceiling")
            ms = (r.get("measured") or {}).get(t) or [None]
            for m in ms:
                ft = f.get("first_token_s_lower_bound")
                if not f:
                    ctext = f"not a target of {r['name']}"
                else:
                    ctext = _rate(ceiling) + (
                        "" if ceiling is not None else f" ({f.get('dram_source', 'no DRAM bandwidth found')})"
                    )
                share = ratio(m["decode_tokens_per_s"], ceiling) if m else None
                ftext = ("≥ " + (f"{ft * 1000:.1f} ms" if ft is not None else "unknown")) if f else ""
                if m:
                    lo, hi = m["first_token_ms"]
                    ftext += ("; " if ftext else "") + f"measured {lo:.0f} to {hi:,.0f} ms"
                src = (
                    f'<a href="{esc(m["url"])}">{esc(m["device"])}, {esc(m["runtime"])}</a> '
                    f'<span class="note">({esc(m["short"])}, {esc(m["published"])})</span>'
                    if m
                    else '<span class="note">no public measurement found</span>'
                )
                mem = _bytes(tv["memory"]) if tv and tv["memory"] is not None else ""
                cells = [
                    _td(r["name"], r["name"], "Recipe"),
                    _td(t, t, "Target"),
                    _td(
                        ("~" if tv and tv["memory_from"] == "estimated" else "") + mem,
                        (tv or {}).get("memory") or 0,
                        "Memory",
                    ),
                    _td(ctext, ceiling or 0, "Decode ceiling"),
                    _td(
                        _rate(m["decode_tokens_per_s"]) if m else "",
                        m["decode_tokens_per_s"] if m else 0,
                        "Measured decode",
                    ),
                    _td(f"{share:.2f}" if share is not None else "", share or 0, "Measured / ceiling", cls="ratio"),
                    _td(ftext, ft or 0, "First token"),
                    _td(src, m["device"] if m else "", "Measured on", raw=True),
                ]
                body.append(
                    f'<tr data-name="{esc(r["name"])}" data-target="{esc(t)}" '
                    f'data-listing="{esc(r.get("listing") or "model")}">{"".join(cells)}</tr>\n'
                )
    th = "".join(f'<th data-type="{"num" if num else "text"}">{esc(h)}</th>' for h, num in heads)
    return (
        f'<div class="scroll"><table id="device" class="sortable cards">\n<thead><tr>{th}</tr></thead>\n<tbody>\n'
        + "".join(body)
        + "</tbody>\n</table></div>\n"
    )


def sources_note() -> str:
    esc = html.escape
    items = []
    for s in published_figures()["sources"].values():
        items.append(
            f'<li><a href="{esc(s["url"])}">{esc(s["title"])}</a>, published {esc(s["published"])}, '
            f"read {esc(s['retrieved'])}: {esc(s['note'])}.</li>"
        )
    return '<ul class="note sources">' + "".join(items) + "</ul>\n"
