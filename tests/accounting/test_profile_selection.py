"""KRW profile bounds for repeat-and-select: reference values, special cases,
the separable optimisation, and integration with `epsilon(method="best")`."""

from __future__ import annotations

import math

import dp_accounting as dpa
import numpy as np
import pytest

from jaxdp import accounting as acc
from jaxdp.accounting import profile_selection as ps
from jaxdp.accounting import profiles

GAUSS4 = dpa.GaussianDpEvent(4.0)
DPSGD = dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(256 / 60000, dpa.GaussianDpEvent(1.1)), 14063)


@pytest.mark.parametrize("m,want5,want6", [(10, 1.8620, 1.9830), (30, 2.1724, 2.2883),
                                           (300, 2.6869, 2.7938), (3000, 3.1140, 3.2136)])
def test_geometric_gaussian_reference(m, want5, want6):
  # REFERENCE 9.5: KRW Thm 5.2, Gaussian sigma = 4, geometric with mean m.
  ev = acc.RepeatAndSelect(GAUSS4, acc.Geometric(mean=m))
  assert acc.epsilon(ev, 1e-5, method="profile") == pytest.approx(want5, abs=2e-4)
  assert acc.epsilon(ev, 1e-6, method="profile") == pytest.approx(want6, abs=2e-4)


def test_poisson_and_binomial_gaussian_reference():
  # REFERENCE 9.5, m = 10: Poisson Cor 5.8 2.0555 | 2.1765; Bin(n, 10/n) Thm 5.7.
  ev = acc.RepeatAndSelect(GAUSS4, acc.Poisson(mean=10))
  assert acc.epsilon(ev, 1e-5, method="profile") == pytest.approx(2.0555, abs=1e-4)
  assert acc.epsilon(ev, 1e-6, method="profile") == pytest.approx(2.1765, abs=1e-4)
  # The reference searched eps1 on a 1e-3 grid; bisection finds the smallest
  # feasible eps1, so ours may be lower by up to ~(n-1) p e^eps1 * 1e-3.
  for n, want in ((15, 2.5852), (20, 2.3695), (1000, 2.0595)):
    got = acc.epsilon(acc.RepeatAndSelect(GAUSS4, acc.Binomial(n, 10 / n)), 1e-5, method="profile")
    assert want - 2e-3 <= got <= want + 1e-4


@pytest.mark.parametrize("dist,rdp5,hs5,hs6", [
    (acc.Geometric(mean=10), 5.0490, 4.3885, 4.6760),
    (acc.Poisson(mean=10), 5.7489, 4.9416, 5.2292),
    (acc.Geometric(mean=30), 5.7271, 5.1021, 5.3789),
    (acc.Poisson(mean=30), 11.3192, 9.5714, 9.8482),
], ids=["geom10", "poisson10", "geom30", "poisson30"])
def test_dpsgd_reference(dist, rdp5, hs5, hs6):
  # REFERENCE 9.6 (PLD, discretisation 1e-4, +-0.01) and 9.1 (RDP).
  ev = acc.RepeatAndSelect(DPSGD, dist)
  assert acc.epsilon(ev, 1e-5, method="profile") == pytest.approx(hs5, abs=1e-2)
  assert acc.epsilon(ev, 1e-6, method="profile") == pytest.approx(hs6, abs=1e-2)
  assert acc.epsilon(ev, 1e-5, method="rdp") == pytest.approx(rdp5, abs=1e-4)
  assert acc.epsilon(ev, 1e-5) == pytest.approx(hs5, abs=1e-2)  # best = profile here


@pytest.mark.parametrize("eta", [-0.5, 0.0, 0.5, 1.0, 2.0])
def test_pure_dp_gives_eta_plus_two_eps(eta):
  # REFERENCE 9.2 / KRW Cor 5.3: (eta + 2) eps; geometric gives LT's 3 eps.
  ev = acc.RepeatAndSelect(acc.PureDp(0.7), acc.TruncatedNegativeBinomial(eta, mean=10))
  pure = (eta + 2) * 0.7
  assert acc.delta(ev, pure * (1 + 1e-12), method="profile") == 0.0
  # At delta > 0 the bound may sit below (eta + 2) eps, never below what the
  # exact randomized-response profile of a (eta + 2) eps-DP guarantee allows.
  rr = math.log(math.exp(pure) - 1e-8 * (1 + math.exp(pure)))
  assert rr - 1e-12 <= acc.epsilon(ev, 1e-8, method="profile") <= pure + 1e-12
  assert acc.epsilon(ev, 1e-8, method="profile") == pytest.approx(pure, abs=2e-8)


