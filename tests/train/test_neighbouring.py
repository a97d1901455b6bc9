"""Each DP release of a candidate on neighbouring data sets, against its exact epsilon.

For the DP score (`NoisyMean`) and for one full-batch DP-SGD step, the code's
release is pinned to an analytic law (a Gaussian whose mean and std follow
from the declared public size, never from the rows present), on a data set D
and on every neighbour D' (one example added at either bound, or one
removed). The exact epsilon of that pair of Gaussians, in both directions
(`tests.exact_release`), must not exceed the accounted epsilon. A normaliser
read from the rows fails both checks: the law differs, and adding one example
moves the release about twice as far as accounted (issue 20's table).
"""

import math
import warnings

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import scipy.integrate
from scipy import stats

from jaxdp import accounting as acc
from jaxdp.data import Dataset
from jaxdp.train import Model, NoisyMean, Task, TrainConfig, train_candidate
from jaxdp.train import NotPrivateWarning
from tests import exact_release

DELTA = 1e-5
KEYS = [jax.random.key(k) for k in (0, 1, 2, 3)]


def test_exact_gaussian_pair_matches_closed_form_and_integration():
  mu, eps = 0.7, 1.3
  closed = stats.norm.cdf(mu / 2 - eps / mu) - math.exp(eps) * stats.norm.cdf(-mu / 2 - eps / mu)
  assert exact_release.delta(0.0, 1.0, mu, 1.0, eps) == pytest.approx(closed, rel=1e-12)
  # Unequal variances: the quadratic region against direct integration of (p - e^eps q)+.
  m0, s0, m1, s1, eps = 0.0, 1.0, 0.4, 1.3, 0.5
  integrand = lambda x: max(0.0, stats.norm.pdf(x, m0, s0) - math.exp(eps) * stats.norm.pdf(x, m1, s1))
  numeric = scipy.integrate.quad(integrand, -40, 40, points=[-5, 0, 5], limit=500, epsabs=1e-13)[0]
  assert exact_release.delta_one_way(m0, s0, m1, s1, eps) == pytest.approx(numeric, rel=1e-8)
  # epsilon inverts delta.
  e = exact_release.epsilon(m0, s0, m1, s1, 1e-3)
  assert exact_release.delta(m0, s0, m1, s1, e) <= 1e-3 < exact_release.delta(m0, s0, m1, s1, e - 1e-6)


def _check_exact_below_accounted(law_d, law_neighbour, event):
  """delta_exact(eps_accounted) <= delta for every method: the privacy side, checked exactly."""
  (m0, s0), (m1, s1) = law_d, law_neighbour
  for method in ("rdp", "best"):
    eps = acc.epsilon(event, DELTA, method=method)
    # Tolerance: two float64 implementations of the normal CDF (scipy's and
    # dp-accounting's), relative 1e-9 of delta.
    assert exact_release.delta(m0, s0, m1, s1, eps) <= DELTA * (1 + 1e-9), method
  return exact_release.epsilon(m0, s0, m1, s1, DELTA)


# ------------------------------------------------------------ DP score: NoisyMean

# (low, high, sigma, declared n): the four settings of issue 20, then a grid.
SCORE_CASES = [((0.0, 1.0), 2.0, 100), ((0.0, 1.0), 1.0, 20), ((0.0, 1.0), 0.5, 10),
               ((-3.0, 5.0), 4.0, 50)] + [
                   ((lo, hi), sigma, n) for lo, hi in ((0.0, 1.0), (-1.0, 0.0), (-2.0, 6.0))
                   for sigma in (0.7, 3.0) for n in (1, 7, 1000)]
NEIGHBOURS = ("add-low", "add-high", "remove")


def _neighbour(values, kind, low, high):
  if kind == "remove":
    return values[:-1]
  return np.append(values, low if kind == "add-low" else high)


def _score_law(score, values):
  """The analytic law of `score` on `values`: (sum(v - mid) + N(0, (sigma half)^2)) / n + mid."""
  mid, half = (score.low + score.high) / 2, (score.high - score.low) / 2
  clipped = np.clip(values.astype(np.float64), score.low, score.high)
  return (np.sum(clipped - mid) / score.num_examples + mid,
          score.noise_multiplier * half / score.num_examples)


def _assert_code_follows_law(score, values):
  mean, std = _score_law(score, values)
  got = np.array([float(score(jnp.asarray(values, jnp.float32), None, k)) for k in KEYS])
  want = mean + std * np.array([float(jax.random.normal(k)) for k in KEYS])
  # float32 arithmetic on a sum of up to 1001 values in [-3, 6].
  np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6 * (abs(mean) + std + 1))


@pytest.mark.parametrize("kind", NEIGHBOURS)
@pytest.mark.parametrize("base", ("high", "low"))
@pytest.mark.parametrize("bounds,sigma,n", SCORE_CASES,
                         ids=[f"[{lo:g},{hi:g}]-sigma{s:g}-n{n}" for (lo, hi), s, n in SCORE_CASES])
def test_noisy_mean_exact_epsilon_is_at_most_accounted(bounds, sigma, n, base, kind):
  low, high = bounds
  score = NoisyMean(lambda out, batch: out, low, high, sigma, num_examples=n)
  data = np.full(n, high if base == "high" else low)
  other = _neighbour(data, kind, low, high)  # n = 1, remove: D' is empty, the score is noise
  for values in (data, other):
    _assert_code_follows_law(score, values)
  law_d, law_other = _score_law(score, data), _score_law(score, other)
  assert law_d[1] == law_other[1]  # the divisor is the declared n on both
  exact = _check_exact_below_accounted(law_d, law_other, score.event)
  # The worst neighbour (one example at the far bound) is the Gaussian mechanism itself.
  if (base, kind) in (("high", "add-low"), ("low", "add-high")):
    assert exact == pytest.approx(exact_release.gaussian_mechanism_epsilon(1 / sigma, DELTA), rel=1e-9)


