"""A recipes folder loaded and checked against the project (:func:`load_all`): each file
through :func:`tasks.recipe.load.load_recipe`, then what a recipe set and the project can tell:
unique names, the data files a recipe names (:func:`check_data_files`: inside the project or
``NPUBUILD_ALLOW_PATHS``, existing, UTF-8 as the stages read them, sample lines short enough and
numerous enough, and whatever the implementations that read a file find wrong with it: their
``file_check`` hook), ``source.path`` inside the project with every file in it, a recipe file
that is a link out of the recipes folder, and the source's ``config.json``
(:func:`check_source_config`: the family's ``source_check`` hook).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from tasks.store import plancache
from tasks.errors import InputError, RecipeError, Unsupported, UnsupportedModel
from tasks.recipe.load import Recipe, Source, family_implementations, load_recipe


#: longest sample line a calibration or verify file may hold (characters): far above any real
#: sample (the chat calibration set's longest line is ~2,000), far below what hurts (a 21.8 MB
#: line takes 3.85 GB to tokenize)
MAX_SAMPLE_CHARS = 100_000


def recipe_link_out(f: Path, directory: Path) -> str:
    """ "" unless recipe file ``f`` is a link that resolves outside the recipes folder, the
    project and ``NPUBUILD_ALLOW_PATHS``, else the message naming where it points."""
    from tasks.store.paths import allowed_dirs

    if not f.is_symlink():
        return ""
    real = f.resolve()
    roots = [Path(directory).resolve(), *allowed_dirs()]
    if any(real.is_relative_to(d) for d in roots):
        return ""
    return (
        f"expected a recipe file inside {', '.join(str(d) for d in roots)} once links are followed, "
        f"found a link to {real}"
    )


def _outside(rel: str) -> str:
    """ "" if ``rel`` (relative to the project root, or absolute) lies inside the project root
    or a folder of ``NPUBUILD_ALLOW_PATHS`` once resolved (``..`` and symlinks followed), else
    the problem's message."""
    from tasks.store.paths import allowed_dirs, root

    real = (root() / rel).resolve()
    if real.is_relative_to(root().resolve()):
        return ""
    want = f"expected a path inside the project {root()} (or in a folder of NPUBUILD_ALLOW_PATHS)"
    try:
        if any(real.is_relative_to(d) for d in allowed_dirs()):
            return ""
    except ValueError as e:
        return f"{want}, found {rel!r}, which is {real} ({e})"
    return f"{want}, found {rel!r}, which is {real}"


def read_data_text(f: Path, rel: str) -> str:
    """A data file's text, decoded as the stages decode it (UTF-8, strict). Raises ValueError
    naming the file, the line and the byte offset of the first byte that is not UTF-8, and
    OSError for a file it cannot read."""
    raw = Path(f).read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise InputError(
            f"expected UTF-8 text, found byte {raw[e.start]:#04x} at line {line} (byte offset {e.start}) of {rel}"
        ) from None


