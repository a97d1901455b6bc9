"""Inverse problems: max_mean and calibrate_noise err on the private side."""

from __future__ import annotations

import dp_accounting as dpa
import pytest

from jaxdp import accounting as acc

GAUSS4 = dpa.GaussianDpEvent(4.0)


@pytest.mark.parametrize("family", ["poisson", "geometric", "logarithmic"])
@pytest.mark.parametrize("method", ["profile", "rdp", "best"])
def test_max_mean_is_feasible_and_tight(family, method):
  eps, delta = 3.0, 1e-6
  m = acc.max_mean(GAUSS4, family, eps, delta, method=method, rtol=1e-3)
  make = {"poisson": acc.Poisson, "geometric": acc.Geometric, "logarithmic": acc.Logarithmic}[family]
  assert acc.epsilon(acc.RepeatAndSelect(GAUSS4, make(mean=m)), delta, method) <= eps
  assert acc.epsilon(acc.RepeatAndSelect(GAUSS4, make(mean=m * 1.002)), delta, method) > eps


def test_max_mean_profile_beats_rdp_and_best_is_at_least_both():
  prof = acc.max_mean(GAUSS4, "geometric", 2.5, 1e-6, method="profile")
  rdp = acc.max_mean(GAUSS4, "geometric", 2.5, 1e-6, method="rdp")
  best = acc.max_mean(GAUSS4, "geometric", 2.5, 1e-6)
  assert prof > 2 * rdp
  assert best >= max(prof, rdp) * (1 - 2e-3)


def test_max_mean_callable_family():
  fam = lambda m: acc.TruncatedNegativeBinomial(0.5, mean=m)
  m = acc.max_mean(GAUSS4, fam, 2.5, 1e-6, method="profile")
  assert acc.epsilon(acc.RepeatAndSelect(GAUSS4, fam(m)), 1e-6, "profile") <= 2.5


@pytest.mark.parametrize("args,match", [
    ((GAUSS4, "uniform", 2.0, 1e-6), "family"),
    ((GAUSS4, "poisson", 0.0, 1e-6), "epsilon"),
    ((GAUSS4, "poisson", 2.0, 1.0), "delta"),
    ((GAUSS4, "geometric", 0.5, 1e-6), "too small"),
], ids=["family", "eps", "delta", "unreachable"])
def test_max_mean_bad_input(args, match):
  with pytest.raises(ValueError, match=match):
    acc.max_mean(*args, method="profile")


def test_calibrate_noise_round_trip():
  q, steps, dist = 0.05, 50, acc.Geometric(mean=10)
  sigma = acc.calibrate_noise(q, steps, dist, 2.0, 1e-5, method="profile", rtol=1e-2)
  ev = lambda s: acc.RepeatAndSelect(acc.dpsgd_event(q, s, steps), dist)
  assert acc.epsilon(ev(sigma), 1e-5, "profile") <= 2.0
  assert acc.epsilon(ev(sigma / 1.01), 1e-5, "profile") > 2.0


def test_calibrate_noise_profile_needs_less_noise_than_rdp():
  args = (0.05, 50, acc.Geometric(mean=10), 2.0, 1e-5)
  assert acc.calibrate_noise(*args, method="profile", rtol=1e-2) < acc.calibrate_noise(*args, method="rdp", rtol=1e-2)


@pytest.mark.parametrize("kwargs,match", [
    (dict(sampling_prob=0.0), "sampling_prob"), (dict(iterations=0), "iterations"),
    (dict(epsilon=-1.0), "epsilon"), (dict(distribution="geometric"), "distribution"),
    (dict(epsilon=1e-4, sigma_max=1.1), "out of reach"),
], ids=["q", "T", "eps", "dist", "unreachable"])
def test_calibrate_noise_bad_input(kwargs, match):
  args = dict(sampling_prob=0.01, iterations=100, distribution=acc.Geometric(mean=10), epsilon=2.0,
              delta=1e-5, method="profile")
  args.update(kwargs)
  with pytest.raises(ValueError, match=match):
    acc.calibrate_noise(**args)