def test_refined_never_looser_and_equal_special_cases():
  for dist in (acc.Geometric(mean=10), acc.Logarithmic(mean=30), acc.TruncatedNegativeBinomial(-0.5, mean=5),
               acc.Poisson(mean=5), acc.Binomial(20, 0.5)):
    ev = acc.RepeatAndSelect(GAUSS4, dist)
    assert acc.epsilon(ev, 1e-6, method="profile-refined") <= acc.epsilon(ev, 1e-6, method="profile") + 1e-12


def test_refined_shift_is_endpoint_max():
  # The linear-fractional ratio's maximum over u in [0, 1] is at an endpoint.
  eta, gamma, eps1, d1 = 1.0, 0.05, 0.4, 1e-3
  u = np.linspace(0, 1, 100001)
  ratio = (gamma + (1 - gamma) * (np.exp(eps1) * u + d1)) / (gamma + (1 - gamma) * u)
  brute = (eta + 1) * np.log(ratio.max())
  got = float(ps.tnb_shift(np.array([eps1]), np.array([d1]), eta, gamma, refined=True)[0])
  assert brute <= got + 1e-12
  assert got == pytest.approx(brute, rel=1e-9)


def test_binomial_tends_to_poisson():
  # REFERENCE 9.2: (n-1) log(1 + p(e^eps1 - 1) + p delta1) -> m(e^eps1 - 1) + m delta1.
  m, eps1, d1 = 10, 0.5, 1e-4
  vals = [float(ps.binomial_shift(np.array([eps1]), np.array([d1]), n, m / n)[0]) for n in (20, 100, 1000, 100000)]
  assert vals == pytest.approx([5.3384, 6.2235, 6.4608, 6.4879], abs=1e-4)
  assert float(ps.poisson_shift(np.array([eps1]), np.array([d1]), m)[0]) == pytest.approx(6.4882, abs=1e-4)
  eps_bin = acc.epsilon(acc.RepeatAndSelect(GAUSS4, acc.Binomial(100000, 1e-4)), 1e-6, method="profile")
  eps_poi = acc.epsilon(acc.RepeatAndSelect(GAUSS4, acc.Poisson(mean=10)), 1e-6, method="profile")
  assert eps_bin == pytest.approx(eps_poi, abs=2e-3)


def test_separable_optimisation():
  # eps_A(delta) = eps_Q(delta/m) + min c(eps1), and delta_A(eps) = m delta_Q(eps - c*).
  dist = acc.Geometric(mean=30)
  base = acc.ProfileAccountant().profile_of(GAUSS4)
  prof, _, eps1, c = ps.select(base, dist)
  assert prof.epsilon(1e-6) == pytest.approx(base.epsilon(1e-6 / 30) + c, abs=1e-9)
  assert prof.delta(2.5) == pytest.approx(30 * base.delta(2.5 - c), rel=1e-12)
  # c* is (close to) the minimum over a fine grid.
  grid = np.linspace(0, 3, 30001)
  fine = ps.tnb_shift(grid, base.delta(grid), 1.0, dist.gamma).min()
  assert c == pytest.approx(fine, abs=1e-6)
  # REFERENCE 4.3: for the Gaussian, eps1* = (-Phi^-1(gamma/(1-gamma)) - 1/(2 sigma)) / sigma.
  from scipy import stats
  want = (-stats.norm.ppf(dist.gamma / (1 - dist.gamma)) - 1 / 8) / 4
  assert eps1 == pytest.approx(want, abs=1e-4)


def test_delta_and_epsilon_are_consistent():
  ev = acc.RepeatAndSelect(GAUSS4, acc.Geometric(mean=10))
  eps = acc.epsilon(ev, 1e-6, method="profile")
  assert acc.delta(ev, eps, method="profile") <= 1e-6 * (1 + 1e-9)
  assert acc.delta(ev, eps - 0.01, method="profile") > 1e-6


def test_fixed_is_not_applicable_and_best_skips_it():
  ev = acc.RepeatAndSelect(GAUSS4, acc.Fixed(3))
  with pytest.raises(acc.NotApplicableError, match="Fixed"):
    acc.epsilon(ev, 1e-6, method="profile")
  # "best" skips it: the minimum over the methods that apply (rdp, composition, pld).
  assert acc.epsilon(ev, 1e-6) == pytest.approx(min(acc.epsilon(ev, 1e-6, method=m)
                                                    for m in ("rdp", "composition", "pld")))
  assert acc.epsilon(ev, 1e-6) <= acc.epsilon(ev, 1e-6, method="rdp")


def test_binomial_p_one_needs_pure_base():
  with pytest.raises(acc.NotApplicableError, match="Thm 5.7"):
    acc.epsilon(acc.RepeatAndSelect(GAUSS4, acc.Binomial(3, 1.0)), 1e-6, method="profile")
  # With a pure base: (n-1) eps + eps = n eps (composition of n pure runs).
  got = acc.epsilon(acc.RepeatAndSelect(acc.PureDp(0.5), acc.Binomial(3, 1.0)), 1e-6, method="profile")
  assert got == pytest.approx(1.5)