def check_data_files(path: Path, r: Recipe, memo: dict | None = None) -> None:
    """The data files a recipe names lie inside the project (see :func:`_outside`), exist, are
    UTF-8 text as the stages read them, and a line-per-sample file has at least ``samples``
    non-empty lines, and the implementations of the recipe's family that read a file find nothing
    wrong with it (their ``file_check``: a chat ``.jsonl`` calibration file's format);
    ``source.path`` lies inside the project too, and so does every file in it once links are
    followed; a shape build's ``source.tokenizer`` lies inside and holds a tokenizer's files
    (:func:`tasks.sources.shape.tokenizer_problem`). Raises RecipeError with the
    key paths. ``memo``: a dict shared by the calls of one :func:`load_all`, so a data file
    named by many recipes is resolved and read once."""
    from tasks.store.paths import root

    memo = {} if memo is None else memo

    def outside(rel: str) -> str:
        if ("outside", rel) not in memo:
            memo["outside", rel] = _outside(rel)
        return memo["outside", rel]

    def lines(f: Path, rel: str) -> int | str:
        """non-empty lines of the file, or the problem's message"""
        if ("lines", rel) not in memo:
            try:
                text = read_data_text(f, rel)
                rows = text.splitlines()
                memo["lines", rel] = sum(1 for ln in rows if ln.strip())  # as tasks/datafiles.py read_lines
                longest = max(range(len(rows)), key=lambda i: len(rows[i]), default=None)
                memo["long", rel] = (
                    ""
                    if longest is None or len(rows[longest]) <= MAX_SAMPLE_CHARS
                    else (
                        f"expected at most {MAX_SAMPLE_CHARS:,} characters per sample line, found "
                        f"{len(rows[longest]):,} on line {longest + 1} of {rel} (each sample is tokenized whole "
                        "before it is cut to its length)"
                    )
                )
            except (OSError, ValueError) as e:
                memo["lines", rel] = (
                    str(e) if isinstance(e, ValueError) else f"expected a readable file, found {e.strerror}"
                )
        return memo["lines", rel]

    problems = []
    if r.source.path is not None:
        plancache.note(root() / r.source.path)
        if bad := outside(r.source.path):
            problems.append(("source.path", bad))
        elif (root() / r.source.path).is_dir():
            from tasks.store.paths import allowed_dirs
            from tasks.sources import folder_problem

            if bad := folder_problem(root() / r.source.path, allowed_dirs(), f"source.path {r.source.path!r}"):
                problems.append(("source.path", bad))
    if r.source.tokenizer is not None:  # a shape build's tokenizer folder: inside, and a tokenizer's files
        plancache.note(root() / r.source.tokenizer)
        if bad := outside(r.source.tokenizer):
            problems.append(("source.tokenizer", bad))
        else:
            from tasks.sources.shape import TOKENIZER_FILES, tokenizer_problem

            for name in TOKENIZER_FILES:
                plancache.note(root() / r.source.tokenizer / name)
            # a folder not made yet (a fixture before scripts/tiny_llm.py) is the download's to
            # report, at build; one that exists must hold a tokenizer's files
            folder = root() / r.source.tokenizer
            if folder.is_dir() and (bad := tokenizer_problem(folder, r.source.tokenizer)):
                problems.append(("source.tokenizer", bad))
    wanted = [
        (key, data, line_samples(r.export.family, key))
        for key, data in (("quantize.calibration.file", r.quantize.calibration), ("verify.data.file", r.verify.data))
    ]
    if r.verify.perplexity_text:
        wanted.append(("verify.perplexity_text", None, False))
    for key, data, per_line in wanted:
        rel = data.file if data else r.verify.perplexity_text
        f = root() / rel
        plancache.note(f)
        if bad := outside(rel):
            problems.append((key, bad))
        elif not f.is_file():
            problems.append((key, f"expected an existing file under {root()}, found nothing at {rel!r}"))
        else:
            n = lines(f, rel)
            if isinstance(n, str):
                problems.append((key, n))
            elif key != "verify.perplexity_text" and memo.get(("long", rel)):  # see MAX_SAMPLE_CHARS
                problems.append((key, memo["long", rel]))
            elif bad := file_problem(r.export.family, key, f, rel, memo):
                problems.append((key, bad))
            elif per_line and n < data.samples:
                problems.append(
                    (
                        key.removesuffix(".file") + ".samples",
                        f"expected at most the {n} non-empty lines of {rel}, found {data.samples}",
                    )
                )
    if problems:
        raise RecipeError(path, problems)


def _readers(family: str, key: str):
    """(Stage, role) of each implementation of ``family`` that reads file key ``key`` (its ``files``)."""
    return [(st, role) for st in family_implementations(family) for param, role in st.files.items() if param.key == key]


def line_samples(family: str, key: str) -> bool:
    """Whether a stage of ``family`` reads the file of recipe key ``key`` one sample per
    non-empty line (its ``line_samples``), so the ``samples`` beside the key may not exceed them."""
    return any(role in st.line_samples for st, role in _readers(family, key))


def file_problem(family: str, key: str, f: Path, rel: str, memo: dict) -> str | None:
    """The first problem the ``file_check`` hooks of ``family``'s implementations that read
    recipe key ``key`` (their ``files``) find with file ``f`` (``rel``, as the recipe names it),
    or None; each hook asked once per file (``memo``)."""
    for st, role in _readers(family, key):
        if st.file_check is not None:
            if ("file_check", st.module, role, rel) not in memo:
                memo["file_check", st.module, role, rel] = st.file_check(role, f, rel)
            if bad := memo["file_check", st.module, role, rel]:
                return bad
    return None


