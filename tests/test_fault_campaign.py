"""Issue 14: the fault campaign (benchmarks/fault_campaign.py) run small, so it cannot rot:
2 SIGKILLed builds, each rebuilt and checked against a clean build, and 2 concurrent builds
on one empty cache. The full campaign (20 kills, 4 concurrent builds) is run by hand."""

from __future__ import annotations

import importlib.util
import sys

from conftest import REPO


def _campaign_module():
    spec = importlib.util.spec_from_file_location("fault_campaign", REPO / "benchmarks" / "fault_campaign.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_fault_campaign_small(tmp_path, tiny_bert):
    fc = _campaign_module()
    lines = []
    counts = fc.campaign(tmp_path / "work", tiny_bert, kills=2, concurrent=2, seed=1, recipes=1, say=lines.append)
    report = "\n".join(lines) + "\n" + fc.summary(counts, 2) + "\n" + "\n".join(counts.failures)
    assert counts.failures == [], report
    assert counts.kills == 2 and counts.rebuilt_correctly == 2, report
    assert sum(counts.killed_at.values()) == 2, report
    assert counts.leftovers == 0 and counts.wrong_outputs == 0 and counts.damaged_after_kill == 0, report
    assert counts.wrong_rebuilds == 0 and counts.failed_rebuilds == 0, report
    assert counts.concurrent_ok == 2 and counts.keys == 6 and counts.keys_built_once == 6, report
    assert counts.keys_built_more_than_once == 0 and counts.keys_never_built == 0, report
    assert counts.concurrent_build_equal and counts.concurrent_leftovers == 0, report
