"""What a user receives (issue 50): the model card's snippets run as written against the
published ``dist/<recipe>/`` on the HTP simulator, the card's inputs and outputs are the shipped
graphs', its signature commands are the stock ``model_signing`` CLI's and work, a recipe without
bars is "built (no bars)" (catalog, card, manifest), ``check_bundle`` takes the archive and
every command counts a bundle's files alike, and the manifest's recipe holds only the keys its
family reads. Through the real doit CLI.

One module project: ``t8`` (the tiny BERT encoder), ``nobars`` (t8 with ``thresholds: {}``: the
same stages, no bar) and ``cardllm``, the tiny trained Qwen2 with runtimes genai and Genie on one
verify prompt, compiled without weight sharing: the x86_64 HTP simulator cannot load a
weight-shared (two-graph) binary, so this bundle ships per-graph binaries the simulator runs
(a device runs both).
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import REPO, TINY_RECIPE, Project
from llm_fixtures import tiny_model
from test_integrity import _ca_and_leaf, _ec_keypair

DATA = ["tasks/llm/data/tiny-corpus.txt", "recipes/data/prompts-tiny.txt", "recipes/data/ppl-tiny.txt"]
CARDLLM = """\
extends: tiny-qwen2-w8a16
compile: {weight_sharing: false}
bundle: {runtimes: [genai, genie]}
verify:
  data: {samples: 1}
"""
#: runs a snippet as written (compiled from its own text, in its own namespace), then saves
#: what the test compares: ``embedding`` when the snippet made one
WRAPPER = """\
import sys
ns = {"__name__": "__main__"}
exec(compile(open(sys.argv[1], encoding="utf-8").read(), "snippet", "exec"), ns)
if "embedding" in ns:
    import numpy
    numpy.save(sys.argv[2], ns["embedding"])
