"""kimi_k3_router against a plain numpy version of SPEC section 5."""

import numpy as np
import pytest

import mxmoe


def numpy_router(logits, bias, top_k, factor):
    s = (1.0 / (1.0 + np.exp(-logits.astype(np.float64)))).astype(np.float32)
    biased = s + bias[None, :]
    ids = np.empty((logits.shape[0], top_k), np.int32)
    for t in range(logits.shape[0]):
        # Descending score, lower id first on ties: a stable sort of the negated scores.
        ids[t] = np.argsort(-biased[t], kind="stable")[:top_k]
    picked = np.take_along_axis(s, ids.astype(np.int64), axis=1)
    weights = picked / (picked.sum(axis=1, keepdims=True) + 1e-20) * factor
    return ids, weights.astype(np.float32)


def distinct_logits(rng, t, e):
    # Logits in [-4, 4), distinct by 8/E: sigmoid scores at least ~1e-4 apart, far from saturating,
    # so no near-tie that a 1-ulp difference between exp implementations could flip.
    return np.stack([(rng.permutation(e) - e / 2) * (8.0 / e) for _ in range(t)]).astype(np.float32)


@pytest.mark.parametrize("t,e,k,factor", [(1, 896, 16, 1.0), (7, 64, 6, 2.5), (33, 16, 16, 1.0), (5, 8, 1, 1.0)])
def test_matches_numpy(t, e, k, factor):
    rng = np.random.default_rng(e + k)
    logits = distinct_logits(rng, t, e)
    # e_score_correction_bias that overrides the scores for some experts (+1 or +2), keeping the
    # ordering within each group the scores' (float32 s + 2 still resolves 1e-4 differences).
    bias = rng.choice(np.float32([0.0, 0.0, 1.0, 2.0]), size=e).astype(np.float32)
    ids, w = mxmoe.kimi_k3_router(logits, bias, top_k=k, routed_scaling_factor=factor)
    want_ids, want_w = numpy_router(logits, bias, k, factor)
    assert ids.dtype == np.int32 and w.dtype == np.float32 and ids.shape == (t, k)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_allclose(w, want_w, rtol=2e-6, atol=0)
    np.testing.assert_allclose(w.sum(axis=1), factor, rtol=1e-5)


def test_ties_lower_id_wins():
    e, k = 12, 4
    logits = np.zeros((3, e), np.float32)  # every score equal
    bias = np.zeros(e, np.float32)
    ids, w = mxmoe.kimi_k3_router(logits, bias, top_k=k)
    np.testing.assert_array_equal(ids, [[0, 1, 2, 3]] * 3)
    np.testing.assert_allclose(w, 0.25)
    # Ties among the top: experts 9, 5 and 7 share the best score, 2 and 11 the next.
    logits[:] = -1.0
    logits[:, [9, 5, 7]] = 2.0
    logits[:, [11, 2]] = 1.0
    ids, _ = mxmoe.kimi_k3_router(logits, bias, top_k=k)
    np.testing.assert_array_equal(ids, [[5, 7, 9, 2]] * 3)
    np.testing.assert_array_equal(ids, numpy_router(logits, bias, k, 1.0)[0])
    # A tie made by the bias: sigmoid(1) + b equals sigmoid(2) exactly for the b chosen below.
    s = 1.0 / (1.0 + np.exp(-np.float32([1.0, 2.0])))
    s = s.astype(np.float32)
    logits = np.full((1, e), -5.0, np.float32)
    logits[0, 8] = 2.0
    logits[0, 3] = 1.0
    bias = np.zeros(e, np.float32)
    bias[3] = np.float32(s[1] - s[0])
    if np.float32(s[0] + bias[3]) == s[1]:
        ids, _ = mxmoe.kimi_k3_router(logits, bias, top_k=2)
        np.testing.assert_array_equal(ids, [[3, 8]])


def test_bias_selects_but_does_not_weigh():
    e = 8
    logits = np.array([[3.0, 2.0, 1.0, 0.0, -1.0, -2.0, -3.0, -4.0]], np.float32)
    bias = np.zeros(e, np.float32)
    bias[7] = 10.0  # expert 7 is picked first despite the lowest logit
    ids, w = mxmoe.kimi_k3_router(logits, bias, top_k=2)
    np.testing.assert_array_equal(ids, [[7, 0]])
    s = 1.0 / (1.0 + np.exp(-np.array([-4.0, 3.0])))
    np.testing.assert_allclose(w[0], s / s.sum(), rtol=1e-6)


