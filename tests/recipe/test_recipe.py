"""Recipe loading: defaults, extends, and one test per kind of bad recipe, each checking that
the error names the file and the key path, and that nothing is built."""

from __future__ import annotations

import textwrap

import pytest
from conftest import TINY_RECIPE

from tasks.recipe.plan import expand
from tasks.recipe.load import RecipeError, load_recipe
from tasks.recipe.checks import load_all

GOOD = """\
source: {path: models/m}
quantize:
  calibration: {file: data/c.txt}
verify:
  data: {file: data/v.txt}
"""


def write(tmp_path, name, text):
    p = tmp_path / f"{name}.yaml"
    p.write_text(textwrap.dedent(text))
    return p


def test_defaults_and_plan(tmp_path):
    r = load_recipe(write(tmp_path, "good-1", GOOD))
    assert r.name == "good-1"
    assert r.quantize.precision == "w8a16" and r.quantize.calibration.samples == 16
    assert r.export.sequence_length == 128 and r.compile.targets == ["x-elite"]
    specs = expand(r)
    assert [s.name for s in specs] == ["download", "export", "quantize", "compile", "verify"]
    assert specs[2].files == {"calibration": "data/c.txt"}
    assert specs[4].inputs == {"compiled": "compile", "qdq": "quantize", "reference": "export", "source": "download"}


def test_extends_deep_merges(tmp_path):
    write(tmp_path, "base", GOOD + "description: base\nexport: {sequence_length: 64, batch_size: 1}\n")
    r = load_recipe(
        write(tmp_path, "child", "extends: base\nexport: {sequence_length: 32}\nquantize: {precision: w4a16}\n")
    )
    assert r.name == "child" and r.description == "base"
    assert r.export.sequence_length == 32 and r.export.batch_size == 1
    assert r.quantize.precision == "w4a16" and r.quantize.calibration.file == "data/c.txt"