"""


@pytest.fixture(scope="module")
def proj(tmp_path_factory, tiny_bert) -> Project:
    p = Project(tmp_path_factory.mktemp("cards") / "proj", tiny_bert)
    for rel in DATA:
        (p.root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / rel, p.root / rel)
    shutil.copyfile(REPO / "recipes" / "tiny-qwen2-w8a16.yaml", p.root / "recipes" / "tiny-qwen2-w8a16.yaml")
    shutil.copytree(tiny_model("qwen2"), p.root / ".fixtures" / "tiny-qwen2")
    p.recipe("t8", backend="htp")
    p.recipe(
        "nobars",
        TINY_RECIPE.format(precision="w8a16", targets="[x-elite]", backend="htp").replace(
            "thresholds: {pooled_cosine_mean: 0.9}", "thresholds: {}"
        ),
    )
    p.recipe("cardllm", CARDLLM)
    p.doit("run", "build:t8", "build:nobars", "build:cardllm")
    p.published = {r: p.doit("run", f"publish:{r}").log() for r in ("t8", "nobars", "cardllm")}
    return p


def blocks(card: str) -> list[tuple[str, str]]:
    """Every fenced snippet of a card: [(language, code)]."""
    return re.findall(r"^```(\w+)\n(.*?)^```$", card, re.S | re.M)


def run_python(code: str, cwd: Path, tmp: Path) -> tuple[subprocess.CompletedProcess, Path]:
    (tmp / "snippet.py").write_text(code, encoding="utf-8")
    (tmp / "wrapper.py").write_text(WRAPPER)
    p = subprocess.run(
        [sys.executable, str(tmp / "wrapper.py"), str(tmp / "snippet.py"), str(tmp / "out.npy")],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, (code, p.stdout, p.stderr[-3000:])
    return p, tmp / "out.npy"


def test_encoder_card_snippet_runs_on_the_simulator_and_gives_the_embedding(proj, tmp_path, tiny_bert):
    import numpy as np
    import torch
    from transformers import AutoTokenizer, BertModel

    b = proj.root / "dist" / "t8"
    card = (b / "README.md").read_text()
    code = blocks(card)
    assert [lang for lang, _ in code] == ["python", "sh", "sh"], [c[0] for c in code]  # one runtime, two checks
    assert "**State: verified.**" in card and "### onnxruntime QNN EP" in card
    _, out = run_python(code[0][1], b, tmp_path)
    got = np.load(out)
    # the fp32 model, pooled as the card says: mean over attention_mask, L2-normalized
    tok = AutoTokenizer.from_pretrained(tiny_bert)
    enc = tok(["The cat sat on the mat."], padding="max_length", truncation=True, max_length=16, return_tensors="pt")
    with torch.no_grad():
        h = BertModel.from_pretrained(tiny_bert).eval()(**enc).last_hidden_state.numpy()
    m = enc["attention_mask"].numpy()[..., None]
    ref = (h * m).sum(1) / m.sum(1)
    ref /= np.linalg.norm(ref, axis=1, keepdims=True)
    assert got.shape == (1, 32) and abs(float(np.linalg.norm(got)) - 1) < 1e-5
    cos = float((got * ref).sum())
    assert cos > 0.99, cos  # w8a16 on the simulator against fp32
    # the I/O table is the shipped EPContext model's
    for row in (
        "| `input_ids` | in | int32 | [1, 16] |",
        "| `attention_mask` | in | int32 | [1, 16] |",
        "| `token_type_ids` | in | int32 | [1, 16] |",
        "| `last_hidden_state` | out | float | [1, 16, 32] |",
    ):
        assert row in card, row


def test_llm_card_snippets_genai_and_genie_give_verifys_tokens(proj, tmp_path):
    """The genai and Genie snippets, run in the bundle folder on the simulator, continue the
    card's prompt (verify's first prompt: the tiny tokenizer has no chat template) with the
    tokens verify recorded for each runtime."""
    from transformers import AutoTokenizer

    b = proj.root / "dist" / "cardllm"
    card = (b / "README.md").read_text()
    code = blocks(card)
    assert [lang for lang, _ in code] == ["python", "python", "sh", "sh"], [c[0] for c in code]
    assert "### onnxruntime-genai" in card and "### Genie" in card and "no chat template" in card
    report = json.loads((b / "verify.json").read_text())
    (sample,) = report["samples"]
    assert sample["text"] == "The old lighthouse" and 'prompt = "The old lighthouse"' in code[0][1]
    tok = AutoTokenizer.from_pretrained(b)
    # the last line printed (the QNN libraries print a line of their own to stdout on x86_64)
    genai, _ = run_python(code[0][1], b, tmp_path)
    assert genai.stdout.splitlines()[-1] == tok.decode(sample["tokens"]), (genai.stdout, sample["tokens"])
    genie, _ = run_python(code[1][1], b, tmp_path)
    status, reply = genie.stdout.splitlines()[-1].split(" ", 1)
    assert int(status) == 0 and reply == tok.decode(sample["genie_tokens"]), (genie.stdout, sample["genie_tokens"])
    # the I/O tables: genai's KV at uint8 with export.json's encodings; Genie's read from its binaries
    desc = json.loads((b / "export.json").read_text())
    kv = {t["name"]: t for t in desc["parts"][0]["prefill"]["inputs"] if t["name"].startswith("past_key_")}
    scales = ", ".join(f"{l}: {kv[f'past_key_{l}']['scale']:.6g}" for l in range(4))
    assert (
        f"| `past_key_{{l}}` (layers 0-3) | in | uint8 | [1, 2, 64, 32] | layer l's K cache, all 64 slots; genai "
        f"binds it and present_key_{{l}} to one buffer | zero point 128; scale by layer {scales} |"
    ) in card
    assert re.search(
        r"\| `past_key_\{l\}_in` \(layers 0-3\) \| in \| uint8 \| \[2, 1, 32, 48\] \| .* zero point 128; "
        rf"scale by layer {re.escape(scales[:10])}",
        card,
    )
    assert "| `logits` | out | float | [1, 16, 1024] |" in card  # genai reads float logits
    # the versions that built and ran it, and the device figures verify computed
    assert "| onnxruntime-genai | 0.18.0 |" in card and "Genie API 1.21.0" in card
    assert "Only these were tested" in card and "## On the device" in card
    assert "onnxruntime-genai reads logits as float32 or float16 only" in card  # verify.json "boundary"
    # Genie as a runtime brought its bar, which the card shows
    assert re.search(r"\| genie_runner_agreement \| 1\.000000 \| 1\.0 \|", card)


def test_the_cards_signature_commands_are_the_stock_cli_and_verify(proj, tmp_path):
    """The card's two ``model_signing`` commands, run as written in a signed bundle folder
    with the key (or CA chain) in the environment variable it names: they pass, and fail
    once a file changes."""
    priv, pub = _ec_keypair(tmp_path, "publisher")
    ca, cert, key = _ca_and_leaf(tmp_path, "publisher")
    cli = str(Path(sys.executable).with_name("model_signing"))
    for how, sign, env in (
        ("key", ["--sign", str(priv)], {"PUBLIC_KEY": str(pub)}),
        ("certificate", ["--sign", str(key), "--signing-cert", str(cert)], {"CA_CHAIN": str(ca)}),
    ):
        signer = Project.__new__(Project)
        signer.root, signer.env = proj.root, dict(proj.env, NPUBUILD_DIST=str(tmp_path / how))
        signer.doit("run", "publish:t8", *sign, *(["--cert-chain", str(ca)] if how == "certificate" else []))
        b = tmp_path / how / "t8"
        (cmd,) = [c for lang, c in blocks((b / "README.md").read_text()) if lang == "sh" and f"verify {how} " in c]
        env = dict(os.environ, PATH=f"{Path(cli).parent}{os.pathsep}{os.environ['PATH']}", **env)
        ok = subprocess.run(["bash", "-c", cmd], cwd=b, env=env, capture_output=True, text=True)
        assert ok.returncode == 0, (cmd, ok.stdout, ok.stderr)
        (b / "config.json").write_text((b / "config.json").read_text() + " ")
        bad = subprocess.run(["bash", "-c", cmd], cwd=b, env=env, capture_output=True, text=True)
        assert bad.returncode != 0 and "config.json" in bad.stdout + bad.stderr, (bad.stdout, bad.stderr)
    # a certificate without its CA chain: one line saying so (model-signing failed on the key file's name)
    run = signer.doit("run", "publish:t8", "--sign", str(key), "--signing-cert", str(cert), check=False)
    assert (
        run.code != 0
        and (
            f"{cert}: signing with a certificate needs the CA certificate(s) that issued it "
            f"(--cert-chain CA.pem), found none"
        )
        in run.log()
    ), run.log()


def test_a_recipe_without_bars_is_built_no_bars_never_verified(proj):
    proj.doit("run", "catalog")
    rows = {r["name"]: r for r in json.loads((proj.root / "catalog" / "catalog.json").read_text())["recipes"]}
    assert rows["nobars"]["state"] == "built-no-bars" and rows["t8"]["state"] == "verified"
    assert rows["cardllm"]["state"] == "verified"
    b = proj.root / "dist" / "nobars"
    card = (b / "README.md").read_text()
    assert "**State: built (no bars).**" in card and "verified" not in card.split("## Use it")[0].replace(
        "not verified", ""
    )
    assert json.loads((b / "manifest.json").read_text())["state"] == "built (no bars)"
    assert json.loads((proj.root / "dist" / "t8" / "manifest.json").read_text())["state"] == "verified"


def test_check_bundle_takes_the_archive_and_every_command_counts_alike(proj, tmp_path):
    b = proj.root / "dist" / "t8"
    (archive,) = (proj.root / "dist").glob("t8-*.tar.gz")
    n = len(json.loads((b / "manifest.json").read_text())["files"]) + 1
    assert n == len([p for p in b.rglob("*") if p.is_file()]) == 10
    assert f"({n} files)" in proj.published["t8"]
    for path in (b, archive):
        run = proj.doit("run", "check_bundle", "--path", str(path))
        assert (
            f"{path}: {n} files (manifest.json and the {n - 1} it lists), 0 mismatched, 0 missing, 0 extra" in run.log()
        ), run.log()
    # an archive whose model card changed is caught, naming the file
    bad = tmp_path / archive.name
    with tarfile.open(archive) as src, tarfile.open(bad, "w:gz") as dst:
        for m in src.getmembers():
            data = src.extractfile(m).read() if m.isfile() else None
            if m.name.endswith("/README.md"):
                data = data.replace(b"tiny BERT", b"tiny BART")
                m.size = len(data)
            dst.addfile(m, io.BytesIO(data) if data is not None else None)
    run = proj.doit("run", "check_bundle", "--path", str(bad), check=False)
    assert run.code != 0 and "MISMATCH README.md: sha256 differs" in run.log(), run.log()
    run = proj.doit("run", "check_bundle", "--path", str(tmp_path / "none.tar.gz"), check=False)
    assert run.code != 0 and "expected a bundle folder or its .tar.gz archive, found nothing" in run.log()


def test_manifest_recipe_holds_only_the_keys_its_family_reads(proj):
    enc = json.loads((proj.root / "dist" / "t8" / "manifest.json").read_text())["resolved_recipe"]
    llm = json.loads((proj.root / "dist" / "cardllm" / "manifest.json").read_text())["resolved_recipe"]
    assert "bundle" not in enc and "context_length" not in enc["export"] and "kv_bits" not in enc["quantize"]
    assert "max_new_tokens" not in enc["verify"] and enc["verify"]["data"]["max_length"] == 16
    assert enc["export"]["sequence_length"] == 16 and enc["verify"]["thresholds"] == {"pooled_cosine_mean": 0.9}
    assert "opset" not in llm["export"] and "max_length" not in llm["verify"]["data"]
    assert "disable_cpu_ep_fallback" not in llm["compile"] and llm["bundle"]["runtimes"] == ["genai", "genie"]
    assert llm["verify"]["thresholds"]["genie_runner_agreement"] == 1.0 and llm["export"]["context_length"] == 64


def test_chat_template_is_cut_around_one_user_message(tmp_path):
    """The card's prompt for a chat model: the template (here Qwen's ChatML form, put into the
    tiny tokenizer's config) rendered for one user message is the text before + the message +
    the text after, which the snippets concatenate."""
    from transformers import AutoTokenizer

    from tasks.commands.publish.snippets import chat_parts

    src = tiny_model("qwen2")
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copyfile(src / f, tmp_path / f)
    assert chat_parts(tmp_path) is None  # the fixture's tokenizer has none: plain text
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    cfg["chat_template"] = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    before, after = chat_parts(tmp_path)
    assert (before, after) == ("<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n")
    msg = [{"role": "user", "content": "Why is the sea blue?"}]
    full = AutoTokenizer.from_pretrained(tmp_path).apply_chat_template(msg, tokenize=False, add_generation_prompt=True)
    assert before + "Why is the sea blue?" + after == full