def test_best_takes_the_minimum_per_case():
  # Small means favour profiles; Poisson mean 100 with a weak base favours RDP.
  small = acc.RepeatAndSelect(GAUSS4, acc.Geometric(mean=10))
  assert acc.report(small, 1e-6).best_method == "profile"
  weak = acc.RepeatAndSelect(acc.Zcdp(0.1), acc.Poisson(mean=100))
  rep = acc.report(weak, 1e-6)
  by = {r.method: r.epsilon for r in rep.results}
  assert rep.best_method == min((m for m in by if by[m] is not None and m != "profile-refined"), key=by.get)
  for ev in (small, weak):
    assert acc.epsilon(ev, 1e-6) == pytest.approx(acc.report(ev, 1e-6).best_epsilon)


def test_refined_is_opt_in_for_best():
  ev = acc.RepeatAndSelect(GAUSS4, acc.Geometric(mean=10))
  refined = acc.epsilon(ev, 1e-6, method="profile-refined")
  assert acc.epsilon(ev, 1e-6) > refined
  assert acc.epsilon(ev, 1e-6, allow_refined=True) == pytest.approx(refined)
  rep = acc.report(ev, 1e-6)
  assert "profile-refined" in [r.method for r in rep.results] and rep.best_method != "profile-refined"
  assert acc.report(ev, 1e-6, allow_refined=True).best_method == "profile-refined"


def test_nested_and_approx_bases():
  inner = acc.RepeatAndSelect(GAUSS4, acc.Geometric(mean=3))
  ev = acc.RepeatAndSelect(inner, acc.Poisson(mean=3))
  assert acc.epsilon(ev, 1e-6, method="profile") > acc.epsilon(inner, 1e-6, method="profile")
  approx = acc.RepeatAndSelect(acc.ApproxDp(1.0, 1e-8), acc.Geometric(mean=10))
  with pytest.raises(acc.NotApplicableError, match="Renyi"):
    acc.epsilon(approx, 1e-5, method="rdp")
  # KRW Cor 5.4 (derived form): (eps + (eta+1) log(e^eps + (1-gamma)/gamma delta), m delta).
  g = approx.distribution.gamma
  cor54 = 1.0 + 2 * math.log(math.e + (1 - g) / g * 1e-8)
  assert acc.epsilon(approx, 10.001 * 1e-8, method="profile") <= cor54 + 1e-9
  assert acc.epsilon(approx, 1e-5) == acc.epsilon(approx, 1e-5, method="profile")


def test_corollary_6_2():
  dist = acc.Geometric(mean=10)
  base = acc.ProfileAccountant().profile_of(GAUSS4)
  eps1 = 0.3
  got = ps.corollary_6_2(eps1, float(base.delta(eps1)), base.epsilon(1e-6 / 10), dist)
  assert got >= acc.epsilon(acc.RepeatAndSelect(GAUSS4, dist), 1e-6, method="profile") - 1e-9
  # Heterogeneous candidates: the max profile is at least each candidate's.
  mix = profiles.MaxProfile([acc.ProfileAccountant().profile_of(dpa.GaussianDpEvent(s)) for s in (3.0, 4.0)])
  assert mix.epsilon(1e-6) == pytest.approx(acc.ProfileAccountant().profile_of(dpa.GaussianDpEvent(3.0)).epsilon(1e-6))


def test_figures_script_quick(tmp_path):
  import csv as csv_lib
  from jaxdp.experiments import profile_figures
  assert profile_figures.main(["--out", str(tmp_path), "--quick", "--only", "fig1", "fig8"]) == 0
  for name in ("krw_fig1", "krw_fig8"):
    for ext in ("png", "pdf", "csv"):
      assert (tmp_path / f"{name}.{ext}").stat().st_size > 0
    with open(tmp_path / f"{name}.csv") as fh:
      rows = list(csv_lib.DictReader(fh))
    assert rows and all(math.isfinite(float(r["y"])) for r in rows)
  # Fig 1 at m = 10: profile (Thm 3.2) is below RDP (Thm 3.1), REFERENCE 9.5.
  with open(tmp_path / "krw_fig1.csv") as fh:
    rows = [r for r in csv_lib.DictReader(fh) if float(r["x"]) == 10]
  by = {r["series"]: float(r["y"]) for r in rows}
  assert by["profile (Thm 3.2)"] < by["RDP (Thm 3.1)"]


@pytest.mark.slow
def test_figures_script_all_quick(tmp_path):
  from jaxdp.experiments import profile_figures
  assert profile_figures.main(["--out", str(tmp_path), "--quick"]) == 0
  assert len(list(tmp_path.glob("krw_fig*.png"))) == 7
