"""Soundness: every method's bound is at or above the exact privacy of small mechanisms.

The exact laws come from `tests.accounting.exact_selection` (finite ordered
output spaces: sums; a Gaussian score: fine binning, itself a lower bound of
the true divergence). A method whose epsilon lets the exact hockey-stick
divergence exceed delta is reporting too little privacy loss: a release-blocking bug.
"""

from __future__ import annotations

import math

import dp_accounting as dpa
import numpy as np
import pytest

from jaxdp import accounting as acc
from jaxdp.accounting import profile_selection as ps
from jaxdp.accounting import profiles as prof_lib
from tests.accounting import exact_selection as ex

DISTS = {
    "poisson0.5": acc.Poisson(mean=0.5),
    "poisson3": acc.Poisson(mean=3),
    "poisson10": acc.Poisson(mean=10),
    "geom3": acc.Geometric(mean=3),
    "geom10": acc.Geometric(mean=10),
    "log5": acc.Logarithmic(mean=5),
    "tnb-0.5": acc.TruncatedNegativeBinomial(-0.5, mean=5),
    "tnb2": acc.TruncatedNegativeBinomial(2.0, mean=5),
    "bin5": acc.Binomial(5, 0.6),
    "bin20": acc.Binomial(20, 0.5),
    "bin3p1": acc.Binomial(3, 1.0),
    "capgeom": acc.CappedGeometric(0.2, 6),
    "fixed3": acc.Fixed(3),
}


def _bases():
  yield "rr0.8", acc.PureDp(0.8), ex.randomized_response(0.8)
  yield "geommech0.5", acc.PureDp(0.5), ex.geometric_mechanism(0.5)
  yield "gauss2", dpa.GaussianDpEvent(2.0), ex.gaussian_bins(2.0, n_bins=6000, width=10.0)
  e0, d0 = 0.6, 1e-3
  a = math.exp(e0) / (1 + math.exp(e0))
  p = np.array([d0, (1 - d0) * a, (1 - d0) * (1 - a), 0.0])
  yield "approx", acc.ApproxDp(e0, d0), (p, p[::-1].copy())


BASES = list(_bases())


def _exact_hs(q0, q1, dist, eps):
  return max(ex.hockey_stick(ex.best_of_k(a, dist), ex.best_of_k(b, dist), eps)
             for a, b in ex.pairs_both_ways(q0, q1))


def _check_every_method(base_name, base, pair, dist_name, deltas, epsilons):
  dist = DISTS[dist_name]
  event = acc.RepeatAndSelect(base, dist)
  q0, q1 = pair
  checked = 0
  for method in acc.METHODS:
    for delta in deltas:
      try:
        eps = acc.epsilon(event, delta, method)
      except acc.NotApplicableError:
        continue
      checked += 1
      if math.isinf(eps):
        continue
      exact = _exact_hs(q0, q1, dist, eps)
      assert exact <= delta * (1 + 1e-6) + 1e-12, (method, delta, eps, exact)
    for eps in epsilons:
      try:
        bound = acc.delta(event, eps, method)
      except acc.NotApplicableError:
        continue
      assert _exact_hs(q0, q1, dist, eps) <= bound * (1 + 1e-6) + 1e-12, (method, eps)
  assert checked > 0 or base_name == "approx"


@pytest.mark.parametrize("base_name,base,pair", BASES, ids=[b[0] for b in BASES])
@pytest.mark.parametrize("dist_name", list(DISTS))
def test_every_method_at_or_above_exact(base_name, base, pair, dist_name):
  _check_every_method(base_name, base, pair, dist_name, deltas=(1e-3,), epsilons=(1.0,))


@pytest.mark.slow
@pytest.mark.parametrize("base_name,base,pair", BASES, ids=[b[0] for b in BASES])
@pytest.mark.parametrize("dist_name", list(DISTS))
def test_every_method_at_or_above_exact_more_points(base_name, base, pair, dist_name):
  _check_every_method(base_name, base, pair, dist_name, deltas=(1e-2, 1e-5, 1e-8),
                      epsilons=(0.0, 0.3, 2.0, 4.0))


def _random_pair(rng, n):
  p = rng.dirichlet(np.full(n, 0.7))
  r = rng.dirichlet(np.full(n, 0.7))
  mix = rng.uniform(0.5, 0.95)
  return p, mix * p + (1 - mix) * r  # mixing keeps the likelihood ratio bounded


class _ExactPairProfile(prof_lib.PrivacyProfile):
  """The exact symmetric profile of one discrete pair (a valid profile of that pair)."""

  def __init__(self, p, r):
    self.p, self.r = p, r

  def _delta_nonneg(self, eps):
    return np.array([max(ex.hockey_stick(self.p, self.r, e), ex.hockey_stick(self.r, self.p, e))
                     for e in np.atleast_1d(eps)])


