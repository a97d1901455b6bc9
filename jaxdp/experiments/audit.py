"""Empirical lower bound <= exact <= accounted epsilon of whole private searches.

Each scenario runs the complete private random search (draw K, train K
candidates with DP-SGD, release the best) many times on neighbouring data
sets D and D' = D + canary (`jaxdp.audit.audit_search`) and turns a
statistic of the release into a lower bound on epsilon with exact
Clopper-Pearson intervals. Scenarios:

  * the worst-case selection gadget (`jaxdp.audit.attacks.selection_gadget`)
    under several laws of K (Poisson, geometric, logarithmic, fixed), with
    the exact likelihood ratio of the release as its statistic; its exact
    epsilon (`jaxdp.audit.exact.GadgetProfile`, a bracket [lo, hi] whose
    upper end is reported) says how much each accounting method wastes
    (accounted / exact) and how close the audit comes (lower / exact);
  * the same search without noise (not private: it must show leakage);
  * a realistic search: DP-SGD logistic regression whose learning rate is
    tuned on breast-cancer data with/without an outlier (no exact value).

A lower bound above the exact epsilon (its upper end), or an exact epsilon
(its lower end) or a lower bound above an accounted one, would be a bug (in
the accountant or the implementation); the script then says so on stderr and
exits with 3.

Writes audit.{png,pdf,csv,json} to --out.

  python experiments/audit.py --profile quick --out figures   (or `jaxdp audit ...` in a clone)

The profiles (`quick`, `full`: how many searches per data set) are defined in
the repository's experiments/audit.py, the script that runs this pipeline on
them; `jaxdp audit` and `python -m jaxdp.experiments.audit` read them from
there (`PROFILES` below).
"""

from __future__ import annotations

import csv
import dataclasses
import math
import os
import sys
import time
from typing import Optional, Sequence

from jaxdp.experiments import common

DELTA = 1e-5
CONFIDENCE = 0.95
MEAN_K = 4


@dataclasses.dataclass(frozen=True)
class Profile:
  gadget_trials: int
  outlier_trials: int
  gadget_sigma: float
  outlier_sigma: float


def __getattr__(name: str):
  # The profiles are the audit's configuration: defined once, beside its launch script in the
  # repository's experiments/ (which the wheel does not ship), and read from there on first use.
  if name == "PROFILES":
    return common.figure_profiles("audit")
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


METHODS = ("rdp", "profile", "best")
CSV_COLUMNS = ("scenario", "distribution", "trials", "confidence", "delta", "lower_bound",
               "exact_epsilon", "exact_epsilon_lo", "accounted_rdp", "accounted_profile", "accounted_best", "tpr", "fpr",
               "candidates_trained", "seconds")


def scenarios(profile: Profile) -> list:
  """(label, attack, K law, trials) of every audited search."""
  from jaxdp import accounting as acc  # pylint: disable=g-import-not-at-top
  from jaxdp.audit import attacks  # pylint: disable=g-import-not-at-top
  laws = [("Poisson(4)", acc.Poisson(mean=MEAN_K)), ("geometric(4)", acc.Geometric(mean=MEAN_K)),
          ("logarithmic(4)", acc.Logarithmic(mean=MEAN_K)), ("fixed(4)", acc.Fixed(MEAN_K))]
  out = [(f"gadget, K ~ {name}", attacks.selection_gadget(profile.gadget_sigma, distribution=law), law,
          profile.gadget_trials) for name, law in laws]
  import warnings  # pylint: disable=g-import-not-at-top
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # sigma = 0 is the point here: the non-private baseline
    out.append(("gadget, no noise (non-private)", attacks.selection_gadget(0.0), acc.Poisson(mean=MEAN_K),
                profile.gadget_trials))
  out.append(("outlier lr tuning, K ~ Poisson(4)", attacks.outlier_lr_tuning(profile.outlier_sigma),
              acc.Poisson(mean=MEAN_K), profile.outlier_trials))
  return out


