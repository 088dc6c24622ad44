"""Issue 14, bad input and integrity: each *kind* of bad recipe input (YAML 1.1 scalar traps,
out-of-range values, files that are not recipes, data files that the stages cannot read or
that lie outside the project) is a load error of that file alone, naming the file, the key
path, what was expected and what was found."""

from __future__ import annotations

import json

import pytest

from tasks.recipe.plan import expand
from tasks.recipe.load import RecipeError, load_recipe
from test_recipe import GOOD, write


def problems(f) -> dict:
    with pytest.raises(RecipeError) as err:
        load_recipe(f)
    assert str(f) in str(err.value)
    return dict(err.value.problems)


# ------------------------------------------------------------ 1. YAML 1.2 core schema


@pytest.mark.parametrize(
    "text, value",
    [
        ("0100", 100),
        ("010", 10),
        ("0o100", 64),
        ("0x80", 128),
        ("+96", 96),
    ],
)
def test_integers_read_as_yaml_1_2(tmp_path, text, value):
    """A leading zero is decimal (YAML 1.1 read 0100 as octal 64); 0o / 0x are explicit."""
    r = load_recipe(write(tmp_path, "r", GOOD + f"export: {{sequence_length: {text}}}\n"))
    assert r.export.sequence_length == value


@pytest.mark.parametrize("word", ["yes", "no", "on", "off", "Yes", "OFF"])
def test_yaml_1_1_booleans_are_text_with_a_hint(tmp_path, word):
    f = write(tmp_path, "r", GOOD.replace("calibration:", f"per_channel: {word}\n  calibration:"))
    assert problems(f) == {
        "quantize.per_channel": f"expected a valid boolean; found '{word}' "
        f"(YAML 1.2 reads {word} as text: write true or false)"
    }


@pytest.mark.parametrize("text", ["2:08", "1:00:00"])
def test_sexagesimal_is_text_with_a_hint(tmp_path, text):
    f = write(tmp_path, "r", GOOD.replace("{file: data/c.txt}", f"{{file: data/c.txt, samples: {text}}}"))
    assert problems(f)["quantize.calibration.samples"] == (
        f"expected a valid integer; found '{text}' (YAML 1.2 reads {text} as text, not a base-60 number: "
        "write the number in decimal)"
    )


def test_underscores_and_binary_are_text_with_a_hint(tmp_path):
    f = write(tmp_path, "r", GOOD + "export: {sequence_length: 1_024, opset: 0b10001}\n")
    p = problems(f)
    assert p["export.sequence_length"].startswith(
        "expected a valid integer; found '1_024' (YAML 1.2 reads 1_024 as text"
    )
    assert "write it in decimal" in p["export.opset"]


def test_yaml_1_2_floats_dates_and_keys(tmp_path):
    """1e9 is a float (YAML 1.1 read it as text); a date stays text; `on:` is the key "on"."""
    r = load_recipe(
        write(
            tmp_path, "r", GOOD + "patches: [{name: mask-range, params: {threshold: 1e4}}]\ndescription: 2024-01-31\n"
        )
    )
    assert r.patches[0].params == {"threshold": 1e4} and r.description == "2024-01-31"
    p = problems(write(tmp_path, "k", GOOD + "on: 1\n"))
    assert p == {"on": "expected no such key (unknown), found 1"}


def test_patch_float_param_takes_an_int_but_not_text(tmp_path):
    a = load_recipe(write(tmp_path, "a", GOOD + "patches: [{name: mask-range, params: {fill: -100}}]\n"))
    b = load_recipe(write(tmp_path, "b", GOOD + "patches: [{name: mask-range, params: {fill: -100.0}}]\n"))
    assert a.patches[0].params == {"fill": -100.0} and type(a.patches[0].params["fill"]) is float
    assert [s.params for s in expand(a)] == [s.params for s in expand(b)]  # one patch, one stage key
    for bad, found in [
        ("'-100'", "'-100'"),
        ("on", "'on'"),
        ("1:40", "'1:40' (YAML 1.2 reads 1:40 as text, not a base-60 number: write the number in decimal)"),
    ]:
        f = write(tmp_path, "c", GOOD + f"patches: [{{name: mask-range, params: {{fill: {bad}}}}}]\n")
        assert problems(f) == {"patches[0].params": f"expected mask-range.fill to be float, found {found}"}