BAD = {
    "yaml-syntax": ("source: {path: [unclosed\n", "", "invalid YAML: line"),
    "duplicate-key": (GOOD + "source: {path: other}\n", "", "duplicate key 'source'"),
    "not-a-mapping": ("- just\n- a list\n", "", "expected a mapping at the top level"),
    "missing-required": (
        "source: {path: m}\nverify: {data: {file: v.txt}}\n",
        "quantize",
        "expected a value, found nothing",
    ),
    "unknown-key": (GOOD + "quantise: {precision: w8a16}\n", "quantise", "unknown"),
    "wrong-type": (GOOD + "export: {sequence_length: long}\n", "export.sequence_length", "found 'long'"),
    "bad-name": (GOOD + "name: Bad_Name\n", "name", "lowercase"),
    "target-typo": (
        GOOD + "compile: {targets: [x-elit]}\n",
        "compile.targets",
        "found unknown ['x-elit']; did you mean 'x-elite'?",
    ),
    "key-typo": (
        GOOD.replace("calibration:", "calibraton: {file: data/c.txt}\n  calibration:"),
        "quantize.calibraton",
        "expected no such key (unknown), found {file: data/c.txt}; did you mean 'calibration'?",
    ),
    "section-typo": (GOOD + "verfy: {backend: htp}\n", "verfy", "found {backend: htp}; did you mean 'verify'?"),
    "yaml-values": (GOOD + "export: {sequence_length: true}\n", "export.sequence_length", "found true"),
    "batch-size": (
        GOOD + "export: {batch_size: 2}\n",
        "export.batch_size",
        "expected 1 (quantize and verify feed one sequence per call",
    ),
    "unknown-target": (GOOD + "compile: {targets: [x-elite, snapdragon-99]}\n", "compile.targets", "8gen3"),
    "unknown-patch": (GOOD + "patches: [{name: make-it-fast}]\n", "patches[0].name", "mask-range"),
    "bad-precision": (GOOD.replace("calibration:", "precision: w3a5\n  calibration:"), "quantize.precision", "w4a16"),
    "two-sources": (GOOD.replace("{path: models/m}", "{path: m, package: p}"), "source", "exactly one of"),
    "hf-without-revision": (GOOD.replace("{path: models/m}", "{hf: org/name}"), "source", "revision"),
    "block-size-at-8-bit": (
        GOOD.replace("calibration:", "block_size: 32\n  calibration:"),
        "quantize.block_size",
        "expected null with precision w8a16 (it applies to 4-bit weights: precision w4a16; set it "
        "to null where it comes through extends), found 32",
    ),
    "block-size-per-tensor": (
        GOOD.replace("calibration:", "precision: w4a16\n  per_channel: false\n  block_size: 32\n  calibration:"),
        "quantize.block_size",
        "expected per_channel: true with block_size 32 (block-wise and GPTQ weights have scales "
        "per output channel), found per_channel: false",
    ),
    "llm-override-bits": (
        GOOD.replace("calibration:", "overrides: [{pattern: q_proj, weight_bits: 4}]\n  calibration:")
        + "export: {family: llm, sequence_length: 16, context_length: 64}\n",
        "quantize.overrides[0].weight_bits",
        "expected 8 in an LLM recipe",
    ),
    "jsonl-for-an-encoder": (
        GOOD.replace("{file: data/c.txt}", "{file: data/c.jsonl}"),
        "quantize.calibration.file",
        "expected a text file with one sample per line for an encoder, found 'data/c.jsonl'",
    ),
    "block-size-value": (
        GOOD.replace("calibration:", "precision: w4a16\n  block_size: 48\n  calibration:"),
        "quantize.block_size",
        "expected 16, 32, 64 or 128; found 48",
    ),
    "rounding-value": (
        GOOD.replace("calibration:", "precision: w4a16\n  rounding: gptq4\n  calibration:"),
        "quantize.rounding",
        "expected 'nearest' or 'gptq'; found 'gptq4'",
    ),
    "rounding-at-8-bit": (
        GOOD.replace("calibration:", "rounding: gptq\n  calibration:"),
        "quantize.rounding",
        'rounding: expected "nearest" with precision w8a16',
    ),
    "gptq-span-without-gptq": (
        GOOD.replace("calibration:", "precision: w4a16\n  gptq_span: 1024\n  calibration:"),
        "quantize.gptq_span",
        'expected null with rounding "nearest" (it applies to rounding: '
        "gptq; set it to null where it comes through extends), "
        "found 1024",
    ),
    "gptq-span-not-32": (
        GOOD.replace("calibration:", "precision: w4a16\n  rounding: gptq\n  gptq_span: 1000\n  calibration:"),
        "quantize.gptq_span",
        "expected a multiple of 32, found 1000",
    ),
    "embedding-bits": (
        GOOD.replace("calibration:", "precision: w4a16\n  embedding_bits: 4\n  calibration:"),
        "quantize.embedding_bits",
        "expected 8 or 16; found 4",
    ),
    "unknown-threshold": (
        GOOD.replace("data: {file: data/v.txt}", "data: {file: data/v.txt}\n  thresholds: {accuracy: 0.9}"),
        "verify.thresholds",
        "pooled_cosine_mean",
    ),
    "negative-samples": (
        GOOD.replace("{file: data/c.txt}", "{file: data/c.txt, samples: -3}"),
        "quantize.calibration.samples",
        "greater than or equal to 1",
    ),
    "llm-lengths": (
        GOOD + "export: {family: llm, sequence_length: 128, context_length: 64}\n",
        "export.context_length",
        "sequence_length < context_length",
    ),
    "name-with-newline": (GOOD + 'name: "abc\\n"\n', "name", "lowercase"),
    "alias": (GOOD + "patches: &p [{name: mask-range}]\ndescription: *p\n", "", "anchors and aliases"),
    "merge-key": ("base: &b {x: 1}\n" + GOOD, "", "anchors and aliases"),
    "patch-param-type": (
        GOOD + "patches: [{name: mask-range, params: {fill: abc}}]\n",
        "patches[0].params",
        "expected mask-range.fill to be float, found 'abc'",
    ),
    "patch-param-unknown": (
        GOOD + "patches: [{name: mask-range, params: {fil: -5.0}}]\n",
        "patches[0].params",
        "found unknown 'fil'",
    ),
    "bad-regex": (
        GOOD.replace("calibration:", "overrides: [{pattern: '([', weight_bits: 8}]\n  calibration:"),
        "quantize.overrides[0].pattern",
        "expected a regular expression",
    ),
    "nan-threshold": (
        GOOD.replace("data: {file: data/v.txt}", "data: {file: data/v.txt}\n  thresholds: {cosine_mean: .nan}"),
        "verify.thresholds",
        "expected finite thresholds",
    ),
    "nul-in-a-path": (
        GOOD.replace("{file: data/c.txt}", '{file: "data/c\\u0000.txt"}'),
        "quantize.calibration.file",
        "expected text without NUL characters, found 'data/c\\x00.txt'",
    ),
    "bool-for-int": (
        GOOD.replace("{file: data/c.txt}", "{file: data/c.txt, samples: true}"),
        "quantize.calibration.samples",
        "valid integer",
    ),
}


