"""rlflow.returns against slow references (plain Python, per lane, per episode) and hand-computed tables."""

from __future__ import annotations

import statistics

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlflow import returns as R

# ---------------------------------------------------------------------------------------------------------
# Slow references: one lane at a time, lists of Python floats, episodes found by scanning the flags.
# ---------------------------------------------------------------------------------------------------------


def episode_end(term: list[bool], trunc: list[bool], t: int) -> int:
    """The last step of the episode that contains step t (the first flagged step >= t, or T - 1)."""
    while t < len(term) - 1 and not (term[t] or trunc[t]):
        t += 1
    return t


def ref_returns(r, term, trunc, g, nv) -> list[float]:
    out = []
    for t in range(len(r)):
        end = episode_end(term, trunc, t)
        total = sum(g ** (j - t) * r[j] for j in range(t, end + 1))
        if not term[end]:
            total += g ** (end - t + 1) * (nv[end] if nv is not None else 0.0)
        out.append(total)
    return out


def ref_nstep(r, term, trunc, g, nv, n) -> tuple[list[float], list[float], list[int], list[float]]:
    rets, discs, ks, targets = [], [], [], []
    for t in range(len(r)):
        ret, k = 0.0, 0
        for j in range(n):
            if t + j >= len(r):
                break
            ret += g**j * r[t + j]
            k += 1
            if term[t + j] or trunc[t + j]:
                break
        last = t + k - 1
        disc = 0.0 if term[last] else g**k
        rets.append(ret)
        discs.append(disc)
        ks.append(k)
        targets.append(ret + (disc * nv[last] if disc else 0.0))
    return rets, discs, ks, targets


def ref_gae(r, v, nv, term, trunc, g, lam) -> tuple[list[float], list[float]]:
    delta = [r[t] + (0.0 if term[t] else g * nv[t]) - v[t] for t in range(len(r))]
    adv = []
    for t in range(len(r)):
        end = episode_end(term, trunc, t)
        adv.append(sum((g * lam) ** (j - t) * delta[j] for j in range(t, end + 1)))
    return adv, [a + b for a, b in zip(adv, v, strict=True)]


def ref_next_values(v, last, term, trunc, final) -> list[float]:
    out = []
    for t in range(len(v)):
        if term[t] or trunc[t]:
            out.append(final[t] if final is not None else 0.0)
        elif t == len(v) - 1:
            out.append(last)
        else:
            out.append(v[t + 1])
    return out


def per_lane(fn, shape, *arrays, outputs=1):
    """Apply a one-lane reference to every lane of [T, ...] arrays broadcast to ``shape``."""
    T = shape[0]
    cols = [None if a is None else np.broadcast_to(a, shape).reshape(T, -1) for a in arrays]
    results = [np.zeros((T, int(np.prod(shape[1:], dtype=int)))) for _ in range(outputs)]
    for lane in range(results[0].shape[1]):
        lists = [None if c is None else [x.item() for x in c[:, lane]] for c in cols]
        got = fn(*lists)
        got = got if outputs > 1 else (got,)
        for res, g in zip(results, got, strict=True):
            res[:, lane] = g
    return [res.reshape(shape) for res in results] if outputs > 1 else results[0].reshape(shape)


# ---------------------------------------------------------------------------------------------------------
# Random rollouts
# ---------------------------------------------------------------------------------------------------------