@pytest.mark.parametrize(
    "flow, word",
    [
        ("allow_patterns: [*safetensors]", "*safetensors"),
        ("allow_patterns: [*.json, model.bin]", "*.json"),
        ("allow_patterns:\n    - *.safetensors", "*.safetensors"),
    ],
)
def test_unquoted_glob_explains_quoting(tmp_path, flow, word):
    f = write(
        tmp_path, "g", GOOD.replace("source: {path: models/m}", f"source:\n  hf: org/name\n  revision: main\n  {flow}")
    )
    msg = problems(f)[""]
    assert msg.startswith("invalid YAML: line ") and f'quote a glob pattern, "{word}"' in msg, msg
    ok = write(
        tmp_path,
        "q",
        GOOD.replace("source: {path: models/m}", f'source: {{hf: o/n, revision: main, allow_patterns: ["{word}"]}}'),
    )
    assert load_recipe(ok).source.allow_patterns == [word]


# ------------------------------------------------------------ 2. ranges at load


def thresholds(tmp_path, text: str, extra: str = ""):
    return write(
        tmp_path,
        "t",
        GOOD.replace("data: {file: data/v.txt}", f"data: {{file: data/v.txt}}\n  thresholds: {{{text}}}{extra}"),
    )


@pytest.mark.parametrize(
    "text, key, message",
    [
        ("cosine_mean: -5.0", "cosine_mean", "expected a cosine in (0, 1], found -5.0"),
        ("pooled_cosine_min: 1.5", "pooled_cosine_min", "expected a cosine in (0, 1], found 1.5"),
        ("logits_cosine_mean: 0", "logits_cosine_mean", "expected a cosine in (0, 1], found 0.0"),
        ("token_agreement: 1.01", "token_agreement", "expected a share of tokens in [0, 1], found 1.01"),
        ("top1_agreement: -0.1", "top1_agreement", "expected a share of tokens in [0, 1], found -0.1"),
        ("perplexity_ratio: 0.0", "perplexity_ratio", "expected a ratio of perplexities > 0, found 0.0"),
        ("max_abs_error: -1", "max_abs_error", "expected an absolute error >= 0, found -1.0"),
        (
            "prefix_match_mean: 17",
            "prefix_match_mean",
            "expected a number of tokens up to verify.max_new_tokens in [0, 16], found 17.0",
        ),
    ],
)
def test_threshold_out_of_range(tmp_path, text, key, message):
    assert problems(thresholds(tmp_path, text)) == {f"verify.thresholds.{key}": message}


def test_thresholds_in_range_ints_and_all_bad_reported_together(tmp_path):
    llm = "\nexport: {family: llm, sequence_length: 16, context_length: 64}\n"  # max_new_tokens is LLM-only
    r = load_recipe(
        thresholds(
            tmp_path, "token_agreement: 1, perplexity_ratio: 1.3, prefix_match_mean: 20", "\n  max_new_tokens: 32" + llm
        )
    )
    assert r.verify.thresholds == {"token_agreement": 1.0, "perplexity_ratio": 1.3, "prefix_match_mean": 20.0}
    p = problems(thresholds(tmp_path, "cosine_min: 2.0, top1_agreement: 3", "\n  max_new_tokens: 0" + llm))
    assert p == {
        "verify.thresholds.cosine_min": "expected a cosine in (0, 1], found 2.0",
        "verify.thresholds.top1_agreement": "expected a share of tokens in [0, 1], found 3.0",
        "verify.max_new_tokens": "expected greater than or equal to 1; found 0",
    }
    p = problems(thresholds(tmp_path, "max_abs_error: '0.1', top1_agreement: yes"))
    assert p == {
        "verify.thresholds.max_abs_error": "expected a valid number; found '0.1'",
        "verify.thresholds.top1_agreement": "expected a valid number; found 'yes'",
    }


def test_every_threshold_is_declared_once_with_a_range():
    """The bars are declared by the verify that measures them (one table per implementation):
    encoder 6, LLM 6 (each other family's test counts its own), none twice across the families,
    the recipe schema's set their union, each a direction and a range whose low end is below
    its high."""
    from tasks.contract import implementation, implementations
    from tasks.contract.schema import thresholds

    declared = [t for st in implementations("verify") for t in st.thresholds]
    assert len(declared) == len({t.name for t in declared}) == len(thresholds())
    assert len(implementation("verify", "encoder").thresholds) == len(implementation("verify", "llm").thresholds) == 6
    for t in declared:
        assert t.direction in ("min", "max") and (t.high is None or t.low < t.high), t


# ------------------------------------------------------------ 3. one bad file is its own error