def exact_epsilon(attack, law) -> tuple:
  """(lo, hi) bracketing the search's true epsilon at DELTA: the gadget's (inf without noise),
  (nan, nan) where no exact computation exists."""
  from jaxdp.audit import exact  # pylint: disable=g-import-not-at-top
  if not attack.name.startswith("selection gadget"):
    return math.nan, math.nan
  sigma = attack.config.noise_multiplier
  return exact.GadgetProfile(sigma, law, arms=len(attack.grid["arm"])).epsilon(DELTA)


def run(profile: Profile, progress: bool = True) -> list:
  """Audits every scenario; returns one CSV row per scenario."""
  import jax  # pylint: disable=g-import-not-at-top
  from jaxdp import accounting as acc  # pylint: disable=g-import-not-at-top
  from jaxdp.audit import audit_search  # pylint: disable=g-import-not-at-top
  from jaxdp.tuning import LocalTrainer, RunConfig  # pylint: disable=g-import-not-at-top
  rows = []
  for i, (label, attack, law, trials) in enumerate(scenarios(profile)):
    res = audit_search(attack.config, attack.grid, attack.without, attack.with_, distribution=law,
                       statistic=attack.statistic, trials=trials, key=jax.random.key(i),
                       target_delta=DELTA, confidence=CONFIDENCE, progress=progress,
                       run_config=RunConfig(trainer=LocalTrainer(max_candidates_per_device=4096)))
    lo, hi = exact_epsilon(attack, law)
    rows.append(dict(scenario=label, distribution=repr(law), trials=trials, confidence=CONFIDENCE,
                     delta=DELTA, lower_bound=res.bound.epsilon, exact_epsilon=hi, exact_epsilon_lo=lo,
                     **{f"accounted_{m}": res.accounted[m] for m in METHODS}, tpr=res.bound.tpr,
                     fpr=res.bound.fpr, candidates_trained=res.candidates_trained,
                     seconds=round(res.wall_time_s, 2)))
    # The upper bounds print rounded up (acc.format_epsilon); the attack's lower bound as is.
    up = lambda v: acc.format_epsilon(v, ".3f")
    print(f"{label}: lower bound {res.bound.epsilon:.3f} <= exact {up(hi)} <= accounted best "
          f"{up(res.accounted['best'])} (rdp {up(res.accounted['rdp'])}); {trials} searches per data set, "
          f"{res.candidates_trained} candidates, {res.wall_time_s:.1f} s", flush=True)
  return rows


def violations(rows: list) -> list:
  """(scenario, why) for every row that breaks lower <= exact <= accounted: each is a bug.

  Only certain breaks count: the lower bound against the exact bracket's
  upper end, the bracket's lower end against each accounted epsilon (NaN:
  no theorem, or no exact value), with a relative 1e-9 for float rounding.
  """
  out = []
  above = lambda a, b: not (math.isnan(a) or math.isnan(b)) and a > b * (1 + 1e-9)
  for r in rows:
    if above(r["lower_bound"], r["exact_epsilon"]):
      out.append((r["scenario"], f"lower bound {r['lower_bound']:.4g} > exact {r['exact_epsilon']:.4g}"))
    for m in METHODS:
      accounted = r[f"accounted_{m}"]
      if above(r["exact_epsilon_lo"], accounted):
        out.append((r["scenario"], f"exact {r['exact_epsilon_lo']:.4g} > accounted {m} {accounted:.4g}"))
      if above(r["lower_bound"], accounted):
        out.append((r["scenario"], f"lower bound {r['lower_bound']:.4g} > accounted {m} {accounted:.4g}"))
  return out