@st.composite
def rollouts(draw):
    T, E = draw(st.integers(1, 12)), draw(st.integers(1, 4))
    A = draw(st.sampled_from([None, 1, 3]))
    shape = (T, E) if A is None else (T, E, A)
    flag_shape = shape if A is None or draw(st.booleans()) else (T, E, 1)  # team flags broadcast over agents
    p_end = draw(st.sampled_from([0.0, 0.2, 0.5]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    term = rng.random(flag_shape) < p_end
    trunc = rng.random(flag_shape) < p_end
    rewards = rng.normal(size=shape)
    values = rng.normal(size=shape)
    next_values = rng.normal(size=shape)
    final_values = rng.normal(size=shape)
    next_values[np.broadcast_to(term, shape)] = np.nan  # never read: a NaN there must not leak
    discount = draw(st.sampled_from([0.0, 0.5, 0.9, 0.99, 1.0]))
    lam = draw(st.sampled_from([0.0, 0.5, 0.95, 1.0]))
    return {"shape": shape, "rewards": rewards, "values": values, "next_values": next_values,
            "final_values": final_values, "term": term, "trunc": trunc, "discount": discount, "lam": lam}


BACKENDS = [
    ("numpy64", lambda a: a, 1e-10),
    ("numpy32", lambda a: a.astype(np.float32) if a.dtype == np.float64 else a, 2e-4),
    ("torch64", torch.from_numpy, 1e-10),
    ("torch32", lambda a: torch.from_numpy(a).float() if a.dtype == np.float64 else torch.from_numpy(a), 2e-4),
]


def check(got, want, name: str, tol: float, kind: str = "numpy32") -> None:
    if kind.startswith("torch"):
        assert isinstance(got, torch.Tensor)
        assert got.dtype == (torch.float32 if kind.endswith("32") else torch.float64)
        got = got.numpy()
    else:
        assert isinstance(got, np.ndarray)
        assert got.dtype == (np.float32 if kind.endswith("32") else np.float64)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * 10, err_msg=f"{name} ({kind})")


@settings(max_examples=60)
@given(rollouts(), st.booleans())
def test_discounted_returns_match_reference(ro, bootstrap):
    nv = ro["next_values"] if bootstrap else None
    want = per_lane(lambda r, te, tr, v: ref_returns(r, te, tr, ro["discount"], v),
                    ro["shape"], ro["rewards"], ro["term"], ro["trunc"], nv)
    for kind, conv, tol in BACKENDS:
        got = R.discounted_returns(conv(ro["rewards"]), conv(ro["term"]), conv(ro["trunc"]), ro["discount"],
                                   None if nv is None else conv(nv))
        check(got, want, "returns", tol, kind)


@settings(max_examples=60)
@given(rollouts(), st.integers(1, 14))
def test_nstep_match_reference(ro, n):
    want = per_lane(lambda r, te, tr, v: ref_nstep(r, te, tr, ro["discount"], v, n),
                    ro["shape"], ro["rewards"], ro["term"], ro["trunc"], ro["next_values"], outputs=4)
    for kind, conv, tol in BACKENDS:
        ret, disc, steps = R.nstep_returns(conv(ro["rewards"]), conv(ro["term"]), conv(ro["trunc"]),
                                           ro["discount"], n)
        check(ret, want[0], "returns", tol, kind)
        check(disc, want[1], "discounts", tol, kind)
        steps = steps.numpy() if kind.startswith("torch") else steps
        assert steps.dtype == np.int64
        np.testing.assert_array_equal(steps, want[2])
        targets = R.nstep_targets(conv(ro["rewards"]), conv(ro["next_values"]), conv(ro["term"]),
                                  conv(ro["trunc"]), ro["discount"], n)
        check(targets, want[3], "targets", tol, kind)


@settings(max_examples=60)
@given(rollouts())
def test_gae_matches_reference(ro):
    g, lam = ro["discount"], ro["lam"]
    want_adv, want_ret = per_lane(lambda r, v, nv, te, tr: ref_gae(r, v, nv, te, tr, g, lam), ro["shape"],
                                  ro["rewards"], ro["values"], ro["next_values"], ro["term"], ro["trunc"], outputs=2)
    for kind, conv, tol in BACKENDS:
        args = [conv(ro[k]) for k in ("rewards", "values", "next_values", "term", "trunc")]
        adv, ret = R.gae(*args, g, lam)
        check(adv, want_adv, "advantages", tol, kind)
        check(ret, want_ret, "returns", tol, kind)
        check(R.lambda_returns(*args, g, lam), want_ret, "lambda_returns", tol, kind)


@settings(max_examples=60)
@given(rollouts(), st.booleans())
def test_next_values_from_matches_reference(ro, with_final):
    shape, T = ro["shape"], ro["shape"][0]
    last = np.random.default_rng(T).normal(size=shape[1:])
    final = ro["final_values"] if with_final else None
    term, trunc = ro["term"], ro["trunc"]
    if not with_final:
        trunc = np.zeros_like(trunc)
    lasts = np.broadcast_to(last, shape)  # the reference reads lane by lane
    want = per_lane(lambda v, la, te, tr, f: ref_next_values(v, la[0], te, tr, f),
                    shape, ro["values"], lasts, term, trunc, final)
    for kind, conv, tol in BACKENDS:
        got = R.next_values_from(conv(ro["values"]), conv(last), conv(term), conv(trunc),
                                 None if final is None else conv(final))
        check(got, want, "next_values", tol, kind)


@settings(max_examples=40)
@given(rollouts())
def test_gae_special_cases(ro):
    """lam = 1 with consistent next values is the discounted return; lam = 0 is the one-step target."""
    shape, g = ro["shape"], ro["discount"]
    term, trunc, r, v = ro["term"], ro["trunc"], ro["rewards"], ro["values"]
    last = np.random.default_rng(0).normal(size=shape[1:])
    nv = R.next_values_from(v, last, term, trunc, ro["final_values"])
    _, ret1 = R.gae(r, v, nv, term, trunc, g, 1.0)
    np.testing.assert_allclose(ret1, R.discounted_returns(r, term, trunc, g, nv), rtol=1e-9, atol=1e-9)
    _, ret0 = R.gae(r, v, nv, term, trunc, g, 0.0)
    np.testing.assert_allclose(ret0, R.nstep_targets(r, nv, term, trunc, g, 1), rtol=1e-9, atol=1e-9)


# ---------------------------------------------------------------------------------------------------------
# Hand-computed tables (one env, no agents: arrays [T, 1])
# ---------------------------------------------------------------------------------------------------------


def col(*xs) -> np.ndarray:
    return np.array(xs, dtype=float)[:, None]


def flags(T: int, *at: int) -> np.ndarray:
    f = np.zeros((T, 1), bool)
    f[list(at)] = True
    return f


NO = flags(3)
RETURN_CASES = [
    # (name, rewards, terminated, truncated, discount, next_values, expected)
    # 1 + .9 * 2 + .81 * 3 = 5.23; 2 + .9 * 3 = 4.7; 3
    ("3-step episode, terminated", col(1, 2, 3), flags(3, 2), NO, 0.9, col(0, 0, 10), col(5.23, 4.7, 3)),
    # the same place truncated: 3 + .9 * 10 = 12; 2 + .9 * 12 = 12.8; 1 + .9 * 12.8 = 12.52
    ("3-step episode, truncated", col(1, 2, 3), NO, flags(3, 2), 0.9, col(0, 0, 10), col(12.52, 12.8, 12)),
    ("truncated without values", col(1, 2, 3), NO, flags(3, 2), 0.9, None, col(5.23, 4.7, 3)),
    # episode 1 = steps 0-1 (terminated), episode 2 = steps 2-3, bootstrapped at the rollout end from 2
    ("boundary mid-lane", col(1, 1, 1, 1), flags(4, 1), flags(4), 0.5, col(9, 9, 9, 2), col(1.5, 1, 2, 2)),
    ("rollout end bootstraps", col(0, 0), flags(2), flags(2), 0.5, col(0, 4), col(1, 2)),
    ("rollout end, no values", col(0, 1), flags(2), flags(2), 0.5, None, col(0.5, 1)),
    ("both flags: termination wins", col(1, 2), flags(2, 0), flags(2, 0), 0.5, col(8, 8), col(1, 6)),
]


@pytest.mark.parametrize("case", RETURN_CASES, ids=[c[0] for c in RETURN_CASES])
def test_discounted_returns_table(case):
    _, r, term, trunc, g, nv, want = case
    np.testing.assert_allclose(R.discounted_returns(r, term, trunc, g, nv), want, rtol=1e-12)
    got = R.discounted_returns(torch.tensor(r), torch.tensor(term), torch.tensor(trunc), g,
                               None if nv is None else torch.tensor(nv))
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12)