def _bad_files(d, good: str):
    """One file of each kind that is not a loadable recipe, next to a good one; returns
    {stem: the message of its one problem}."""
    import os

    (d / "deep.yaml").write_text("source: " + "[" * 20_000 + "]" * 20_000 + "\n")
    (d / "dangling.yaml").symlink_to(d / "nowhere.yaml")
    os.mkfifo(d / "fifo.yaml")
    (d / "folder.yaml").mkdir()
    with open(d / "huge.yaml", "wb") as fh:
        fh.truncate(50_000_000)  # 50 MB (sparse): refused by its size, never read
    (d / "thief.yaml").write_text(good + "name: good\n")  # another file's stem
    (d / "same-1.yaml").write_text(good + "name: same\n")
    (d / "same-2.yaml").write_text(good + "name: same\n")
    (d / "good.yaml").write_text(good)
    return {
        "deep": (
            "<top>: invalid YAML: line 1, column 40: expected at most 32 levels of nested mappings and lists, "
            "found more"
        ),
        "dangling": "<top>: expected a readable file, found a dangling symlink",
        "fifo": "<top>: expected a regular file, found a FIFO",
        "folder": "<top>: expected a regular file, found a directory",
        "huge": "<top>: expected at most 1,000,000 bytes (recipes are small; the limit is tasks/recipe/load.py "
        "MAX_RECIPE_BYTES), found 50,000,000",
        "thief": "name: expected a name that is not another file's stem, found 'good', the recipe of good.yaml",
        "same-1": "name: expected a unique name, found 'same' also in same-2.yaml",
        "same-2": "name: expected a unique name, found 'same' also in same-1.yaml",
    }


def test_each_bad_file_is_its_own_load_error(tmp_path, monkeypatch):
    from tasks.recipe.checks import load_all

    monkeypatch.setenv("NPUBUILD_ROOT", str(tmp_path))
    (tmp_path / "data").mkdir()
    for n in ("c", "v"):
        (tmp_path / "data" / f"{n}.txt").write_text("a sentence\n" * 20)
    d = tmp_path / "recipes"
    d.mkdir()
    want = _bad_files(d, GOOD)
    recipes, errors = load_all(d, collect_errors=True)
    assert list(recipes) == ["good"]
    got = {stem: str(e).split("\n", 1)[1].strip() for stem, e in errors.items()}
    assert got == want
    assert all(str(e).startswith(f"{d / stem}.yaml: 1 problem(s)") for stem, e in errors.items())


def test_doit_list_lists_valid_recipes_and_exits_nonzero(project):
    tiny = project.recipe("t8").read_text()
    want = _bad_files(project.root / "recipes", tiny)
    (project.root / "recipes" / "good.yaml").unlink()
    (project.root / "recipes" / "thief.yaml").write_text(tiny + "name: t8\n")
    want["thief"] = "name: expected a name that is not another file's stem, found 't8', the recipe of t8.yaml"
    p = project.popen("list", "--all")
    out = p.communicate(timeout=300)[0]
    assert p.returncode == 1, out
    listed = {ln.split()[0] for ln in out.splitlines() if ln.startswith(("build:", "download:", "verify:"))}
    assert {"build:t8", "download:t8", "verify:t8"} <= listed
    assert {f"build:{s}" for s in want} <= listed  # the INVALID ones, whose build fails with the message
    for msg in want.values():
        assert msg in out
    assert f"npubuild: {len(want)} invalid recipe file(s), each with a failing build:<stem> task: " in out
    assert project.doit("run", "download:t8").tasks["download:t8"]["result"] == "success"
    (project.root / "recipes" / "fifo.yaml").unlink()
    for f in (project.root / "recipes").glob("*.yaml"):
        if f.stem != "t8":
            f.rmdir() if f.is_dir() else f.unlink()
    p = project.popen("list")
    assert "build" in p.communicate(timeout=300)[0] and p.returncode == 0


# ------------------------------------------------------------ 4. data files as the stages read them


@pytest.fixture
def proj(tmp_path, monkeypatch):
    """A project root with data/c.txt, data/v.txt (UTF-8, 20 lines) and recipes/."""
    root = tmp_path / "root"
    (root / "data").mkdir(parents=True)
    (root / "recipes").mkdir()
    for n in ("c", "v", "ok"):
        (root / "data" / f"{n}.txt").write_text("a sentence\n" * 20, encoding="utf-8")
    monkeypatch.setenv("NPUBUILD_ROOT", str(root))
    monkeypatch.delenv("NPUBUILD_ALLOW_PATHS", raising=False)
    return root


def load_errors(root, text: str) -> dict:
    from tasks.recipe.checks import load_all

    (root / "recipes" / "r.yaml").write_text(text)
    (root / "recipes" / "ok.yaml").write_text(
        GOOD.replace("data/c.txt", "data/ok.txt").replace("data/v.txt", "data/ok.txt")
    )
    recipes, errors = load_all(root / "recipes", collect_errors=True)
    assert list(recipes) == ["ok"]  # the other recipe is unaffected
    assert set(errors) == {"r"} and str(errors["r"]).startswith(f"{root / 'recipes' / 'r.yaml'}: ")
    return dict(errors["r"].problems)


