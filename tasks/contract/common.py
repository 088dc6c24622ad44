"""What several implementations of a stage kind share (encoder and LLM): the files copied
beside the graphs, the target's resolved session options in compile/verify keys, and the
judging of ``verify.json`` against a recipe's thresholds. Imports no family's code.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from collections.abc import Callable

from tasks.store import digest
from tasks.qnn import ep as qnn
from tasks.errors import apart

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "merges.txt",
    "vocab.json",
    "config.json",
    "generation_config.json",
    "tokenizer.model",
    "added_tokens.json",
)


#: what a user gets (fnmatch patterns on file names; linked into build/<recipe>/ and copied into
#: published bundles) of an export (either family): the tokenizer and config files
EXPORT_ARTIFACTS = (
    "tokenizer*",
    "vocab*",
    "merges.txt",
    "special_tokens_map.json",
    "config.json",
    "generation_config.json",
    "added_tokens.json",
)

#: ... of a compile: EPContext models, context binaries, and the LLM's runtime description
COMPILE_ARTIFACTS = ("*_ctx.onnx", "*.bin", "genai_config.json", "export.json", "*.npy")
#: ... of a verify: its report
VERIFY_ARTIFACTS = ("verify.json",)


def copy_tokenizer(src: Path, out: Path) -> list[str]:
    """Copy tokenizer and config files present in ``src`` to ``out``; returns their names."""
    names = []
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copyfile(src / name, out / name)
            names.append(name)
    return names


def copy_rest(src: Path, out: Path) -> None:
    """Copy the non-graph files of ``src`` (tokenizer, ``export.json``, ...) that the next
    stages read into ``out`` (same relative paths), leaving files already there alone."""
    for f in digest.list_files(src):
        if f.suffix not in (".onnx", ".data") and not (out / f.relative_to(src)).exists():
            (out / f.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, out / f.relative_to(src))


def target_key_extra(params: dict) -> dict:
    """The target as the session sees it, for compile and verify keys: the QNN provider options
    ``params["target"]`` resolves to in ``tasks/qnn/targets.py`` (soc_model, htp_arch, ...), so
    editing the table makes binaries stale and two names for one SoC share entries."""
    return {"provider_options": qnn.provider_options(params["target"])}


def write_report(out: Path, report: dict) -> dict:
    """Write ``out/verify.json`` (sorted keys, 2-space indent, a final newline: the same bytes
    for the same report) and return the manifest info every verify gives: backend and sample
    count."""
    (out / "verify.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return {"backend": report["backend"], "samples": len(report.get("samples", []))}


def checker(thresholds: tuple) -> Callable[[Path, dict, dict], list[str]]:
    """The ``check`` hook of a verify implementation measuring ``thresholds``
    (:class:`tasks.contract.stage.Threshold`): ``check(out, manifest, params)`` gives the
    failures of ``out/verify.json`` against ``params["thresholds"]``, one line per failed bar
    naming the metric, its value, the bar and the worst sample. Where the nodes run is reported
    (``all_on_htp``, ``cpu_nodes``), not judged here: compile refuses a CPU node unless the
    recipe allows it (``compile.disable_cpu_ep_fallback: false``), and the card and the catalog
    then say ``npu+cpu``."""
    table = {t.name: t for t in thresholds}

    def check(out: Path, manifest: dict, params: dict) -> list[str]:
        report = json.loads((out / "verify.json").read_text(encoding="utf-8"))
        fails = []
        for name, bar in sorted(params.get("thresholds", {}).items()):
            direction, per_sample = table[name].direction, table[name].per_sample
            value = report["metrics"].get(name)
            if value is None:
                fails.append(f"{name}: not measured by this verify")
                continue
            bad = not math.isfinite(value) or (value < bar if direction == "min" else value > bar)
            if bad:
                worst = ""
                samples = report.get("samples") or []
                if per_sample and samples and per_sample in samples[0]:
                    pick = min if direction == "min" else max
                    w = pick(range(len(samples)), key=lambda i: samples[i][per_sample])
                    worst = (
                        f"; worst sample #{w} ({per_sample}={samples[w][per_sample]:.5f}): "
                        f"{samples[w].get('text', '')!r}"
                    )
                shown = apart(value, float(bar), 5)[0] if math.isfinite(value) else f"{value}"
                nan = "" if math.isfinite(value) else " (not a number: the compiled model gave NaN/inf)"
                fails.append(f"{name} = {shown}{nan}, threshold {'>=' if direction == 'min' else '<='} {bar}{worst}")
        return fails

    return check