NSTEP_CASES = [
    # rewards 1..4, next values 10..40, discount .5, n = 2
    # t=0: 1 + .5*2, ends on termination -> 2; t=1: 2; t=2: 3 + .5*4 + .25*40 = 15; t=3: 4 + .5*40 = 24
    ("terminated at 1", flags(4, 1), flags(4), col(2, 2, 5, 4), col(0, 0, 0.25, 0.5), [2, 1, 2, 1], col(2, 2, 15, 24)),
    # truncated at 1: t=0: 2 + .25*20 = 7; t=1: 2 + .5*20 = 12
    ("truncated at 1", flags(4), flags(4, 1), col(2, 2, 5, 4), col(0.25, 0.5, 0.25, 0.5), [2, 1, 2, 1],
     col(7, 12, 15, 24)),
]


@pytest.mark.parametrize("case", NSTEP_CASES, ids=[c[0] for c in NSTEP_CASES])
def test_nstep_table(case):
    _, term, trunc, want_ret, want_disc, want_k, want_target = case
    r, nv = col(1, 2, 3, 4), col(10, 20, 30, 40)
    ret, disc, k = R.nstep_returns(r, term, trunc, 0.5, 2)
    np.testing.assert_allclose(ret, want_ret, rtol=1e-12)
    np.testing.assert_allclose(disc, want_disc, rtol=1e-12)
    np.testing.assert_array_equal(k[:, 0], want_k)
    np.testing.assert_allclose(R.nstep_targets(r, nv, term, trunc, 0.5, 2), want_target, rtol=1e-12)