@pytest.mark.parametrize(
    "encoding, line, offset, byte",
    [
        ("cp1252", 3, 23, "0x93"),  # \u201c in cp1252
        ("latin-1", 3, 33, "0xe9"),  # \u00e9 in latin-1 (no curly quotes there)
        ("utf-16", 1, 0, "0xff"),  # a BOM-led UTF-16 file
    ],
)
def test_non_utf8_data_file_names_file_line_offset_and_key(proj, encoding, line, offset, byte):
    quote = "\u201c" if encoding != "latin-1" else ""
    text = f"first line\nsecond line\n{quote}quoted caf\u00e9\n" + "more\n" * 20
    (proj / "data" / "c.txt").write_bytes(text.encode(encoding))
    assert load_errors(proj, GOOD) == {
        "quantize.calibration.file": (
            f"expected UTF-8 text, found byte {byte} at line {line} (byte offset {offset}) of data/c.txt"
        )
    }
    from tasks.datafiles import read_lines

    with pytest.raises(UnicodeDecodeError):  # what the quantize stage would have met mid-build
        read_lines(proj / "data" / "c.txt", 16)
    assert len(read_lines(proj / "data" / "ok.txt", 16)) == 16  # and a file that loads, it reads


def test_non_utf8_verify_and_perplexity_files(proj):
    (proj / "data" / "v.txt").write_bytes(b"ok\n" * 20 + b"\x80\n")
    (proj / "data" / "p.txt").write_bytes(b"caf\xe9")
    p = load_errors(
        proj,
        GOOD.replace("data: {file: data/v.txt}", "data: {file: data/v.txt}\n  perplexity_text: data/p.txt")
        + "export: {family: llm, sequence_length: 16, context_length: 64}\n",
    )  # perplexity: LLM-only
    assert p == {
        "verify.data.file": "expected UTF-8 text, found byte 0x80 at line 21 (byte offset 60) of data/v.txt",
        "verify.perplexity_text": "expected UTF-8 text, found byte 0xe9 at line 1 (byte offset 3) of data/p.txt",
    }


def test_paths_outside_the_project_are_refused_unless_allowed(proj, tmp_path, monkeypatch):
    outside = tmp_path / "elsewhere"
    (outside / "model").mkdir(parents=True)
    (outside / "c.txt").write_text("a sentence\n" * 20)
    (proj / "data" / "link.txt").symlink_to(outside / "c.txt")
    text = (
        GOOD.replace("{path: models/m}", "{path: ../elsewhere/model}")
        .replace("data/c.txt", str(outside / "c.txt"))
        .replace("data/v.txt", "data/link.txt")
    )
    p = load_errors(proj, text)
    want = f"expected a path inside the project {proj} (or in a folder of NPUBUILD_ALLOW_PATHS), found "
    assert p == {
        "source.path": f"{want}'../elsewhere/model', which is {outside / 'model'}",
        "quantize.calibration.file": f"{want}'{outside / 'c.txt'}', which is {outside / 'c.txt'}",
        "verify.data.file": f"{want}'data/link.txt', which is {outside / 'c.txt'}",
    }
    p = load_errors(proj, GOOD.replace("data/c.txt", "../../../../../../etc/passwd"))
    assert p == {"quantize.calibration.file": f"{want}'../../../../../../etc/passwd', which is /etc/passwd"}
    monkeypatch.setenv("NPUBUILD_ALLOW_PATHS", "relative/dir")
    assert load_errors(proj, text)["source.path"].endswith(
        "(NPUBUILD_ALLOW_PATHS entry 'relative/dir' is not an absolute path)"
    )
    from tasks.recipe.checks import load_all

    monkeypatch.setenv("NPUBUILD_ALLOW_PATHS", f"/nonexistent/x{__import__('os').pathsep}{outside}")
    (proj / "recipes" / "r.yaml").write_text(text)
    recipes, errors = load_all(proj / "recipes", collect_errors=True)
    assert not errors and recipes["r"].source.path == "../elsewhere/model"


def test_verify_json_quotes_data_lines_without_tokens(project):
    """Issue 14: data-file lines that verify.json quotes (and bundles publish) go through the
    same scrubber as messages: a Hugging Face token in a verify line is published as hf_***."""
    lines = (project.root / "data" / "verify.txt").read_text().splitlines()
    lines[0] = "login with hf_AbCdEfGhIjKlMnOpQrStUv then"
    (project.root / "data" / "verify.txt").write_text("\n".join(lines) + "\n")
    project.recipe("t8", precision="w8a16", targets="[x-elite]", backend="cpu-qdq")
    project.doit("run", "verify:t8")
    text = next((project.cache / "verify").glob("*/out/verify.json")).read_text()
    report = json.loads(text)
    assert report["samples"][0]["text"] == "login with hf_*** then"
    assert "hf_AbCdEfGh" not in text