@pytest.mark.parametrize("kind", sorted(BAD))
def test_bad_recipe_names_file_and_key_path(tmp_path, kind):
    """Each kind of mistake is caught when the recipe is loaded (doit list), not mid-build."""
    text, path, words = BAD[kind]
    f = write(tmp_path, "bad", text)
    with pytest.raises(RecipeError) as err:
        load_recipe(f)
    msg = str(err.value)
    assert str(f) in msg
    if path:
        assert any(p == path for p, _ in err.value.problems), err.value.problems
    assert words in msg, msg


def test_all_problems_reported_together(tmp_path):
    f = write(tmp_path, "many", GOOD + "name: X\nexport: {opset: 3, batch_size: 0}\ncompile: {targets: [nope]}\n")
    with pytest.raises(RecipeError) as err:
        load_recipe(f)
    paths = {p for p, _ in err.value.problems}
    assert paths == {"name", "export.opset", "export.batch_size", "compile.targets"}


def test_extends_missing_parent_and_cycle(tmp_path):
    with pytest.raises(RecipeError, match=r"extends: expected an existing recipe nowhere.yaml"):
        load_recipe(write(tmp_path, "orphan", "extends: nowhere\n"))
    write(tmp_path, "tiny-base", GOOD)
    with pytest.raises(
        RecipeError,
        match=r"extends: expected an existing recipe tiny-bsae.yaml, found none; did you "
        r"mean 'tiny-base'\?",
    ):
        load_recipe(write(tmp_path, "typo", "extends: tiny-bsae\n"))
    write(tmp_path, "a", "extends: b\n")
    f = write(tmp_path, "b", "extends: a\n")
    with pytest.raises(RecipeError, match=r"expected no cycle, found b -> a -> b"):
        load_recipe(f)


def _data(root, calib_lines=20, verify_lines=20):
    (root / "data").mkdir(exist_ok=True)
    (root / "data" / "c.txt").write_text("calibration sentence\n" * calib_lines)
    (root / "data" / "v.txt").write_text("verify sentence\n" * verify_lines)


def test_duplicate_names_across_files(tmp_path, monkeypatch):
    monkeypatch.setenv("NPUBUILD_ROOT", str(tmp_path))
    _data(tmp_path)
    write(tmp_path, "one", GOOD + "name: same\n")
    write(tmp_path, "two", GOOD + "name: same\n")
    with pytest.raises(RecipeError, match=r"one.yaml.*\n.*name: expected a unique name, found 'same' also in two.yaml"):
        load_all(tmp_path)
    recipes, errors = load_all(tmp_path, collect_errors=True)  # neither file silently owns the name
    assert not recipes and dict(errors["two"].problems) == {
        "name": "expected a unique name, found 'same' also in one.yaml"
    }


def test_non_utf8_and_null_and_data_files(tmp_path, monkeypatch):
    f = tmp_path / "bin.yaml"
    f.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(RecipeError, match=r"bin.yaml.*\n.*expected UTF-8 text, found byte 0xff"):
        load_recipe(f)
    # null removes an inherited key, so the default applies
    write(tmp_path, "base", GOOD + "patches: [{name: mask-range}]\nexport: {sequence_length: 64}\n")
    r = load_recipe(write(tmp_path, "child", "extends: base\npatches: null\nexport: null\n"))
    assert r.patches == [] and r.export.sequence_length == 128
    # data files: missing, or fewer lines than samples, caught at load time with the key path
    monkeypatch.setenv("NPUBUILD_ROOT", str(tmp_path))
    _data(tmp_path, calib_lines=3)
    recipes, errors = load_all(tmp_path, collect_errors=True)
    assert set(errors) == {"base", "bin", "child"} and not recipes
    probs = dict(errors["child"].problems)
    assert probs["quantize.calibration.samples"] == "expected at most the 3 non-empty lines of data/c.txt, found 16"
    (tmp_path / "data" / "v.txt").unlink()
    assert "verify.data.file" in dict(load_all(tmp_path, collect_errors=True)[1]["child"].problems)