def test_noisy_mean_divisor_ignores_the_rows_present():
  score = NoisyMean(lambda out, batch: out, 0.0, 1.0, 2.0, num_examples=100)
  key = jax.random.key(7)
  ones = [float(score(jnp.ones(rows), None, key)) for rows in (99, 100, 101)]
  z = float(jax.random.normal(key))
  for rows, got in zip((99, 100, 101), ones):
    assert got == pytest.approx((rows * 0.5 + 2.0 * 0.5 * z) / 100 + 0.5, rel=1e-6)


# --------------------------------------------------- DP-SGD: the normaliser q*N

C, SIGMA, N = 1.5, 1.3, 20
# The clipping bound's relative slack for this one-parameter model: the rounding of a
# sum over at most 64 rows (the padded batch) plus the bound's own roundings, about
# (64 + 16) u = 4.8e-6 (jaxdp.train.clipping.clip_scales); measured 2.2e-6.
CLIP_SLACK = 1e-5


# Per-example loss -w x: gradient -x, clipped to norm C. One Task object, so
# every run below shares one compiled program.
SCALAR_TASK = Task(model=Model(init=lambda key, x: {"w": jnp.zeros((), jnp.float32)},
                               apply=lambda params, x: params["w"] * x[:, 0]),
                   loss=lambda out, batch: -out, optimizer=lambda hp: optax.sgd(1.0), name="scalar")


def _rows(values):
  return {"x": np.asarray(values, np.float32)[:, None]}


def _data(values):
  # The declared N stays N on every neighbour: only the rows change.
  return Dataset(train=_rows(values), test=_rows([0.0]), num_examples=N)


def _one_step(values, sigma, key, by):
  size = dict(sampling_prob=1.0) if by == "sampling_prob" else dict(batch_size=float(N))
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", NotPrivateWarning)
    config = TrainConfig(task=SCALAR_TASK, l2_clip_norm=C, noise_multiplier=sigma, steps=1, **size)
  return float(train_candidate(config, _data(values), key).params["w"]), config


@pytest.mark.parametrize("by", ("sampling_prob", "batch_size"))
@pytest.mark.parametrize("kind", NEIGHBOURS)
def test_dpsgd_step_exact_epsilon_is_at_most_accounted(kind, by):
  # One full-batch step (q = 1) from w = 0 with SGD at rate 1 releases
  #   w1 = (sum_i clip_C(x_i) - sigma C Z) / (q N),
  # N the declared size: N(sum clip / N, (sigma C / N)^2) whatever the rows.
  data = np.full(N, 3 * C)  # every example clipped to +C
  other = _neighbour(data, kind, -3 * C, 3 * C)
  laws = []
  for values in (data, other):
    mean, _ = _one_step(values, 0.0, KEYS[0], by)
    clipped = np.clip(values, -C, C)
    want = float(np.sum(clipped)) / N
    # Each clipped example adds C (1 - s) with 0 <= s <= CLIP_SLACK: its weight comes from an
    # upper bound of its norm that includes float32 rounding (jaxdp.train.clipping), never
    # more than C; the rest is the float32 rounding of the sum (rel 1e-6).
    up, down = float(np.sum(np.maximum(clipped, 0))), float(np.sum(np.minimum(clipped, 0)))
    lowest, highest = ((1 - CLIP_SLACK) * up + down) / N, (up + (1 - CLIP_SLACK) * down) / N
    assert lowest - 1e-6 * abs(want) <= mean <= highest + 1e-6 * abs(want)
    laws.append((want, SIGMA * C / N))
  # The noise is the same draw on D and D' (same key), so its law is the same:
  # only the mean moves, by at most C / N.
  for key in KEYS:
    noise = [_one_step(v, SIGMA, key, by)[0] - _one_step(v, 0.0, key, by)[0] for v in (data, other)]
    # Each w1 is a float32 near 1.5 (ulp 1.2e-7): a few ulps of the difference.
    assert noise[0] == pytest.approx(noise[1], abs=5e-7)
  _, config = _one_step(data, SIGMA, KEYS[0], by)
  exact = _check_exact_below_accounted(laws[0], laws[1], config.dp_event(N))
  if kind == "add-low":
    assert exact == pytest.approx(exact_release.gaussian_mechanism_epsilon(1 / SIGMA, DELTA), rel=1e-9)


@pytest.mark.slow  # suite budget: a statistical test of many draws (test_plan checks the std too)
def test_dpsgd_noise_has_the_std_of_the_law():
  # 300 keys: the sample std's relative standard error is 1 / sqrt(600) = 4%, so
  # this pins the scale sigma C / N (a noise divided twice, or not at all, is far
  # off); that the divisor is N and not the rows is pinned above, exactly.
  data = np.full(N + 1, 3 * C)
  base, _ = _one_step(data, 0.0, KEYS[0], "sampling_prob")
  draws = np.array([_one_step(data, SIGMA, jax.random.key(100 + i), "sampling_prob")[0] - base
                    for i in range(300)])
  assert np.std(draws) == pytest.approx(SIGMA * C / N, rel=0.15)
  assert abs(np.mean(draws)) < 4 * SIGMA * C / N / math.sqrt(300)


def test_gaussian_event_is_what_noisy_mean_declares():
  assert NoisyMean(lambda o, b: o, 0.0, 1.0, 2.5, num_examples=3).event == dp_accounting.GaussianDpEvent(2.5)
