"""Pure-accounting Figures 2-6 of Papernot & Steinke (ICLR 2022).

"Hyperparameter tuning with Renyi differential privacy": the base algorithm Q
is 0.1-zCDP (a Gaussian mechanism with sigma = sqrt(5) at sensitivity 1), run
K ~ D times with only the best run released. The figures need no training,
only `jaxdp.accounting`:

  * Fig 2: RDP eps'(lambda) vs order for logarithmic K (eta = 0), several E[K].
  * Fig 3: RDP vs order at E[K] = 10 for Poisson and truncated negative
    binomial (TNB) K with eta in {-0.5, 0, 0.5, 1}.
  * Fig 4: eps at delta = 1e-6 vs E[K].
  * Fig 5: expected quantile E[K/(K+1)] vs eps (delta = 1e-6).
  * Fig 6: success probability (each run good w.p. 1/100) vs eps.

Every figure also shows the base algorithm and naive composition (K = k fixed,
all k runs composed). The base is `jaxdp.accounting.Zcdp(0.1)`, so TNB curves
use Theorem 2 together with Corollary 4 (continuous lambda-hat) and Poisson
uses Theorem 6; RDP is converted to (eps, delta) by dp-accounting's
Canonne-Kamath-Steinke conversion. Epsilons use the order grid
1.01..10.99 step 0.01, 11..199.5 step 0.5, 256, 512, 1024. RDP curves are
values at grid points only; the plotted lines join them.

Writes ps_fig{2..6}.{png,pdf,csv} (long-format CSVs) to --out.

Usage (or python -m jaxdp.experiments.analytic_figures):
  python experiments/analytic_figures.py --out figures
  python experiments/analytic_figures.py --out /tmp/psfigs --quick
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import os
import sys
import tempfile
import time
from typing import Callable, Optional, Sequence

import matplotlib.pyplot as plt
import numpy as np

from jaxdp import accounting as acc
from jaxdp.experiments import common

RHO = 0.1
DELTA = 1e-6
P_GOOD = 1.0 / 100.0
BASE = acc.Zcdp(RHO)
BASE_NAME = "jaxdp.accounting.Zcdp(rho=0.1)"


def _hundredths(start: int, stop: int, step: int) -> np.ndarray:
  """Orders start/100 .. stop/100 (inclusive); integer steps avoid float drift."""
  return np.arange(start, stop + 1, step, dtype=np.float64) / 100.0


#: Order grid of REFERENCE.md 9.4, used for every epsilon.
EPS_ORDERS = np.concatenate([_hundredths(101, 1099, 1), _hundredths(1100, 19950, 50),
                             [256.0, 512.0, 1024.0]])
EPS_ORDERS_DESC = "1.01..10.99 step 0.01, 11..199.5 step 0.5, 256, 512, 1024"

#: CSV columns per figure (long format: one row per point of one series).
CURVE_COLUMNS = ("figure", "series", "distribution", "eta", "expected_k", "order",
                 "rdp_epsilon", "theorem", "base", "orders")
COLUMNS = {
    "ps_fig2": CURVE_COLUMNS,
    "ps_fig3": CURVE_COLUMNS,
    "ps_fig4": ("figure", "series", "distribution", "eta", "expected_k", "delta", "epsilon",
                "theorem", "base", "orders"),
    "ps_fig5": ("figure", "series", "distribution", "eta", "expected_k", "delta", "epsilon",
                "expected_quantile", "theorem", "base", "orders"),
    "ps_fig6": ("figure", "series", "distribution", "eta", "expected_k", "delta", "epsilon",
                "p_success_per_run", "success_probability", "theorem", "base", "orders"),
}
FIGURES = tuple(COLUMNS)


@dataclasses.dataclass(frozen=True)
class DistSpec:
  """One family of K distributions, parametrised by its mean.

  Attributes:
    label: legend and CSV `series` name.
    family: CSV `distribution` name.
    eta: TNB shape, None for other families.
    color: matplotlib colour, shared by Figs 3-6.
  """

  label: str
  family: str
  eta: Optional[float]
  color: str

  def make(self, mean: float) -> acc.KDistribution:
    if self.family == "poisson":
      return acc.Poisson(mean=mean)
    return acc.TruncatedNegativeBinomial(self.eta, mean=mean)


DISTRIBUTIONS = (
    DistSpec("Poisson", "poisson", None, "tab:red"),
    DistSpec("TNB eta=-0.5", "truncated_negative_binomial", -0.5, "tab:purple"),
    DistSpec("logarithmic (TNB eta=0)", "truncated_negative_binomial", 0.0, "tab:blue"),
    DistSpec("TNB eta=0.5", "truncated_negative_binomial", 0.5, "tab:cyan"),
    DistSpec("geometric (TNB eta=1)", "truncated_negative_binomial", 1.0, "tab:green"),
)
NAIVE_LABEL = "naive composition (K=k fixed)"
NAIVE_COLOR = "black"
BASE_LABEL = "base: one run, 0.1-zCDP"
BASE_COLOR = "0.45"


@dataclasses.dataclass(frozen=True)
class Config:
  """How many points each figure computes.

  Attributes:
    fig2_means: E[K] values of the logarithmic curves in Fig 2.
    fig2_step: order spacing of Fig 2's curves.
    fig3_step: order spacing of Fig 3's curves.
    means: E[K] values of Figs 4-6 (naive composition uses the integer ones).
  """

  fig2_means: tuple
  fig2_step: float
  fig3_step: float
  means: tuple


def _full_means() -> tuple:
  # Log-spaced integers give smooth lines on Fig 4's log axis and let naive
  # composition (integer k only) be compared at exactly the same E[K].
  grid = np.round(np.geomspace(2.0, 1000.0, 36))
  anchors = [1.5, 2, 5, 10, 20, 50, 100, 200, 500, 1000]
  return tuple(float(m) for m in np.unique(np.concatenate([grid, anchors])))


FULL = Config(fig2_means=(2, 5, 10, 20, 50, 100), fig2_step=0.02, fig3_step=0.05,
              means=_full_means())
QUICK = Config(fig2_means=(2, 10, 100), fig2_step=0.1, fig3_step=0.25,
               means=(1.5, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 1000.0))


def curve_orders(max_order: float, step: float) -> np.ndarray:
  """Dense grid 1.01..max_order, then EPS_ORDERS above it.

  The extra large orders are never plotted: Theorem 2 minimises over lambda-hat
  and Theorem 6 converts RDP to delta-hat over the whole grid, so cutting the
  grid at the plotted range would loosen the plotted bounds.

  Args:
    max_order: largest plotted order.
    step: spacing of the dense part (a multiple of 0.01).

  Returns:
    Sorted orders.
  """
  dense = _hundredths(101, int(round(max_order * 100)), int(round(step * 100)))
  return np.concatenate([dense, EPS_ORDERS[EPS_ORDERS > dense[-1]]])


# ----------------------------------------------------------------------------- rows / io


def _eta_str(eta: Optional[float]) -> str:
  return "" if eta is None else f"{eta:g}"


def _write_csv(path: str, columns: Sequence[str], rows: Sequence[dict]) -> None:
  with open(path, "w", newline="", encoding="utf-8") as fh:
    writer = csv.DictWriter(fh, fieldnames=list(columns), extrasaction="ignore")
    writer.writeheader()
    for row in rows:
      # 10 significant digits: far below any plotted or tested difference, and
      # keeps the dense RDP curves' CSVs small.
      writer.writerow({k: (f"{v:.10g}" if isinstance(v, float) else v) for k, v in row.items()})


def _save(fig, out_dir: str, name: str, rows: Sequence[dict],
          orders_desc: str = EPS_ORDERS_DESC) -> list:
  # Below the axes (negative y in figure coordinates) so it never hides the
  # x label; bbox_inches="tight" grows the saved canvas to include it.
  fig.text(0.01, -0.01, f"base {BASE_NAME}; delta={DELTA:g} where converted\n"
           f"orders: {orders_desc}", fontsize=6, color="0.4", ha="left", va="top")
  paths = [os.path.join(out_dir, f"{name}.{ext}") for ext in ("png", "pdf", "csv")]
  fig.savefig(paths[0], dpi=150, bbox_inches="tight")
  fig.savefig(paths[1], bbox_inches="tight")
  plt.close(fig)
  _write_csv(paths[2], COLUMNS[name], rows)
  return paths


def _curve_rows(figure: str, series: str, family: str, eta: Optional[float], mean,
                orders: np.ndarray, rdp: np.ndarray, theorem: str, orders_desc: str) -> list:
  return [{"figure": figure, "series": series, "distribution": family, "eta": _eta_str(eta),
           "expected_k": "" if mean is None else float(mean), "order": float(o),
           "rdp_epsilon": float(r), "theorem": theorem, "base": BASE_NAME, "orders": orders_desc}
          for o, r in zip(orders, rdp)]


def _rdp(dist: Optional[acc.KDistribution], orders: np.ndarray, method: str = "rdp"):
  event = BASE if dist is None else acc.RepeatAndSelect(BASE, dist)
  return acc.make_accountant(method, orders=orders).compose(event)


def _curve_desc(max_order: float, step: float) -> str:
  return f"1.01..{max_order:g} step {step:g} (+ eps orders above {max_order:g}, not shown)"


# ----------------------------------------------------------------------------- Figs 2, 3


def figure2(cfg: Config, out_dir: str) -> list:
  """Fig 2: logarithmic K, RDP vs order for several E[K], base and naive composition."""
  name, max_order = "ps_fig2", 30.0
  orders = curve_orders(max_order, cfg.fig2_step)
  shown = orders <= max_order + 1e-9
  desc = _curve_desc(max_order, cfg.fig2_step)
  x = orders[shown]
  rows = []
  fig, ax = plt.subplots(figsize=(6.4, 4.6))
  base = _rdp(None, orders)
  rows += _curve_rows(name, BASE_LABEL, "single_run", None, 1, x, base.rdp[shown], base.theorem,
                      desc)
  ax.plot(x, base.rdp[shown], color=BASE_COLOR, lw=2, label=BASE_LABEL)
  colors = plt.get_cmap("viridis")(np.linspace(0.0, 0.9, len(cfg.fig2_means)))
  top = 0.0
  for mean, color in zip(cfg.fig2_means, colors):
    g = _rdp(acc.Logarithmic(mean=mean), orders)
    y = g.rdp[shown]
    top = max(top, float(y.max()))
    rows += _curve_rows(name, f"logarithmic E[K]={mean:g}", "truncated_negative_binomial", 0.0,
                        mean, x, y, g.theorem, desc)
    ax.plot(x, y, color=color, lw=1.8, label=f"logarithmic, E[K]={mean:g}")
  for mean, color in zip(cfg.fig2_means, colors):
    g = _rdp(acc.Fixed(int(mean)), orders, "composition")
    rows += _curve_rows(name, f"naive composition k={int(mean)}", "fixed", None, mean, x,
                        g.rdp[shown], g.theorem, desc)
    ax.plot(x, g.rdp[shown], color=color, lw=1.2, ls="--")
  ax.plot([], [], color="0.2", lw=1.2, ls="--", label="naive composition, k=E[K] (same colour)")
  ax.set_xlim(1.0, max_order)
  # Naive composition grows like k*0.1*lambda; cap the axis so the repeated
  # curves, the point of the figure, stay readable.
  ax.set_ylim(0.0, 1.35 * top)
  ax.set_xlabel(r"Rényi order $\lambda$")
  ax.set_ylabel(r"Rényi DP $\varepsilon'(\lambda)$")
  ax.set_title("PS Fig 2: logarithmic K (Thm 2 + Cor 4), 0.1-zCDP base")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7, loc="upper left")
  return _save(fig, out_dir, name, rows, desc)


def figure3(cfg: Config, out_dir: str) -> list:
  """Fig 3: E[K] = 10, RDP vs order for each distribution, base and naive composition."""
  name, max_order, mean = "ps_fig3", 50.0, 10.0
  orders = curve_orders(max_order, cfg.fig3_step)
  shown = orders <= max_order + 1e-9
  desc = _curve_desc(max_order, cfg.fig3_step)
  x = orders[shown]
  rows = []
  fig, ax = plt.subplots(figsize=(6.4, 4.6))
  base = _rdp(None, orders)
  rows += _curve_rows(name, BASE_LABEL, "single_run", None, 1, x, base.rdp[shown], base.theorem,
                      desc)
  ax.plot(x, base.rdp[shown], color=BASE_COLOR, lw=2, label=BASE_LABEL)
  naive = _rdp(acc.Fixed(int(mean)), orders, "composition")
  rows += _curve_rows(name, f"naive composition k={int(mean)}", "fixed", None, mean, x,
                      naive.rdp[shown], naive.theorem, desc)
  ax.plot(x, naive.rdp[shown], color=NAIVE_COLOR, lw=1.4, ls="--",
          label=f"naive composition, k={int(mean)}")
  top = float(base.rdp[shown].max())
  for spec in DISTRIBUTIONS:
    g = _rdp(spec.make(mean), orders)
    y = g.rdp[shown]
    if spec.family != "poisson":
      top = max(top, float(y.max()))
    rows += _curve_rows(name, spec.label, spec.family, spec.eta, mean, x, y, g.theorem, desc)
    ax.plot(x, y, color=spec.color, lw=1.8, label=f"{spec.label} ({g.theorem})")
  ax.set_xlim(1.0, max_order)
  # Poisson and naive composition blow up at large orders (Thm 6's delta-hat
  # term, and 10x the base); cap where the TNB curves are still visible.
  ax.set_ylim(0.0, 1.5 * top)
  ax.set_xlabel(r"Rényi order $\lambda$")
  ax.set_ylabel(r"Rényi DP $\varepsilon'(\lambda)$")
  ax.set_title("PS Fig 3: E[K]=10, 0.1-zCDP base")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7, loc="upper left")
  return _save(fig, out_dir, name, rows, desc)


# ----------------------------------------------------------------------------- Figs 4, 5, 6


def epsilon_table(cfg: Config) -> list:
  """eps at DELTA, expected quantile and success probability for every series.

  Computed once and shared by Figs 4-6 (they are three views of one sweep).

  Args:
    cfg: which E[K] values to sweep.

  Returns:
    Row dicts (all columns of Figs 4-6), grouped by series, E[K] ascending.
  """
  common = {"delta": DELTA, "base": BASE_NAME, "orders": EPS_ORDERS_DESC,
            "p_success_per_run": P_GOOD}
  rows = []
  single = _rdp(None, EPS_ORDERS)
  rows.append({**common, "series": "single run", "distribution": "single_run", "eta": "",
               "expected_k": 1.0, "epsilon": single.get_epsilon(DELTA), "expected_quantile": 0.5,
               "success_probability": P_GOOD, "theorem": single.theorem})
  for spec in DISTRIBUTIONS:
    for mean in cfg.means:
      if mean <= 1.0 and spec.family != "poisson":
        continue  # TNB needs E[K] > 1.
      dist = spec.make(mean)
      g = _rdp(dist, EPS_ORDERS)
      rows.append({**common, "series": spec.label, "distribution": spec.family,
                   "eta": _eta_str(spec.eta), "expected_k": float(mean),
                   "epsilon": g.get_epsilon(DELTA), "expected_quantile": acc.expected_quantile(dist),
                   "success_probability": acc.success_probability(dist, P_GOOD),
                   "theorem": g.theorem})
  ks = sorted({1} | {int(m) for m in cfg.means if float(m).is_integer()})
  for k in ks:
    dist = acc.Fixed(k)
    g = _rdp(dist, EPS_ORDERS, "composition")
    rows.append({**common, "series": NAIVE_LABEL, "distribution": "fixed", "eta": "",
                 "expected_k": float(k), "epsilon": g.get_epsilon(DELTA),
                 "expected_quantile": acc.expected_quantile(dist),
                 "success_probability": acc.success_probability(dist, P_GOOD),
                 "theorem": g.theorem})
  return rows


def _series(rows: Sequence[dict], label: str, key: str):
  pts = [r for r in rows if r["series"] == label]
  return np.array([r["expected_k"] for r in pts]), np.array([r[key] for r in pts])


def _styles():
  yield from ((s.label, s.color, "-") for s in DISTRIBUTIONS)
  yield NAIVE_LABEL, NAIVE_COLOR, "--"


def _table_rows(rows: Sequence[dict], name: str, with_single: bool) -> list:
  return [{**r, "figure": name} for r in rows if with_single or r["distribution"] != "single_run"]


def figure4(table: Sequence[dict], out_dir: str) -> list:
  """Fig 4: eps at delta = 1e-6 vs E[K] (log x-axis)."""
  name = "ps_fig4"
  fig, ax = plt.subplots(figsize=(6.4, 4.6))
  for label, color, ls in _styles():
    k, eps = _series(table, label, "epsilon")
    ax.plot(k, eps, color=color, ls=ls, lw=1.8, marker="." if len(k) < 12 else None, label=label)
  single = _series(table, "single run", "epsilon")[1][0]
  ax.axhline(single, color=BASE_COLOR, lw=1.2, ls=":", label=f"single run ({single:.3f})")
  ax.set_xscale("log")
  ax.set_yscale("log")  # Poisson and naive grow polynomially, TNB logarithmically.
  ax.set_xlabel("expected number of runs E[K]")
  ax.set_ylabel(r"$\varepsilon$ at $\delta=10^{-6}$")
  ax.set_title("PS Fig 4: privacy vs E[K], 0.1-zCDP base")
  ax.grid(alpha=0.3, which="both")
  ax.legend(fontsize=7, loc="upper left")
  return _save(fig, out_dir, name, _table_rows(table, name, with_single=True))


def _utility_figure(table: Sequence[dict], out_dir: str, name: str, key: str, ylabel: str,
                    title: str, legend_loc: str) -> list:
  fig, ax = plt.subplots(figsize=(6.4, 4.6))
  eps_max = 0.0
  for label, color, ls in _styles():
    _, eps = _series(table, label, "epsilon")
    _, util = _series(table, label, key)
    ax.plot(eps, util, color=color, ls=ls, lw=1.8, marker=".", ms=3, label=label)
    if label != NAIVE_LABEL and label != "Poisson":
      eps_max = max(eps_max, float(eps.max()))
  single = _series(table, "single run", "epsilon")[1][0]
  ax.axvline(single, color=BASE_COLOR, lw=1.0, ls=":", label=f"single run eps ({acc.format_epsilon(single, '.3f')})")
  # Zoom on the range the TNB sweep covers; Poisson and naive composition
  # reach far larger eps for the same E[K] (their full range is in the CSV).
  ax.set_xlim(0.9 * single, 1.1 * eps_max)
  ax.set_ylim(0.0, 1.02)
  ax.set_xlabel(r"$\varepsilon$ at $\delta=10^{-6}$")
  ax.set_ylabel(ylabel)
  ax.set_title(title)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7, loc=legend_loc)
  return _save(fig, out_dir, name, _table_rows(table, name, with_single=False))


def figure5(table: Sequence[dict], out_dir: str) -> list:
  """Fig 5: expected quantile E[K/(K+1)] vs eps."""
  return _utility_figure(table, out_dir, "ps_fig5", "expected_quantile",
                         "expected quantile E[K/(K+1)]",
                         "PS Fig 5: expected quantile vs privacy, 0.1-zCDP base", "lower right")


def figure6(table: Sequence[dict], out_dir: str) -> list:
  """Fig 6: success probability (each run good w.p. 1/100) vs eps."""
  return _utility_figure(table, out_dir, "ps_fig6", "success_probability",
                         "success probability 1 - f(1 - 1/100)",
                         "PS Fig 6: success probability vs privacy, 0.1-zCDP base", "upper left")


# ----------------------------------------------------------------------------- CLI


def _parse_args(argv: Optional[Sequence[str]], prog: str) -> argparse.Namespace:
  parser = argparse.ArgumentParser(
      prog=prog,
      description="Reproduce the pure-accounting Figures 2-6 of Papernot & Steinke (ICLR 2022): "
                  "PNG, PDF and long-format CSV per figure.")
  parser.add_argument("--out", default="figures",
                      help="output directory, created if missing (default: figures)")
  parser.add_argument("--quick", action="store_true",
                      help="fewer E[K] values and coarser order grids for the RDP curves (tests)")
  return parser.parse_args(None if argv is None else [os.fspath(a) for a in argv])


def _check_writable(out_dir: str) -> Optional[str]:
  """None if `out_dir` exists (or was created) and accepts files, else the reason."""
  try:
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=out_dir, prefix=".write-test-"):
      pass
  except OSError as err:
    return str(err)
  return None


def main(argv: Optional[Sequence[str]] = None, prog: str = "python -m jaxdp.experiments.analytic_figures") -> int:
  """Writes ps_fig{2..6}.{png,pdf,csv} to --out.

  Args:
    argv: command-line arguments without the program name; None means sys.argv.
    prog: the command's name in --help.

  Returns:
    0 on success, 2 if the output directory cannot be written.
  """
  args = _parse_args(argv, prog)
  common.use_headless_matplotlib()
  reason = _check_writable(args.out)
  if reason is not None:
    print(f"error: cannot write to --out {args.out!r}: {reason}", file=sys.stderr)
    return 2
  cfg = QUICK if args.quick else FULL
  start = time.perf_counter()
  table = None

  def table_once():
    nonlocal table
    if table is None:
      table = epsilon_table(cfg)
    return table

  steps: list[tuple[str, Callable[[], list]]] = [
      ("ps_fig2", lambda: figure2(cfg, args.out)),
      ("ps_fig3", lambda: figure3(cfg, args.out)),
      ("ps_fig4", lambda: figure4(table_once(), args.out)),
      ("ps_fig5", lambda: figure5(table_once(), args.out)),
      ("ps_fig6", lambda: figure6(table_once(), args.out)),
  ]
  for name, step in steps:
    t0 = time.perf_counter()
    paths = step()
    print(f"[{name}] {time.perf_counter() - t0:6.1f}s  "
          + ", ".join(os.path.basename(p) for p in paths), flush=True)
  print(f"done in {time.perf_counter() - start:.1f}s -> {os.path.abspath(args.out)}", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