def test_bad_recipe_fails_its_own_build_only(project):
    project.recipe("t8")
    project.recipe("broken", "source: {path: models/tiny-bert}\nquantize: {precision: w8a16}\n")
    # a NUL in a path stopped every command with a traceback (a tester): now it is one recipe's problem
    project.recipe("nul", 'extends: t8\nquantize: {calibration: {file: "x\\u0000"}}\n')
    listed = project.popen("list", "--all").communicate(timeout=120)[0]
    assert "build:broken" in listed and "INVALID" in listed and "build:t8" in listed
    assert "build:nul" in listed and "Traceback" not in listed, listed
    assert project.doit("run", "build:t8").tasks["build:t8"]["result"] == "success"
    run = project.doit("run", "build:broken", check=False)
    assert run.code != 0
    err = run.tasks["build:broken"]["error"]
    assert "broken.yaml" in err and "quantize.calibration: expected a value" in err and "verify: expected" in err
    assert project.entries("download") and len(project.entries("verify")) == 1


LLM = """\
source: {path: models/m}
export: {family: llm, sequence_length: 16, context_length: 64}
quantize:
  calibration: {file: data/c.txt, samples: 4}
verify:
  data: {file: data/v.txt, samples: 2}
"""


@pytest.mark.parametrize(
    "key,text",
    [
        ("quantize.calibrate_method", "quantize: {calibrate_method: Percentile, calibration: {file: data/c.txt}}"),
        ("export.opset", "export: {family: llm, opset: 17}"),
        ("quantize.calibration.max_length", "quantize: {calibration: {file: data/c.txt, max_length: 32}}"),
        ("verify.data.max_length", "verify: {data: {file: data/v.txt, max_length: 32}}"),
        ("compile.disable_cpu_ep_fallback", "compile: {disable_cpu_ep_fallback: false}"),
    ],
)
def test_param_the_llm_path_never_reads_is_a_load_error(tmp_path, key, text):
    """Issue 11: a key the recipe's family does not read is an error naming the file and the
    key path, never silently ignored; the same key on an encoder recipe loads."""
    import yaml

    base = yaml.safe_load(LLM)
    over = yaml.safe_load(text)
    from tasks.recipe.load import deep_merge

    p = write(tmp_path, "l", yaml.safe_dump(deep_merge(base, over)))
    with pytest.raises(RecipeError) as err:
        load_recipe(p)
    msg = str(err.value)
    assert (
        "l.yaml" in msg
        and f"{key}: expected no such key in an LLM recipe" in msg
        and "only an encoder recipe reads it" in msg
    ), msg
    enc = deep_merge(yaml.safe_load(GOOD), {k: v for k, v in over.items() if k != "export"})
    load_recipe(write(tmp_path, "e", yaml.safe_dump(enc)))  # encoders read it


@pytest.mark.parametrize(
    "key,text",
    [
        ("export.context_length", "export: {context_length: 64}"),
        ("verify.max_new_tokens", "verify: {max_new_tokens: 4, data: {file: data/v.txt}}"),
        ("compile.weight_sharing", "compile: {weight_sharing: false}"),
    ],
)
def test_llm_only_param_on_an_encoder_is_a_load_error(tmp_path, key, text):
    import yaml

    from tasks.recipe.load import deep_merge

    p = write(tmp_path, "e", yaml.safe_dump(deep_merge(yaml.safe_load(GOOD), yaml.safe_load(text))))
    with pytest.raises(
        RecipeError, match=rf"{key}: expected no such key in an encoder recipe.*only an LLM recipe reads it"
    ):
        load_recipe(p)


def test_entropy_is_rejected_with_the_reason(tmp_path):
    """Issue 11: Entropy gave a quantized model byte-identical to MinMax (onnxruntime's entropy
    calibrator searches one candidate with its default bins), so it is refused at load."""
    p = write(
        tmp_path,
        "ent",
        GOOD.replace(
            "  calibration: {file: data/c.txt}", "  calibrate_method: Entropy\n  calibration: {file: data/c.txt}"
        ),
    )
    with pytest.raises(RecipeError, match=r"quantize.calibrate_method: expected MinMax or Percentile, found 'Entropy'"):
        load_recipe(p)