def load_all(directory: Path | None = None, collect_errors: bool = False):
    """All recipes in ``directory`` (default ``recipes/``), by name, sorted.

    Every ``*.yaml`` entry is loaded on its own: whatever is wrong with one (see
    :func:`tasks.recipe.load.read_yaml`, the schema, :func:`check_data_files`, even an unforeseen exception)
    is that file's RecipeError and never stops the others. A ``name:`` may not be another
    file's stem (that file owns it), and two files declaring the same name are both invalid
    (neither silently owns it), so build task names never collide.

    Raises RecipeError for the first invalid file (by file name); with
    ``collect_errors=True`` returns ``(recipes, {file stem: RecipeError})`` instead."""
    from tasks.store.paths import recipes_dir

    directory = Path(directory or recipes_dir())
    # hidden files are an editor's or an OS's, not recipes: Emacs' `.#r.yaml` lock links, macOS' `._r.yaml`
    files = sorted(f for f in directory.glob("*.yaml") if not f.name.startswith("."))
    stems = {f.stem: f for f in files}
    errors: dict[str, RecipeError] = {}
    loaded: dict[Path, Recipe] = {}
    for f in files:
        try:
            if bad := recipe_link_out(f, directory):
                raise RecipeError(f, [("", bad)])
            r = load_recipe(f)
            if r.name != f.stem and r.name in stems:
                raise RecipeError(
                    f,
                    [
                        (
                            "name",
                            f"expected a name that is not another file's stem, found {r.name!r}, "
                            f"the recipe of {stems[r.name].name}",
                        )
                    ],
                )
            loaded[f] = r
        except RecipeError as e:
            errors[f.stem] = e
        except Exception as e:  # a bug, or an input no check foresaw: still this file's problem alone
            errors[f.stem] = RecipeError(f, [("", f"cannot load: {type(e).__name__}: {e}")])
    out: dict[str, Recipe] = {}
    memo: dict = {}
    for f, r in loaded.items():
        others = [g.name for g, o in loaded.items() if o.name == r.name and g != f]
        try:
            if others:
                raise RecipeError(
                    f, [("name", f"expected a unique name, found {r.name!r} also in {', '.join(others)}")]
                )
            check_data_files(f, r, memo)
            check_source_kind(f, r)
            check_source_config(f, r)
        except RecipeError as e:
            errors[f.stem] = e
            continue
        out[r.name] = r
    out = dict(sorted(out.items()))
    if collect_errors:
        return out, dict(sorted(errors.items()))
    if errors:
        raise errors[min(errors)]
    return out


def source_config_path(src: Source) -> Path | None:
    """The ``config.json`` a source's model will have, when it can be read without building
    anything: a ``path`` folder, an installed ``package`` folder (found, not imported), or an
    ``hf`` snapshot already in the local Hugging Face cache at a 40-hex revision. None otherwise
    (the download stage reports a missing source)."""
    import importlib.util

    from tasks.store.paths import root

    if src.path is not None:
        f = root() / src.path / "config.json"
    elif src.package is not None:
        plancache.note_sys_path()
        try:
            spec = importlib.util.find_spec(src.package)
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.submodule_search_locations:
            plancache.uncacheable(f"package {src.package} not found")  # may appear anywhere on the path
            return None
        folder = Path(list(spec.submodule_search_locations)[0])
        plancache.note(folder)
        f = folder / src.subdir / "config.json"
    elif src.revision and re.fullmatch(r"[0-9a-f]{40}", src.revision):
        from huggingface_hub import (
            constants,
        )  # where huggingface_hub itself looks (HF_HUB_CACHE, HF_HOME, XDG_CACHE_HOME)

        f = (
            Path(constants.HF_HUB_CACHE)
            / f"models--{src.hf.replace('/', '--')}"
            / "snapshots"
            / src.revision
            / "config.json"
        )
    else:
        return None
    plancache.note(f)
    return f if f.is_file() else None


def check_source_kind(path: Path, r: Recipe) -> None:
    """The recipe's source against what its family builds from (``Family.source_kind``): one
    ONNX graph (``package`` + ``file``, or a ``path`` ending in ``.onnx``) or a model folder.
    Raises RecipeError naming ``source`` and ``export.family``, the families that take the other
    kind, at load (an ONNX file given to a folder family otherwise failed at export)."""
    from tasks.contract import FAMILIES, family

    src = r.source
    given = "onnx" if src.file is not None or (src.path is not None and src.path.endswith(".onnx")) else "folder"
    want = family(r.export.family).source_kind
    if given == want:
        return
    others = [name for name in FAMILIES if family(name).source_kind == given]
    what = {"onnx": "one ONNX file", "folder": "a model folder with its config.json"}
    raise RecipeError(
        path,
        [
            (
                "source",
                f"expected {what[want]} for export.family {r.export.family}, found {what[given]}; "
                f"{what[given]} builds with export.family {' or '.join(others)}",
            )
        ],
    )


