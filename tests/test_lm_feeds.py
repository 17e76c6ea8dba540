"""A decoder step's token, position and mask inputs (``litegpu.lm.engine._Feeds``), filled in
place from precomputed tables, against the plain formulas: the causal mask hides every cache
column after a row's position, and padding positions continue the prompt, clamped to the cache."""
from __future__ import annotations

import numpy as np
import pytest

from litegpu.lm.engine import _MASKED, _Feeds, _Signature


def _expected(ids: list[int], position: int, length: int, rows: int, kv: int):
    tokens = np.zeros(length, np.int32)
    tokens[:len(ids)] = ids
    positions = np.minimum(np.arange(position, position + length), kv - 1)
    mask = np.where(np.arange(kv)[None, :] > np.arange(position, position + rows)[:, None], _MASKED, 0)
    return tokens, positions, mask.astype(np.float32)


@pytest.mark.parametrize("length, mask_shape", [(1, (1, 1, 1, 24)), (8, (1, 1, 8, 24)), (8, (1, 8, 24)),
                                                (8, (2, 1, 8, 24)), (4, None)])
def test_every_position_gets_the_plain_formulas_inputs(length, mask_shape):
    kv = 24
    sig = _Signature("prefill_8", length, ("kv_cache_k_0",), mask_shape is not None, mask_shape, False)
    arrays = {"tokens": np.full((1, length), -1, np.int32), "input_pos": np.full(length, -1, np.int32)}
    if mask_shape:
        arrays["mask"] = np.full(mask_shape, 7, np.float32)
    feeds = _Feeds(sig, arrays, kv)
    rng = np.random.default_rng(0)
    for position in [*range(kv), 5, 0]:      # forward, then back (a new session reuses the arrays)
        ids = list(rng.integers(1, 500, rng.integers(1, length + 1)))
        feeds.fill(ids, position)
        tokens, positions, mask = _expected(ids, position, length, mask_shape[-2] if mask_shape else 0, kv)
        assert np.array_equal(arrays["tokens"].reshape(-1), tokens)
        assert np.array_equal(arrays["input_pos"], positions)
        if mask_shape:
            assert np.array_equal(arrays["mask"], np.broadcast_to(mask, mask_shape))