def test_llm_keys_do_not_hold_encoder_params(tmp_path):
    """Params declared for the other family are left out of a stage's params (and key)."""
    specs = {s.name: s.params for s in expand(load_recipe(write(tmp_path, "l", LLM)))}
    ex = specs["export.part0"]
    assert "opset" not in ex and "task" not in ex and ex["parts"] == 1 and ex["part"] == 0
    assert "calibrate_method" not in specs["calibrate.part0"] and specs["calibrate.part0"]["calibration"] == {
        "samples": 4
    }
    assert "calibration" not in specs["quantize.part0"]  # the LLM quantize reads the calibrate stage's feeds
    assert "disable_cpu_ep_fallback" not in specs["compile.part0"] and specs["compile.part0"]["weight_sharing"] is True
    assert specs["verify"]["data"] == {"samples": 2} and specs["verify"]["max_new_tokens"] == 16
    enc = {s.name: s.params for s in expand(load_recipe(write(tmp_path, "e", GOOD)))}
    assert "context_length" not in enc["export"] and "max_new_tokens" not in enc["verify"]
    assert enc["quantize"]["calibrate_method"] == "MinMax" and enc["verify"]["data"]["max_length"] == 128


def test_genai_runtime_is_checked_at_load(tmp_path):
    """verify.runtime: genai needs an LLM with the embedding in part 0 and C a multiple of S
    (what onnxruntime-genai can drive, tasks/llm/genai.py); the error names the key."""
    llm = GOOD + "export: {family: llm, sequence_length: 16, context_length: 64}\n"
    r = load_recipe(write(tmp_path, "ok", llm.replace("verify:\n", "verify:\n  runtime: genai\n")))
    assert r.verify.runtime == "genai" and [s for s in expand(r) if s.kind == "verify"][0].params["runtime"] == "genai"
    assert (
        "runtime" not in [s for s in expand(load_recipe(write(tmp_path, "enc", GOOD))) if s.kind == "verify"][0].params
    )
    for name, text, why in [
        (
            "enc2",
            GOOD.replace("verify:\n", "verify:\n  runtime: genai\n"),
            "no such key in an encoder recipe .export.family: encoder.: only an LLM recipe reads it",
        ),
        (
            "host",
            llm.replace("context_length: 64}", "context_length: 64, embedding: host}").replace(
                "verify:\n", "verify:\n  runtime: genai\n"
            ),
            "export.embedding: first-part for runtime genai, found export.embedding: host",
        ),  # not 'genai'
        (
            "odd",
            llm.replace("context_length: 64", "context_length: 60").replace("verify:\n", "verify:\n  runtime: genai\n"),
            "a multiple of export.sequence_length .* found export.context_length: 60",
        ),
    ]:
        with pytest.raises(RecipeError, match=rf"verify.runtime: expected .*{why}"):
            load_recipe(write(tmp_path, name, text))


def test_other_familys_threshold_is_a_load_error(tmp_path):
    """A bar the recipe's verify never measures failed only after the whole chain was built
    (found by a tester): it is a load error naming the thresholds this family measures."""
    p = write(
        tmp_path,
        "e",
        GOOD.replace("  data: {file: data/v.txt}", "  data: {file: data/v.txt}\n  thresholds: {token_agreement: 0.9}"),
    )
    with pytest.raises(
        RecipeError,
        match=r"verify.thresholds.token_agreement: expected a threshold an encoder verify "
        r"measures \(cosine_mean, .*\), found 'token_agreement', which only an LLM",
    ):
        load_recipe(p)
    p = write(
        tmp_path,
        "l",
        LLM.replace(
            "  data: {file: data/v.txt, samples: 2}",
            "  data: {file: data/v.txt, samples: 2}\n  thresholds: {pooled_cosine_mean: 0.9}",
        ),
    )
    with pytest.raises(RecipeError, match=r"verify.thresholds.pooled_cosine_mean: expected a threshold an LLM verify"):
        load_recipe(p)