@pytest.mark.parametrize("refined", [False, True], ids=["printed", "refined"])
def test_random_pairs_with_exact_base_profile(refined):
  # Many random pairs whose base profile is known exactly: the selection bound
  # (the shift recipe with each theorem's c(eps1)) must dominate the exact
  # best-of-K profile at every eps tried.
  rng = np.random.default_rng(1234)
  dists = [DISTS[k] for k in ("poisson3", "geom10", "log5", "tnb-0.5", "tnb2", "bin5", "bin20")]
  for _ in range(25):
    p, r = _random_pair(rng, int(rng.integers(2, 7)))
    base = _ExactPairProfile(p, r)
    for dist in dists:
      prof, _, _, _ = ps.select(base, dist, refined)
      for a, b in ex.pairs_both_ways(p, r):
        la, lb = ex.best_of_k(a, dist), ex.best_of_k(b, dist)
        for eps in (0.0, 0.2, 0.7, 1.5):
          assert ex.hockey_stick(la, lb, eps) <= prof.delta(eps) * (1 + 1e-9) + 1e-12


def _threshold_law(q, tau_index, gamma, t):
  """Exact output law of LT Algorithm 1: outputs >= tau keep Q's shape, BOT gets the rest."""
  q = np.asarray(q, dtype=np.float64)
  p = q[tau_index:].sum()
  r = (1 - p) * (1 - gamma)
  scale = 1 / (1 - r) if t is None else -math.expm1(t * math.log(r)) / (1 - r) if r > 0 else 1.0
  out = q[tau_index:] * scale
  return np.concatenate([[1 - out.sum()], out])


@pytest.mark.parametrize("gamma,t", [(0.1, None), (0.3, None), (0.1, 20), (0.5, 2), (0.05, 200)])
def test_threshold_select_at_or_above_exact(gamma, t):
  eps1 = 0.7
  bound = acc.epsilon(acc.ThresholdSelect(acc.PureDp(eps1), gamma, t), 1e-9, method="liu-talwar")
  for q0, q1 in (ex.randomized_response(eps1), ex.geometric_mechanism(eps1, n=8)):
    for a, b in ex.pairs_both_ways(q0, q1):
      for tau in range(1, len(a)):
        la, lb = _threshold_law(a, tau, gamma, t), _threshold_law(b, tau, gamma, t)
        mask = la > 0
        exact = float(np.max(np.log(la[mask]) - np.log(lb[mask])))
        assert exact <= bound + 1e-9


@pytest.mark.parametrize("t", [None, 3, 30])
def test_random_stopping_pure_at_or_above_exact(t):
  eps1 = 1.0
  ev = acc.RandomStopping(acc.PureDp(eps1), 0.1, t)
  bound = acc.epsilon(ev, 1e-9, method="liu-talwar")
  law = acc.Geometric(gamma=0.1) if t is None else acc.CappedGeometric(0.1, t)
  for a, b in ex.pairs_both_ways(*ex.geometric_mechanism(eps1, n=10)):
    la, lb = ex.best_of_k(a, law), ex.best_of_k(b, law)
    mask = la > 0
    assert float(np.max(np.log(la[mask]) - np.log(lb[mask]))) <= bound + 1e-9


@pytest.mark.parametrize("dist_name", ["poisson0.5", "poisson3", "bin5", "geom3", "tnb-0.5"])
@pytest.mark.parametrize("base_eps", [0.1, 0.8])
def test_selection_profile_bounds_the_exact_curve_at_negative_eps(dist_name, base_eps):
  # Best of K randomized-response runs, exactly: below eps = 0 the default
  # output released when K = 0 (mass P[K=0] under both neighbours) adds
  # P[K=0] (1 - e^eps) to the hockey-stick divergence, which the KRW bound
  # m delta_Q(eps - c) alone does not cover.
  dist = DISTS[dist_name]
  q0, q1 = ex.randomized_response(base_eps)
  prof, _, _, shift = ps.select(prof_lib.PureDpProfile(base_eps), dist)
  assert prof.atom == dist.prob_zero
  for eps in (-3.0, -1.0, -0.3, -0.05, 0.0, 0.3, 1.0):
    assert _exact_hs(q0, q1, dist, eps) <= prof.delta(eps) * (1 + 1e-12), eps
    without_atom = min(1.0, prof.scale * prof.inner.delta(eps - shift))
    if eps >= 0.0:  # the atom adds nothing there: every reported epsilon is unchanged
      assert prof.delta(eps) == without_atom
  if dist_name == "poisson0.5":  # P[K=0] = 0.61: without the atom the bound was below the truth
    assert _exact_hs(q0, q1, dist, -1.0) > min(1.0, prof.scale * prof.inner.delta(-1.0 - shift))
    np.testing.assert_allclose(prof.delta(np.array([-1.0, -0.3])),
                               prof.scale * prof.inner.delta(np.array([-1.0, -0.3]) - shift)
                               + math.exp(-0.5) * -np.expm1([-1.0, -0.3]), rtol=1e-15)
