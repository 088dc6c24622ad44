"""Safe defaults of the doit commands, through the real CLI on the tiny BERT: a plain ``doit``
lists and builds nothing; ``doit list`` lists the recipes with their state and the commands
once each; ``build:<recipe> -n`` / ``--dry-run`` says what it would run and runs nothing;
``build:`` ends with verify's figures; a bare ``doit publish`` publishes the verified recipes
and names the others in one line, and no publish drops a signature silently; an invalid recipe
named on the line is one message (not doit's "Invalid parameter" after ours); ``explain`` says
an offline source's error once."""

from __future__ import annotations

import json
import re

import pytest
from conftest import TINY_RECIPE, Project
from console_cli import doit

T8 = TINY_RECIPE.format(precision="w8a16", targets="[x-elite]", backend="cpu-qdq")
BAD = TINY_RECIPE.format(precision="w9a16", targets="[x-elite]", backend="cpu-qdq")
HUB = T8.replace("source: {path: models/tiny-bert}", "source: {hf: npubuild-test/not-in-any-cache, revision: main}")


def _entries(p: Project) -> list[str]:
    return sorted(m.parent.relative_to(p.cache).as_posix() for m in p.cache.glob("*/*/manifest.json"))


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_bert) -> Project:
    """A project with ``t8`` built (CPU verify) and ``t9`` (t8 with one more calibration sample)
    not built."""
    p = Project(tmp_path_factory.mktemp("safe") / "proj", tiny_bert)
    p.recipe("t8", T8)
    p.recipe("t9", T8.replace("samples: 4", "samples: 5"))
    run = doit(p, "run", "build:t8")
    assert run.returncode == 0, run.stdout + run.stderr
    p.build_output = run.stdout
    return p


def test_plain_doit_lists_and_builds_nothing(project):
    project.recipe("t8", T8)
    project.recipe("other", T8.replace("w8a16", "w4a16"))
    r = doit(project)  # no command, no task: what a newcomer types first
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout.splitlines()
    assert out[0].startswith("npubuild: nothing was built (a plain `doit` lists; `doit build:<recipe>` builds one")
    assert re.search(r"^  other +not-built +encoder +w4a16$", r.stdout, re.M), r.stdout
    assert re.search(r"^  t8 +not-built +encoder +w8a16$", r.stdout, re.M), r.stdout
    assert re.search(r"^  build:<recipe> +Runs the recipe's whole chain", r.stdout, re.M), r.stdout
    assert not project.cache.exists() or _entries(project) == []  # not one stage ran
    assert "download:t8" not in r.stdout


def test_doit_list_names_the_recipes_and_each_command_once(project):
    project.recipe("t8", T8)
    project.recipe("bad", BAD)
    r = doit(project, "list")
    assert r.returncode == 1, r.stdout + r.stderr  # an invalid recipe: listed, and the exit status says so
    lines = r.stdout.splitlines()
    assert re.search(r"^  t8 +not-built +encoder +w8a16$", r.stdout, re.M)
    assert re.search(r"^  bad +invalid$", r.stdout, re.M)
    head = lines.index("Commands (doit <command>; those with :<recipe> take one):")
    commands = [ln.split()[0] for ln in lines[head + 1 :] if ln.startswith("  ") and not ln.startswith("   ")]
    assert commands[:4] == ["build:<recipe>", "cache_verify", "catalog", "check_bundle"]
    assert len(commands) == len(set(commands))
    assert "publish:<recipe>" in commands and "explain:<recipe>" in commands
    assert not any("One task per stage" in ln for ln in lines)  # was one such line per stage group
    assert "download, export, prepatch, quantize, compile, verify: one task per stage" in r.stdout
    every = doit(project, "list", "--all")  # doit's own listing, every task
    assert "download:t8" in every.stdout and "build:t8" in every.stdout


def test_dry_run_says_what_build_would_run_and_runs_nothing(built):
    before = _entries(built)
    for flag in ("-n", "--dry-run"):
        r = doit(built, "run", "build:t9", flag)
        assert r.returncode == 0, r.stdout + r.stderr
        lines = r.stdout.splitlines()
        assert lines[0] == "build:t9 --dry-run (nothing is run): 3 of 6 stages would build or pull", r.stdout
        assert lines[7:] == ["  then link its artifacts into build/t9/"], r.stdout
        stages = dict(re.findall(r"^  (\S+:t9) +\S+ +(.*)$", r.stdout, re.M))
        after = "build once quantize:t9 is built"
        assert stages == {
            "download:t9": "cache hit",
            "export:t9": "cache hit",
            "prepatch:t9": "cache hit",
            "quantize:t9": "build: no cache entry for its key",
            "compile:t9": after,
            "verify:t9": after,
        }
    assert _entries(built) == before and not (built.root / "build" / "t9").exists()  # nothing ran
    r = doit(built, "run", "build:t8", "-n")
    assert r.stdout.splitlines()[0] == "build:t8 --dry-run (nothing is run): every stage is a cache hit"
    r = doit(built, "run", "build", "--dry-run")  # every recipe, still nothing run
    assert r.returncode == 0 and "build:t8 --dry-run" in r.stdout and "build:t9 --dry-run" in r.stdout
    assert _entries(built) == before


