"""Koskela & Kulkarni (NeurIPS 2023), Figure 1: epsilon of tuning on a random subset vs its rate q.

Setting of the paper: each candidate is DP-SGD with sampling rate gamma = 0.01,
sigma = 2 and 50 epochs (T = 5000 steps); the private random search draws
K ~ Poisson(mu) candidates (Papernot & Steinke Thm 6), mu in {15, 45}, and
releases the best; delta = 1e-5; RDP on the integer orders 2..128. Curves:

  * baseline: Papernot-Steinke random search on all the data (flat in q);
  * variant 1: tune on X1 ~ Poisson(q), train the final model on X \\ X1
    (KK Thm 1);
  * variant 2: tune on X1, train the final model on all of X (Zhu-Wang
    subsampled RDP of the tuning, composed with the final run).

All three use `acc.epsilon(..., method="rdp")` (the paper's bounds). The CSV
also holds `method="best"` values, where privacy-profile bounds may be
tighter for the baseline; the figure draws the baseline's as a dotted line.

Writes kk_fig1.{png,pdf,csv} to --out.

  python experiments/kk_fig1.py --out figures [--quick]   (or python -m jaxdp.experiments.kk_fig1)
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from typing import Optional, Sequence

import numpy as np

from jaxdp.experiments import common

DELTA = 1e-5
GAMMA = 0.01
SIGMA = 2.0
EPOCHS = 50
MUS = (15, 45)
ORDERS = np.arange(2, 129, dtype=np.float64)
Q_FULL = tuple(sorted({round(float(q), 4) for q in np.linspace(0.01, 0.5, 50)} | {0.005, 0.05, 0.1}))
Q_QUICK = (0.01, 0.05, 0.1, 0.2, 0.3, 0.5)
CSV_COLUMNS = ("mu", "q", "curve", "method", "epsilon")


def candidate_event():
  """One candidate: DP-SGD with gamma = 0.01, sigma = 2, 50 epochs (T = 5000)."""
  from jaxdp import accounting as acc  # pylint: disable=g-import-not-at-top
  return acc.dpsgd_event(GAMMA, SIGMA, int(round(EPOCHS / GAMMA)))


def rows_for(qs: Sequence[float]) -> list:
  """Epsilon of the baseline and both variants for every mu and q (long format)."""
  from jaxdp import accounting as acc  # pylint: disable=g-import-not-at-top
  base = candidate_event()
  rows = []
  for mu in MUS:
    search = acc.RepeatAndSelect(base, acc.Poisson(mean=mu))
    baseline = {m: acc.epsilon(search, DELTA, m, ORDERS) for m in ("rdp", "best")}
    for q in qs:
      for method in ("rdp", "best"):
        rows.append(dict(mu=mu, q=q, curve="baseline", method=method, epsilon=baseline[method]))
        for variant in (1, 2):
          ev = acc.SubsampledTuning(tune=search, final=base, q=q, variant=variant)
          rows.append(dict(mu=mu, q=q, curve=f"variant {variant}", method=method,
                           epsilon=acc.epsilon(ev, DELTA, method, ORDERS)))
  return rows


def plot(rows: list, single_run: float, path_base: str) -> None:
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(1, len(MUS), figsize=(5.2 * len(MUS), 4.2))
  styles = {"baseline": ("k", "-"), "variant 1": ("tab:blue", "-"), "variant 2": ("tab:orange", "-")}
  for ax, mu in zip(np.atleast_1d(axes), MUS):
    for curve, (color, ls) in styles.items():
      pts = sorted((r for r in rows if r["mu"] == mu and r["curve"] == curve and r["method"] == "rdp"),
                   key=lambda r: r["q"])
      ax.plot([r["q"] for r in pts], [r["epsilon"] for r in pts], ls, color=color, marker="o", ms=2.5,
              label=curve + (" (PS, all data)" if curve == "baseline" else ""))
    best = [r["epsilon"] for r in rows if r["mu"] == mu and r["curve"] == "baseline" and r["method"] == "best"]
    ax.axhline(best[0], color="k", ls=":", lw=1, label='baseline, method="best"')
    ax.axhline(single_run, color="gray", ls="--", lw=1, label="one training run")
    ax.set_xlabel("subset sampling rate q")
    ax.set_ylabel(f"epsilon (delta = {DELTA:g})")
    ax.set_title(f"K ~ Poisson({mu})", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  fig.suptitle(f"Koskela & Kulkarni Fig. 1: DP-SGD gamma={GAMMA}, sigma={SIGMA:g}, {EPOCHS} epochs, "
               "RDP orders 2..128", fontsize=10)
  fig.tight_layout()
  fig.savefig(path_base + ".png", dpi=130)
  fig.savefig(path_base + ".pdf")
  plt.close(fig)


def main(argv: Optional[Sequence[str]] = None, prog: str = "python -m jaxdp.experiments.kk_fig1") -> int:
  """Writes kk_fig1.{png,pdf,csv} to --out; returns 0, or 2 for an unwritable --out."""
  parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
  parser.add_argument("--out", default="figures", help="output directory (default: figures)")
  parser.add_argument("--quick", action="store_true", help=f"only q in {Q_QUICK} (for tests)")
  args = parser.parse_args(argv)
  try:
    out = common.check_writable_dir(args.out)
  except common.UsageError as err:
    print(f"error: {err}", file=sys.stderr)
    return 2
  common.use_headless_matplotlib()
  from jaxdp import accounting as acc  # pylint: disable=g-import-not-at-top
  start = time.perf_counter()
  rows = rows_for(Q_QUICK if args.quick else Q_FULL)
  single = acc.epsilon(candidate_event(), DELTA, "rdp", ORDERS)
  with common.staged_outputs(out) as stage:
    with open(os.path.join(stage, "kk_fig1.csv"), "w", newline="") as f:
      writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
      writer.writeheader()
      writer.writerows(rows)
    plot(rows, single, os.path.join(stage, "kk_fig1"))
  at = {(r["mu"], r["q"], r["curve"]): r["epsilon"] for r in rows if r["method"] == "rdp"}
  if (15, 0.1, "baseline") in at:
    print(f"mu=15, q=0.1: baseline {at[(15, 0.1, 'baseline')]:.4f}, variant 1 {at[(15, 0.1, 'variant 1')]:.4f}, "
          f"variant 2 {at[(15, 0.1, 'variant 2')]:.4f} (one run {single:.4f})")
  print(f"wrote {os.path.join(out, 'kk_fig1.png')} (+ .pdf, .csv) in {time.perf_counter() - start:.1f} s")
  return 0


if __name__ == "__main__":
  sys.exit(main())