def plot(rows: list, path_base: str) -> None:
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  fig, ax = plt.subplots(figsize=(11, 4.6))
  y = np.arange(len(rows))[::-1]
  ax.barh(y, [r["lower_bound"] for r in rows], color="tab:red", alpha=0.7,
          label=f"empirical lower bound ({CONFIDENCE:.0%} confidence)")
  finite = [r[key] for r in rows for key in [f"accounted_{m}" for m in METHODS] + ["exact_epsilon"]
            if np.isfinite(r[key])]  # inf: not private; NaN: no theorem / no exact value
  cap = 1.15 * max(finite + [r["lower_bound"] for r in rows])
  for key, label, marker, color in (("accounted_rdp", "accounted (rdp)", "s", "tab:blue"),
                                    ("accounted_profile", "accounted (profile)", "^", "tab:green"),
                                    ("accounted_best", "accounted (best)", "o", "k"),
                                    ("exact_epsilon", "exact (the gadget's privacy profile)", "D", "tab:purple")):
    method = key
    vals = [r[key] for r in rows]
    shown = [v if np.isfinite(v) else cap for v in vals]
    keep = [i for i, v in enumerate(vals) if not np.isnan(v)]
    ax.scatter([shown[i] for i in keep], y[keep], marker=marker, color=color, zorder=3, label=label)
    for v, yy in zip(vals, y):
      if np.isinf(v) and method == "accounted_best":
        ax.annotate("accounted: inf", (cap, yy), xytext=(-70, 6), textcoords="offset points", fontsize=8)
  ax.set_yticks(y)
  ax.set_yticklabels([r["scenario"] for r in rows], fontsize=8)
  ax.set_xlabel(f"epsilon at delta = {DELTA:g}")
  ax.set_xlim(0, cap * 1.02)
  ax.grid(axis="x", alpha=0.3)
  ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
  ax.set_title("Empirical lower bound <= exact <= accounted epsilon of the whole private search",
               fontsize=10)
  fig.tight_layout()
  fig.savefig(path_base + ".png", dpi=130)
  fig.savefig(path_base + ".pdf")
  plt.close(fig)


def main(argv: Optional[Sequence[str]] = None, profiles: Optional[dict] = None, prog: str = "jaxdp audit") -> int:
  """Writes audit.{png,pdf,csv,json} for `profiles[--profile]` (default: experiments/audit.py's);
  returns 0, 2 for bad arguments, 3 if a bound is violated."""
  import argparse  # pylint: disable=g-import-not-at-top
  try:
    profiles = common.figure_profiles("audit") if profiles is None else profiles
  except common.UsageError as err:
    print(f"error: {err}", file=sys.stderr)
    return 2
  parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter,
                                   epilog=__doc__.split("\n\n", 1)[1])
  parser.add_argument("--profile", default="quick", choices=sorted(profiles),
                      help="; ".join(f"{name}: {p.gadget_trials:,} searches per data set for each gadget "
                                     f"scenario and {p.outlier_trials:,} for the realistic one"
                                     for name, p in profiles.items()) + " (experiments/audit.py)")
  parser.add_argument("--out", default="figures", help="output directory (default: figures)")
  parser.add_argument("--no-progress", action="store_true", help="no progress bars")
  args = parser.parse_args(argv)
  try:
    out = common.check_writable_dir(args.out)
  except common.UsageError as err:
    print(f"error: {err}", file=sys.stderr)
    return 2
  common.expose_host_devices()
  common.use_headless_matplotlib()
  start = time.perf_counter()
  rows = run(profiles[args.profile], progress=not args.no_progress)
  broken = violations(rows)
  with common.staged_outputs(out) as stage:
    with open(os.path.join(stage, "audit.csv"), "w", newline="") as f:
      writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
      writer.writeheader()
      writer.writerows(rows)
    common.write_json(os.path.join(stage, "audit.json"), {
        "profile": args.profile, "rows": rows,
        "violations": [{"scenario": name, "why": why} for name, why in broken],
        "seconds": round(time.perf_counter() - start, 1), "versions": common.package_versions(),
        "devices": common.device_list()})
    plot(rows, os.path.join(stage, "audit"))
  print(f"wrote {os.path.join(out, 'audit.png')} (+ .pdf, .csv, .json) in {time.perf_counter() - start:.1f} s")
  if broken:
    print("AUDIT VIOLATION: lower bound <= exact <= accounted epsilon fails: "
          + "; ".join(f"{name}: {why}" for name, why in broken)
          + ". This is a bug in jaxdp's accounting or training; please report it with audit.json.",
          file=sys.stderr)
    return 3
  return 0


if __name__ == "__main__":
  sys.exit(main())