def test_build_ends_with_verify_figures(built):
    """The last line of ``build:t8`` is verify's: the verdict, each metric with its bar, where
    the graphs run; an up-to-date build says the same."""
    (entry,) = [e for e in _entries(built) if e.startswith("verify/")]
    value = json.loads((built.cache / entry / "out" / "verify.json").read_text())["metrics"]["pooled_cosine_mean"]
    from tasks.commands.builder.verify_lines import figure

    assert figure(0.999998) == "0.999998" and figure(0.99935) == "0.99935" and figure(1.0) == "1.00000"
    want = f"verify:t8    verified: pooled_cosine_mean {figure(value)} (>= 0.9); runs on npu"
    assert built.build_output.splitlines()[-1] == want, built.build_output
    again = doit(built, "run", "build:t8")
    assert again.stdout.splitlines()[-2:] == ["-- build:t8", want], again.stdout


def test_bare_publish_publishes_the_verified_and_never_drops_a_signature(built, tmp_path):
    from test_integrity import _ec_keypair

    from tasks.commands.publish.check import check_bundle
    from tasks.commands.publish.signing import SIGNATURE

    r = doit(built, "run", "publish")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "refusing" not in r.stdout + r.stderr and ".  publish:t9" not in r.stdout
    assert r.stdout.splitlines()[-1] == "publish: 1 recipe(s) not published, not verified: t9 (not-built)"
    assert (built.root / "dist" / "t8" / "manifest.json").is_file() and not (built.root / "dist" / "t9").exists()

    priv, pub = _ec_keypair(tmp_path, "me")
    assert doit(built, "run", "publish:t8", "--sign", str(priv)).returncode == 0
    sig = built.root / "dist" / "t8" / SIGNATURE
    signed = sig.read_bytes()
    r = doit(built, "run", "publish")  # unsigned, the same bundle: the signature stays and still verifies
    assert r.returncode == 0 and f"kept its signature {sig}" in r.stdout, r.stdout + r.stderr
    assert sig.read_bytes() == signed and check_bundle(sig.parent, public_key=pub)["signature"] == []
    # another bundle (the card's description): refused in one line, the signed bundle left whole
    built.recipe("t8", T8.replace("tiny BERT for engine tests", "tiny BERT, described anew"))
    try:
        for args in (("publish:t8",), ("publish",)):
            r = doit(built, "run", *args)
            said = [ln for ln in (r.stdout + r.stderr).splitlines() if "refusing" in ln]
            assert r.returncode != 0 and len(said) == 1, r.stdout + r.stderr
            assert said[0] == (
                f"publish:t8  PublishError: refusing to replace {sig.parent}/: it is signed "
                f"({SIGNATURE}) and this build's bundle differs from the one signed; publish with "
                f"--sign KEY.pem to sign the new one, or delete {sig} to publish it unsigned"
            )
            assert sig.read_bytes() == signed and check_bundle(sig.parent, public_key=pub)["signature"] == []
    finally:
        built.recipe("t8", T8)


def test_an_invalid_recipe_named_on_the_line_is_one_message(project):
    project.recipe("t8", T8)
    project.recipe("bad", BAD)
    for task in ("build:bad", "explain:bad", "publish:bad", "reproduce:bad", "push:bad"):
        r = doit(project, "run", task)
        out = r.stdout + r.stderr
        assert r.returncode != 0 and "ERROR" not in out and "Invalid parameter" not in out, (task, out)
        assert out.count("quantize.precision: expected 'w8a16', 'w4a16' or 'w8a8'; found 'w9a16'") == 1, (task, out)
        assert out.startswith(f"{task}  {project.root / 'recipes' / 'bad.yaml'}: 1 problem(s)"), (task, out)


def test_explain_says_an_offline_source_error_once(project):
    project.recipe("hub", HUB)
    r = doit(project, "run", "explain:hub")
    assert r.stdout.count("SourceError: cannot get Hub model 'npubuild-test/not-in-any-cache' at revision 'main'") == 1
    assert r.stdout.count("its key waits for download:hub's (above)") == 5, r.stdout