def test_a_key_that_failed_is_not_judged_by_its_default_and_explain_says_why(project):
    """``per_channel: false`` in a child of a GPTQ recipe: the problems are the keys it
    conflicts with (block_size, rounding), not a ``gptq_span`` "with rounding nearest" that
    the recipe never says (rounding failed, and its check saw the default); and
    ``explain:<child>`` fails with the same reason as ``build:<child>`` (before: doit's
    'Invalid parameter' and no reason). Through the real doit CLI."""
    project.recipe(
        "t4",
        TINY_RECIPE.format(precision="w4a16", targets="[x-elite]", backend="cpu-qdq").replace(
            "  calibration:", "  block_size: 32\n  rounding: gptq\n  gptq_span: 64\n  calibration:"
        ),
    )
    project.recipe("child", "extends: t4\nquantize: {per_channel: false}\n")
    errors = {}
    for task in ("build:child", "explain:child"):
        run = project.doit("run", task, check=False)
        assert run.code != 0 and task in run.tasks, run.log()
        errors[task] = run.tasks[task]["error"]
    err = errors["build:child"]
    assert "child.yaml: 2 problem(s)" in err, err
    assert "quantize.block_size: expected per_channel: true with block_size 32" in err, err
    assert 'quantize.rounding: expected per_channel: true with rounding "gptq"' in err, err
    assert "gptq_span" not in err, err
    assert errors["explain:child"] == err


def test_each_family_has_default_bars_and_genie_brings_its_own(tmp_path):
    """A recipe that sets no bars (``verify.thresholds`` absent, or null through extends) is
    judged by its family's; ``thresholds: {}`` means none; a runtime verify runs brings its
    agreement bar whatever the recipe sets, and the recipe's own value wins (issue 50: a
    recipe with ``thresholds: null`` was listed verified; Genie had no bar by default)."""
    from tasks.encoder.family import DEFAULT_THRESHOLDS as ENCODER
    from tasks.llm.family import DEFAULT_THRESHOLDS as LLM_BARS

    assert (
        load_recipe(write(tmp_path, "e", GOOD)).verify.thresholds
        == ENCODER
        == {"pooled_cosine_mean": 0.99, "pooled_cosine_min": 0.97}
    )
    write(
        tmp_path,
        "e-own",
        GOOD.replace("  data: {file: data/v.txt}", "  data: {file: data/v.txt}\n  thresholds: {cosine_min: 0.5}"),
    )
    assert load_recipe(tmp_path / "e-own.yaml").verify.thresholds == {"cosine_min": 0.5}
    null = write(tmp_path, "e-null", "extends: e-own\nverify: {thresholds: null}\n")
    assert load_recipe(null).verify.thresholds == ENCODER
    none = write(
        tmp_path, "e-none", GOOD.replace("  data: {file: data/v.txt}", "  data: {file: data/v.txt}\n  thresholds: {}")
    )
    assert load_recipe(none).verify.thresholds == {}
    # an LLM: the quality bars (perplexity_ratio only with a perplexity text), then the runtimes'
    r = load_recipe(write(tmp_path, "l", LLM))
    assert r.verify.thresholds == {"logits_cosine_mean": 0.98, "token_agreement": 0.7}
    assert {**LLM_BARS} == {"token_agreement": 0.7, "logits_cosine_mean": 0.98, "perplexity_ratio": 1.3}
    r = load_recipe(write(tmp_path, "l-ppl", LLM.replace("samples: 2}", "samples: 2}\n  perplexity_text: data/v.txt")))
    assert r.verify.thresholds == LLM_BARS
    own = LLM.replace("samples: 2}", "samples: 2}\n  thresholds: {token_agreement: 0.5}")
    genie = own + "bundle: {runtimes: [genai, genie]}\n"
    r = load_recipe(write(tmp_path, "l-genie", genie))
    assert r.verify.thresholds == {"genie_runner_agreement": 1.0, "token_agreement": 0.5}
    both = "{token_agreement: 0.5, genie_runner_agreement: 0.5}"
    r = load_recipe(write(tmp_path, "l-genie-own", genie.replace("{token_agreement: 0.5}", both)))
    assert r.verify.thresholds == {"genie_runner_agreement": 0.5, "token_agreement": 0.5}
    # the bars reach the verify stage's params (they judge it; they stay out of its key)
    (verify,) = [s for s in expand(r) if s.kind == "verify"]
    assert verify.params["thresholds"] == {"genie_runner_agreement": 0.5, "token_agreement": 0.5}