def test_gae_table():
    # delta = [1 + .9*1 - .5, 2 + .9*1.5 - 1, 3 + .9*(0 or 4) - 1.5] = [1.4, 2.35, 1.5 or 5.1]; g*lam = .72
    r, v, nv = col(1, 2, 3), col(0.5, 1, 1.5), col(1, 1.5, 4)
    adv, ret = R.gae(r, v, nv, flags(3, 2), NO, 0.9, 0.8)
    np.testing.assert_allclose(adv, col(1.4 + 0.72 * 3.43, 2.35 + 0.72 * 1.5, 1.5), rtol=1e-12)
    np.testing.assert_allclose(ret, col(3.8696 + 0.5, 3.43 + 1, 3), rtol=1e-12)
    adv, _ = R.gae(r, v, nv, NO, flags(3, 2), 0.9, 0.8)  # truncation bootstraps from V(final obs) = 4
    np.testing.assert_allclose(adv, col(1.4 + 0.72 * 6.022, 2.35 + 0.72 * 5.1, 5.1), rtol=1e-12)
    # a boundary mid-lane stops the recursion: step 0 ends its episode, so A_0 = delta_0 alone
    adv, _ = R.gae(r, v, nv, NO, flags(3, 0), 0.9, 0.8)
    assert adv[0, 0] == pytest.approx(1.4)


def test_next_values_from_table():
    v, last = col(1, 2, 3), np.array([9.0])
    got = R.next_values_from(v, last, flags(3, 0), flags(3, 1), col(7, 8, 0))
    np.testing.assert_allclose(got, col(7, 8, 9))
    np.testing.assert_allclose(R.next_values_from(v, last, flags(3, 0), NO), col(0, 3, 9))
    with pytest.raises(ValueError, match="final_values: expected V of the final observations, got None"):
        R.next_values_from(v, last, NO, flags(3, 1))
    with pytest.raises(ValueError, match=r"last_values: expected shape \[E, \.\.\.\] with 1 axes"):
        R.next_values_from(v, np.array(9.0), NO, NO)


def test_team_flags_broadcast_over_agents():
    rng = np.random.default_rng(3)
    r = rng.normal(size=(6, 2, 3))
    term, trunc = rng.random((6, 2, 1)) < 0.3, rng.random((6, 2, 1)) < 0.3
    full = [np.broadcast_to(f, r.shape) for f in (term, trunc)]
    np.testing.assert_array_equal(R.discounted_returns(r, term, trunc, 0.9), R.discounted_returns(r, *full, 0.9))
    team_reward = r[..., :1]  # a team reward [T, E, 1] with per-agent values gives per-agent results
    assert R.gae(team_reward, r, r, term, trunc, 0.9, 0.9)[0].shape == (6, 2, 3)


def test_torch_keeps_device_and_dtype_and_mixed_inputs():
    r = torch.ones(4, 2, dtype=torch.float32)
    term = np.zeros((4, 2), bool)  # numpy flags join the torch computation
    out = R.discounted_returns(r, term, term, 0.5)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32 and out.device == r.device
    assert R.discounted_returns(np.ones((2, 1), np.int64), flags(2), flags(2), 0.5).dtype == np.float64


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensors_stay_on_their_device():
    rng = np.random.default_rng(5)
    r, v = rng.normal(size=(7, 3, 2)), rng.normal(size=(7, 3, 2))
    term, trunc = rng.random((7, 3, 1)) < 0.2, rng.random((7, 3, 1)) < 0.2
    cuda = [torch.from_numpy(x).cuda() for x in (r, v, v, term, trunc)]
    adv, ret = R.gae(*cuda, 0.9, 0.95)
    assert adv.is_cuda and ret.is_cuda
    np.testing.assert_allclose(adv.cpu().numpy(), R.gae(r, v, v, term, trunc, 0.9, 0.95)[0], rtol=1e-12)
    targets = R.nstep_targets(cuda[0], cuda[2], term, trunc, 0.9, 3)  # numpy flags move to the device
    np.testing.assert_allclose(targets.cpu().numpy(), R.nstep_targets(r, v, term, trunc, 0.9, 3), rtol=1e-12)
    assert R.normalize_advantages(cuda[0], cuda[3]).is_cuda
    norm = R.ValueNormalizer((2,))
    norm.update(cuda[0])
    assert norm.normalize(cuda[0]).is_cuda