def test_nan_ranks_last():
    logits = np.array([[np.nan, 0.5, np.nan, 0.1]], np.float32)
    ids, w = mxmoe.kimi_k3_router(logits, np.zeros(4, np.float32), top_k=3)
    np.testing.assert_array_equal(ids, [[1, 3, 0]])
    assert np.isnan(w).all()  # a NaN score poisons the token's weights, as it would its output


def test_empty_and_errors():
    ids, w = mxmoe.kimi_k3_router(np.zeros((0, 16), np.float32), np.zeros(16, np.float32), top_k=4)
    assert ids.shape == (0, 4) and w.shape == (0, 4)
    logits = np.zeros((2, 16), np.float32)
    with pytest.raises(ValueError, match=r"^top_k = 17 is outside \[1, num_experts = 16\]"):
        mxmoe.kimi_k3_router(logits, np.zeros(16, np.float32), top_k=17)
    with pytest.raises(ValueError, match=r"^correction_bias: expected shape \[16\], got \[15\]"):
        mxmoe.kimi_k3_router(logits, np.zeros(15, np.float32))
    with pytest.raises(ValueError, match=r"^logits: expected dtype float32"):
        mxmoe.kimi_k3_router(logits.astype(np.float64), np.zeros(16, np.float32), top_k=4)
    with pytest.raises(ValueError, match=r"^top_k:"):
        mxmoe.kimi_k3_router(logits, np.zeros(16, np.float32), top_k=0)


def test_bf16_logits_equal_their_f32_values():
    # bf16 logits (numpy: their bits as uint16) widen exactly: the f32 router on the widened values.
    rng = np.random.default_rng(3)
    logits = (rng.normal(size=(9, 96)) * 3).astype(np.float32)
    bits = mxmoe.float32_to_bf16(logits)
    bias = rng.choice(np.float32([0.0, 0.25]), size=96).astype(np.float32)
    ids, w = mxmoe.kimi_k3_router(bits, bias, top_k=8, routed_scaling_factor=2.5)
    want_ids, want_w = mxmoe.kimi_k3_router(mxmoe.bf16_to_float32(bits), bias, top_k=8, routed_scaling_factor=2.5)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_array_equal(w, want_w)


def test_outputs_given_are_filled():
    logits = np.random.default_rng(4).normal(size=(5, 32)).astype(np.float32)
    bias = np.zeros(32, np.float32)
    ids = np.full((5, 4), -7, np.int32)
    w = np.full((5, 4), np.nan, np.float32)
    got_ids, got_w = mxmoe.kimi_k3_router(logits, bias, top_k=4, topk_ids=ids, topk_weights=w)
    assert got_ids is ids and got_w is w
    want_ids, want_w = mxmoe.kimi_k3_router(logits, bias, top_k=4)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_array_equal(w, want_w)
    with pytest.raises(ValueError, match=r"^topk_ids: expected shape \[5, 4\], got \[5, 3\]"):
        mxmoe.kimi_k3_router(logits, bias, top_k=4, topk_ids=np.zeros((5, 3), np.int32))
    read_only = np.zeros((5, 4), np.float32)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match=r"^topk_weights: is read-only"):
        mxmoe.kimi_k3_router(logits, bias, top_k=4, topk_weights=read_only)


def test_scores_follow_the_sigmoid_closely():
    # Every expert picked (k = E): each weight over the weight of a score-1 expert (logit 100) is
    # that expert's sigmoid score up to two divisions' rounding, which pins the scores to the exact
    # sigmoid across the range (kept above -80, where score / sum is still a normal float), and the
    # cut-offs: 1 from 20 up, 0 from -87 down.
    logits = np.concatenate([np.linspace(-80.0, 19.9, 1000), [25.0, 100.0, -87.5, -300.0]]).astype(np.float32)[None]
    e = logits.shape[1]
    ids, w = mxmoe.kimi_k3_router(logits, np.zeros(e, np.float32), top_k=e)
    exact = 1.0 / (1.0 + np.exp(-logits[0].astype(np.float64)))
    exact[logits[0] >= 20] = 1.0
    exact[logits[0] <= -87] = 0.0
    ref_slot = int(np.flatnonzero(ids[0] == 1001)[0])  # the expert with logit 100
    ratio = w[0].astype(np.float64) / np.float64(w[0, ref_slot])
    np.testing.assert_allclose(ratio, exact[ids[0]], rtol=5e-7, atol=0)
