"""The host KV cache (tasks/llm/kv_cache.py): its file keeps the written slots only and restores them exactly."""

import numpy as np


def test_kv_cache_file_holds_written_slots_only_and_restores_exactly(tmp_path):
    """KVCache.save cuts each buffer after its last written slot (a 7B part's buffers are 128
    MiB at C=4096; the calibration scratch keeps one file per prompt) and load restores every
    slot exactly, a padded window's leftover slots beyond ``n`` included."""
    from tasks.llm.kv_cache import KVCache

    rng = np.random.default_rng(0)
    c = KVCache([3, 4], 2, 512, 16)
    c.k[3][:, :, :40] = rng.standard_normal((1, 2, 40, 16))  # a 40-slot window, 37 real tokens
    c.v[3][:, :, :40] = rng.standard_normal((1, 2, 40, 16))
    c.k[4][:, 1, 7] = 1.5  # one slot of one head
    c.n = 37
    c.save(tmp_path / "c.npz")
    with np.load(tmp_path / "c.npz") as z:
        assert z["k3"].shape == (1, 2, 40, 16) and z["k4"].shape == (1, 2, 8, 16) and z["v4"].shape == (1, 2, 0, 16)
    full = 2 * 2 * 2 * 512 * 16 * 4
    assert (tmp_path / "c.npz").stat().st_size < full / 5
    d = KVCache([3, 4], 2, 512, 16)
    d.load(tmp_path / "c.npz")
    assert d.n == 37
    for l in (3, 4):
        assert d.k[l].shape == (1, 2, 512, 16) and d.k[l].dtype == np.float32
        assert np.array_equal(d.k[l], c.k[l]) and np.array_equal(d.v[l], c.v[l])