def test_bad_arguments_raise():
    r = np.zeros((4, 2))
    with pytest.raises(ValueError, match=r"terminated: expected shape \[T=4, \.\.\.\] with 2 axes .* got \(2, 4\)"):
        R.discounted_returns(r, np.zeros((2, 4), bool), np.zeros((4, 2), bool), 0.9)
    with pytest.raises(ValueError, match=r"truncated: expected shape \[T=4, \.\.\.\] with 2 axes .* got \(4,\)"):
        R.discounted_returns(r, np.zeros((4, 2), bool), np.zeros(4, bool), 0.9)
    with pytest.raises(ValueError,
                       match=r"values: shape \(4, 3\) does not broadcast with rewards \(4, 2\) \(axis 1: 3 vs 2\)"):
        R.gae(r, np.zeros((4, 3)), r, r, r, 0.9, 0.9)
    with pytest.raises(ValueError, match=r"discount: expected a number in \[0, 1\], got 1.5"):
        R.discounted_returns(r, r, r, 1.5)
    with pytest.raises(ValueError, match=r"lam: expected a number in \[0, 1\], got -0.1"):
        R.gae(r, r, r, r, r, 0.9, -0.1)
    with pytest.raises(ValueError, match="n: expected an integer >= 1, got 0"):
        R.nstep_targets(r, r, r, r, 0.9, 0)
    with pytest.raises(ValueError, match="rewards: expected a time-major array"):
        R.discounted_returns(np.float64(1.0), True, False, 0.9)


# ---------------------------------------------------------------------------------------------------------
# normalize_advantages
# ---------------------------------------------------------------------------------------------------------


@settings(max_examples=60)
@given(st.integers(0, 2**32 - 1), st.integers(1, 12), st.integers(1, 4), st.sampled_from([None, 1, 3]))
def test_normalize_advantages_uses_valid_entries_only(seed, T, E, A):
    rng = np.random.default_rng(seed)
    shape = (T, E) if A is None else (T, E, A)
    adv = rng.normal(2.0, 3.0, size=shape)
    mask = rng.random(shape if A != 3 else (T, E, 1)) < 0.7
    full = np.broadcast_to(mask, shape)
    valid = [x.item() for x in adv[full]]
    want = np.zeros(shape)
    if valid:
        mean, std = statistics.fmean(valid), statistics.pstdev(valid)
        want[full] = (adv[full] - mean) / (std + 1e-8)
    got = R.normalize_advantages(adv, mask)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)
    changed = adv.copy()
    changed[~full] = rng.choice([np.nan, np.inf, -1e30, 5.0], size=int((~full).sum()))
    np.testing.assert_array_equal(R.normalize_advantages(changed, mask), got)
    got32 = R.normalize_advantages(torch.from_numpy(changed).float(), torch.from_numpy(mask))
    assert got32.dtype == torch.float32
    np.testing.assert_allclose(got32.numpy(), want, rtol=1e-4, atol=1e-4)


def test_normalize_advantages_without_mask_and_edge_cases():
    adv = np.array([1.0, 2.0, 3.0, 4.0])
    np.testing.assert_allclose(R.normalize_advantages(adv), (adv - 2.5) / (np.std(adv) + 1e-8))
    assert np.all(R.normalize_advantages(adv, np.zeros(4, bool)) == 0)  # nothing valid: all zero
    assert np.all(R.normalize_advantages(adv, np.eye(4, dtype=bool)[0]) == 0)  # one valid entry: 0
    with pytest.raises(ValueError, match=r"mask: expected 1 axes like adv \(4,\), got \(1, 4\)"):
        R.normalize_advantages(adv, np.ones((1, 4), bool))


# ---------------------------------------------------------------------------------------------------------
# ValueNormalizer
# ---------------------------------------------------------------------------------------------------------