def check_source_config(path: Path, r: Recipe) -> None:
    """What the source's ``config.json`` (:func:`source_config_path`) can tell before any stage
    runs: a custom-code model (``auto_map``) is refused; the ``source_check`` hook of the
    recipe's family says what it cannot build of it (LLMs: the
    ``model_type``, activation, parts and context length; encoders: the sequence length and the
    tokenizer's inputs); ``quantize.block_size`` divides the model's in-features. Raises
    RecipeError with the key paths, :class:`UnsupportedModel` when the one problem is a model
    the family does not implement (an :class:`tasks.errors.Unsupported` problem)."""
    f = source_config_path(r.source)
    if f is None:  # not local: the facts kept in the repo (recipes/models/), when there are any
        from tasks.sources.model_facts import facts_dir, find

        plancache.note(facts_dir())
        hit = find(r.source.hf, r.source.revision) if r.source.hf else None
        if hit is None:
            return
        f, cfg = hit[0], dict(hit[1]["config"])
        plancache.note(f)
    else:
        try:
            cfg = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise RecipeError(path, [("source", f"expected a readable JSON config.json, found {f} ({e})")]) from None
    problems = []
    if not isinstance(cfg, dict):
        raise RecipeError(path, [("source", f"expected a JSON object in {f}, found {type(cfg).__name__}")])
    if cfg.get("auto_map"):
        problems.append(
            (
                "source",
                "expected a model transformers implements, found auto_map in its config.json "
                "(custom modelling code that runs only with trust_remote_code=True); npubuild "
                "refuses custom-code models: that code would run unreviewed and is not part "
                "of any stage key",
            )
        )
    from tasks.contract import family

    if (check := family(r.export.family).source_check) is not None:
        problems += check(r, cfg, Path(f))
    bs = r.quantize.block_size
    feats = {k: cfg.get(k) for k in ("hidden_size", "intermediate_size", "dim", "hidden_dim", "n_embd")}
    if isinstance(cfg.get("head_dim"), int) and isinstance(cfg.get("num_attention_heads"), int):
        feats["head_dim x num_attention_heads"] = cfg["head_dim"] * cfg["num_attention_heads"]
    for key, n in feats.items() if bs else ():
        if isinstance(n, int) and n % bs:
            problems.append(
                (
                    "quantize.block_size",
                    f"expected a block size that divides the model's in-features, "
                    f"found {bs} with {key} {n} in {f.name}",
                )
            )
    if bs and r.verify.backend == "htp" and not any(p[0] == "quantize.block_size" for p in problems):
        problems += _simulator_block_problems(feats, bs, f.name)
    if problems:  # a model not implemented, and nothing else wrong: UnsupportedModel (the catalog lists it)
        unsupported = any(isinstance(p, Unsupported) for p in problems)
        raise (UnsupportedModel if unsupported and len(problems) == 1 else RecipeError)(
            path, [tuple(p) for p in problems]
        )


def _simulator_block_problems(feats: dict, bs: int, name: str) -> list[tuple[str, str]]:
    """``quantize.block_size`` that makes an LPBQ MatMul the HTP simulator crashes on
    (:func:`tasks.qnn.weights.simulator_crashes`), for a recipe verified there (``verify.backend``
    htp): refused at load, naming the in-features, the block count and the block sizes that
    avoid it, instead of a verify that crashes after the whole build (issue 54: the 0.86 B
    shape, hidden size 1024 in blocks of 128)."""
    from tasks.qnn.weights import simulator_crashes

    sizes = [n for n in feats.values() if isinstance(n, int) and n > 0]
    bad = [(k, n) for k, n in feats.items() if isinstance(n, int) and simulator_crashes(n, bs)]
    if not bad:
        return []
    key, n = bad[0]
    # the sizes measured on the simulator (16 is accepted but not measured there)
    ok = [b for b in (32, 64, 128) if all(m % b == 0 and not simulator_crashes(m, b) for m in sizes)]
    return [
        (
            "quantize.block_size",
            f"expected a block size the HTP simulator can verify, found {bs}: {key} {n} in {name} makes "
            f"{n // bs} blocks, and onnxruntime-qnn 2.7.0's HTP simulator crashes on LPBQ MatMuls of 7 to 9 "
            f"blocks of 64 rows or more (benchmarks/lpbq_sim_crash.py); "
            + (f"use block_size {' or '.join(map(str, ok))}, or " if ok else "")
            + "verify.backend cpu-qdq",
        )
    ]
