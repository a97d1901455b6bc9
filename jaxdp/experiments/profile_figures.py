"""Pure-accounting figures of Koskela, Redberg & Wang (ICML 2024), "Privacy
profiles for private selection": privacy-profile (hockey-stick) bounds versus
the RDP bounds they improve on. No training, only `jaxdp.accounting`.

  * krw_fig1: Report Noisy Max of Gaussians (sigma = 4), delta = 1e-6: eps vs
    number of candidates m: RDP Thm 3.1 vs profile Thm 3.2 vs Cor 3.4.
  * krw_fig2: geometric K, Gaussian base sigma = 4: delta(eps) for
    m in {30, 300, 3000}: profile Thm 5.2 vs RDP Thm 5.1 (= PS Thm 2).
  * krw_fig3: same setting, eps at delta = 1e-6 vs m (10..1e5), with the
    refined Thm 5.2 ("profile-refined", derived in jaxdp).
  * krw_fig4: m = 10, Gaussian sigma = 4: eps vs delta for RDP Thm 5.6
    (Poisson), profile Cor 5.8 (Poisson) and Thm 5.7 (Binomial(n, m/n),
    n in {15, 20, 1000}); second panel: CDFs of K.
  * krw_fig6: DP-SGD (q = 256/60000, sigma = 1.1, T = 60/q = 14063 steps),
    eps at delta = 1e-5 vs m in 1..30, geometric and Poisson, RDP vs profile.
  * krw_fig7: De et al. (q = 16384/50000, sigma = 21.1, T = 250), geometric,
    eps at delta = 1e-5 vs m in 1..1e4.
  * krw_fig8: tuning sigma in {2, 3, 4} with q = 0.01 and T = 4000 / 10000 /
    18000 (each ~ (1.5, 1e-6)-DP by PLD), geometric K, delta = 1e-6: KRW
    Cor 6.2 with the threshold procedure (a Gaussian calibrated to exactly
    (1.5, 1e-6)) vs Thm 5.2 on the max of the candidates' own PLD profiles.

Profiles of DP-SGD come from dp-accounting's PLD accountant with pessimistic
(connect-the-dots) discretisation 1e-4. Writes krw_fig*.{png,pdf,csv}
(long-format CSV: figure, series, x, y) to --out.

Usage (or python -m jaxdp.experiments.profile_figures):
  python experiments/profile_figures.py --out figures
  python experiments/profile_figures.py --out /tmp/krw --quick
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
import time
from typing import Optional, Sequence

import matplotlib.pyplot as plt
import numpy as np
from scipy import optimize

import dp_accounting as dpa
from jaxdp import accounting as acc
from jaxdp.accounting import profile_selection as ps
from jaxdp.accounting import profiles
from jaxdp.experiments import common

GAUSS4 = dpa.GaussianDpEvent(4.0)


class _Figure:
  """Collects (series, x, y) rows and writes PNG + PDF + CSV."""

  def __init__(self, name: str, ncols: int = 1):
    self.name = name
    self.fig, axes = plt.subplots(1, ncols, figsize=(5.5 * ncols, 4.0))
    self.axes = np.atleast_1d(axes)
    self.rows = []

  def line(self, ax_index: int, series: str, x, y, **kwargs):
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    self.axes[ax_index].plot(x, y, label=series, **kwargs)
    self.rows.extend((self.name, series, float(a), float(b)) for a, b in zip(x, y))

  def save(self, out: str) -> list:
    for ax in self.axes:
      if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
      ax.grid(alpha=0.3)
    self.fig.tight_layout()
    paths = [os.path.join(out, f"{self.name}.{ext}") for ext in ("png", "pdf", "csv")]
    self.fig.savefig(paths[0], dpi=150)
    self.fig.savefig(paths[1])
    plt.close(self.fig)
    with open(paths[2], "w", newline="") as fh:
      writer = csv.writer(fh)
      writer.writerow(["figure", "series", "x", "y"])
      writer.writerows(self.rows)
    return paths


def _eps(event, delta, method):
  try:
    return acc.epsilon(event, delta, method=method)
  except acc.NotApplicableError:
    return math.nan


def fig1(quick: bool) -> _Figure:
  f = _Figure("krw_fig1")
  ms = np.unique(np.logspace(1, 5, 5 if quick else 17).round().astype(int))
  delta = 1e-6
  f.line(0, "RDP (Thm 3.1)", ms, [_eps(acc.ReportNoisyMax(4.0, int(m)), delta, "rdp") for m in ms])
  f.line(0, "profile (Thm 3.2)", ms, [_eps(acc.ReportNoisyMax(4.0, int(m)), delta, "profile") for m in ms])
  # Cor 3.4: eps = 2/sigma^2 + (2/sigma) sqrt(2 log(m/delta)).
  f.line(0, "Cor 3.4", ms, [2 / 16 + 0.5 * math.sqrt(2 * math.log(m / delta)) for m in ms], ls="--")
  ax = f.axes[0]
  ax.set(xscale="log", xlabel="number of candidates m", ylabel="epsilon (delta = 1e-6)",
         title="Report Noisy Max, Gaussian sigma = 4")
  return f


def fig2(quick: bool) -> _Figure:
  f = _Figure("krw_fig2")
  eps_grid = np.linspace(0.0, 4.0, 9 if quick else 81)
  for m in (30, 300, 3000):
    ev = acc.RepeatAndSelect(GAUSS4, acc.Geometric(mean=m))
    f.line(0, f"profile Thm 5.2, m={m}", eps_grid, [acc.delta(ev, e, method="profile") for e in eps_grid])
    f.line(0, f"RDP Thm 5.1, m={m}", eps_grid, [acc.delta(ev, e, method="rdp") for e in eps_grid], ls="--")
  f.axes[0].set(yscale="log", ylim=(1e-12, 1.5), xlabel="epsilon", ylabel="delta(epsilon)",
                title="Geometric K, Gaussian base sigma = 4")
  return f


def fig3(quick: bool) -> _Figure:
  f = _Figure("krw_fig3")
  ms = np.unique(np.logspace(1, 5, 5 if quick else 17))
  delta = 1e-6
  for method, label in (("rdp", "RDP Thm 5.1"), ("profile", "profile Thm 5.2"),
                        ("profile-refined", "profile Thm 5.2 refined (jaxdp)")):
    f.line(0, label, ms, [_eps(acc.RepeatAndSelect(GAUSS4, acc.Geometric(mean=m)), delta, method) for m in ms])
  f.axes[0].set(xscale="log", xlabel="E[K] (geometric)", ylabel="epsilon (delta = 1e-6)",
                title="Geometric K, Gaussian base sigma = 4")
  return f


def fig4(quick: bool) -> _Figure:
  f = _Figure("krw_fig4", ncols=2)
  deltas = np.logspace(-10, -3, 5 if quick else 29)
  m = 10
  series = [("RDP Thm 5.6, Poisson", acc.Poisson(mean=m), "rdp"),
            ("profile Cor 5.8, Poisson", acc.Poisson(mean=m), "profile")]
  series += [(f"profile Thm 5.7, Bin({n}, {m}/{n})", acc.Binomial(n, m / n), "profile") for n in (15, 20, 1000)]
  for label, dist, method in series:
    f.line(0, label, deltas, [_eps(acc.RepeatAndSelect(GAUSS4, dist), d, method) for d in deltas])
  f.axes[0].set(xscale="log", xlabel="delta", ylabel="epsilon", title="E[K] = 10, Gaussian sigma = 4")
  ks = np.arange(0, 41)
  for label, dist in (("Poisson(10)", acc.Poisson(mean=m)),) + tuple(
      (f"Bin({n}, {m}/{n})", acc.Binomial(n, m / n)) for n in (15, 20, 1000)):
    f.line(1, label, ks, np.cumsum(dist.pmf(ks)), drawstyle="steps-post")
  f.axes[1].set(xlabel="k", ylabel="P[K <= k]", title="CDFs of K")
  return f


def _vs_mean(f, base, ms, delta, dists):
  for fam, make in dists:
    for method, ls in (("rdp", "--"), ("profile", "-")):
      f.line(0, f"{'RDP' if method == 'rdp' else 'profile'}, {fam}", ms,
             [_eps(acc.RepeatAndSelect(base, make(m)), delta, method) for m in ms], ls=ls)


def fig6(quick: bool) -> _Figure:
  f = _Figure("krw_fig6")
  base = acc.dpsgd_event(256 / 60000, 1.1, math.ceil(60 * 60000 / 256))
  ms = np.array([1.5, 5, 10, 30]) if quick else np.linspace(1.5, 30, 20)
  _vs_mean(f, base, ms, 1e-5, (("geometric", lambda m: acc.Geometric(mean=m)),
                               ("Poisson", lambda m: acc.Poisson(mean=m))))
  f.axes[0].set(xlabel="E[K]", ylabel="epsilon (delta = 1e-5)",
                title="DP-SGD q=256/60000, sigma=1.1, T=14063")
  return f


def fig7(quick: bool) -> _Figure:
  f = _Figure("krw_fig7")
  base = acc.dpsgd_event(16384 / 50000, 21.1, 250)
  ms = np.logspace(0.1, 4, 4 if quick else 17)
  _vs_mean(f, base, ms, 1e-5, (("geometric", lambda m: acc.Geometric(mean=m)),))
  f.line(0, "profile-refined, geometric", ms,
         [_eps(acc.RepeatAndSelect(base, acc.Geometric(mean=m)), 1e-5, "profile-refined") for m in ms], ls=":")
  f.axes[0].set(xscale="log", xlabel="E[K] (geometric)", ylabel="epsilon (delta = 1e-5)",
                title="De et al.: q=16384/50000, sigma=21.1, T=250")
  return f


def _gaussian_mu_for(eps: float, delta: float) -> float:
  """mu = Delta/sigma of the Gaussian mechanism that is exactly (eps, delta)-DP."""
  fun = lambda mu: math.log(max(profiles.GaussianProfile(mu).delta(eps), 1e-300)) - math.log(delta)
  return optimize.brentq(fun, 1e-2, 20.0, xtol=1e-14)


def fig8(quick: bool) -> _Figure:
  f = _Figure("krw_fig8")
  delta, eps_q = 1e-6, 1.5
  ms = np.logspace(0.5, 4, 4 if quick else 15)
  # Threshold procedure (KRW 6.2): a Gaussian exactly (1.5, 1e-6)-DP stands in for every candidate.
  calib = profiles.GaussianProfile(_gaussian_mu_for(eps_q, delta))
  cands = [(2.0, 4000), (3.0, 10000), (4.0, 18000)]
  if quick:
    cands = [(2.0, 400), (3.0, 1000), (4.0, 1800)]
  mix = profiles.MaxProfile([acc.ProfileAccountant().profile_of(acc.dpsgd_event(0.01, s, t)) for s, t in cands])
  cor62, thm52 = [], []
  for m in ms:
    dist = acc.Geometric(mean=m)
    _, _, eps1, c = ps.select(calib, dist)
    cor62.append(ps.corollary_6_2(eps1, float(calib.delta(eps1)), calib.epsilon(delta / dist.mean), dist))
    prof, _, _, _ = ps.select(mix, dist)
    thm52.append(prof.epsilon(delta))
  f.line(0, "Cor 6.2 (threshold procedure)", ms, cor62)
  f.line(0, "Thm 5.2 on max of candidates' PLD profiles", ms, thm52, ls="--")
  f.axes[0].set(xscale="log", xlabel="E[K] (geometric)", ylabel="epsilon (delta = 1e-6)",
                title="Tuning sigma in {2,3,4}, q = 0.01, eps_Q = 1.5")
  return f


FIGURES = {"fig1": fig1, "fig2": fig2, "fig3": fig3, "fig4": fig4, "fig6": fig6, "fig7": fig7, "fig8": fig8}


def main(argv: Optional[Sequence[str]] = None, prog: str = "python -m jaxdp.experiments.profile_figures") -> int:
  parser = argparse.ArgumentParser(
      prog=prog,
      description="Accounting-only figures of Koskela, Redberg & Wang (ICML 2024): "
                  "privacy-profile vs RDP bounds for private selection.")
  parser.add_argument("--out", default="figures", help="output directory (created if missing)")
  parser.add_argument("--quick", action="store_true",
                      help="few points per curve and shorter DP-SGD runs in fig 8 (for tests)")
  parser.add_argument("--only", nargs="*", choices=sorted(FIGURES), help="make only these figures")
  args = parser.parse_args(argv)
  common.use_headless_matplotlib()
  os.makedirs(args.out, exist_ok=True)
  for name in args.only or FIGURES:
    t0 = time.perf_counter()
    paths = FIGURES[name](args.quick).save(args.out)
    print(f"{name}: {', '.join(paths)} ({time.perf_counter() - t0:.1f} s)", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
