"""A stage's process tree peak (:mod:`tasks.proc.tree`): this process's peak and its children's,
each child counted beside what this process held while it ran."""

from __future__ import annotations

import numpy as np


def test_tree_peak_counts_each_child_beside_what_the_parent_held():
    from tasks.proc import tree
    from tasks.proc.child import run_python

    meter = tree.measure()
    keep = np.ones(200 * 2**20 // 8)  # this process holds 200 MiB more while the child runs
    held = tree.rss_now()
    with meter.phase("child") as ph:
        r = run_python("import numpy as np\nassert np.ones(300 * 2**20 // 8).sum() > 0")  # 300 MiB touched
    assert r.returncode == 0 and r.peak_rss >= 300 * 2**20
    fig = meter.figures()
    assert fig["children"] == 1 and fig["children_peak"] == r.peak_rss
    # the bound: what this process held around the child plus the child's own peak
    assert held + r.peak_rss <= fig["tree_peak"] <= held + r.peak_rss + 32 * 2**20, (fig, held)
    assert ph["children_peak"] == r.peak_rss and ph["peak"] >= held + r.peak_rss
    assert fig["stage_peak"] >= held  # this process's own peak survives the phase's reset
    del keep