def batches(seed: int, shape: tuple[int, ...], count: int = 8) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(5.0, 2.0, size=(int(rng.integers(1, 20)), *shape)) for _ in range(count)]


@pytest.mark.parametrize("shape", [(), (3,)])
def test_value_normalizer_plain_mode_matches_numpy(shape):
    norm = R.ValueNormalizer(shape, beta=None, min_var=0.0)
    seen = []
    for i, x in enumerate(batches(1, shape)):
        norm.update(torch.from_numpy(x) if i % 2 else x)
        seen.append(x)
        stream = np.concatenate(seen)
        np.testing.assert_allclose(norm.mean, stream.mean(axis=0), rtol=1e-12)
        np.testing.assert_allclose(norm.var, stream.var(axis=0), rtol=1e-10)
    np.testing.assert_allclose(norm.normalize(stream), (stream - stream.mean(0)) / stream.std(0), rtol=1e-9)


def test_value_normalizer_debiased_ema_matches_reference():
    beta, shape = 0.9, (2,)
    norm = R.ValueNormalizer(shape, beta=beta, min_var=1e-2)
    m, s, d = [0.0, 0.0], [0.0, 0.0], 0.0
    for x in batches(2, shape):
        norm.update(x)
        for i in range(2):
            column = [row[i].item() for row in x]
            m[i] = beta * m[i] + (1 - beta) * statistics.fmean(column)
            s[i] = beta * s[i] + (1 - beta) * statistics.fmean([c * c for c in column])
        d = beta * d + (1 - beta)
        mean = [m[i] / d for i in range(2)]
        var = [max(s[i] / d - mean[i] ** 2, 1e-2) for i in range(2)]
        np.testing.assert_allclose(norm.mean, mean, rtol=1e-10)
        np.testing.assert_allclose(norm.var, var, rtol=1e-8)
    y = np.array([[1.0, -2.0]])
    np.testing.assert_allclose(norm.normalize(y), (y - mean) / np.sqrt(var), rtol=1e-8)


def test_value_normalizer_first_update_is_debiased_and_no_data_is_identity():
    norm = R.ValueNormalizer()
    x = np.array([1.0, 2.0, 3.0])
    np.testing.assert_array_equal(norm.normalize(x), x)
    norm.update(x)
    assert norm.mean == pytest.approx(2.0) and norm.var == pytest.approx(2 / 3)
    norm.update(np.zeros(0))  # an empty batch changes nothing
    assert norm.mean == pytest.approx(2.0)


@pytest.mark.parametrize("beta", [None, 0.99])
def test_value_normalizer_round_trips(beta):
    norm = R.ValueNormalizer((3,), beta=beta)
    for x in batches(3, (3,), 4):
        norm.update(x)
    x = np.random.default_rng(4).normal(size=(5, 3))
    np.testing.assert_allclose(norm.denormalize(norm.normalize(x)), x, rtol=1e-12)
    t = torch.from_numpy(x).float()
    back = norm.denormalize(norm.normalize(t))
    assert back.dtype == torch.float32
    np.testing.assert_allclose(back.numpy(), x, rtol=1e-5, atol=1e-5)
    assert norm.normalize(x.astype(np.float32)).dtype == np.float32

    state = norm.state_dict()
    assert all(isinstance(v, float | tuple | np.ndarray | type(None)) for v in state.values())
    other = R.ValueNormalizer((3,), beta=beta)
    other.load_state_dict(state)
    np.testing.assert_array_equal(other.normalize(x), norm.normalize(x))
    more = batches(5, (3,), 2)
    for n in (norm, other):
        for b in more:
            n.update(b)
    np.testing.assert_array_equal(other.mean, norm.mean)
    np.testing.assert_array_equal(other.var, norm.var)


def test_value_normalizer_bad_arguments():
    with pytest.raises(ValueError, match=r"beta: expected a number in \(0, 1\) or None, got 1.0"):
        R.ValueNormalizer(beta=1.0)
    norm = R.ValueNormalizer((3,))
    with pytest.raises(ValueError,
                       match=r"expected an array \[\.\.\., 3\] \(trailing shape \(3,\)\), got shape \(4, 2\)"):
        norm.update(np.zeros((4, 2)))
    with pytest.raises(ValueError, match=r"expected a state of shape \(3,\) and beta 0.99999, got shape \(\) and beta"):
        norm.load_state_dict(R.ValueNormalizer(()).state_dict())
