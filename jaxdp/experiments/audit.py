"""Empirical epsilon lower bound vs accounted epsilon of whole private searches.

Each scenario runs the complete private random search (draw K, train K
candidates with DP-SGD, release the best) many times on neighbouring data
sets D and D' = D + canary (`jaxdp.audit.audit_search`) and turns a
statistic of the release into a lower bound on epsilon with exact
Clopper-Pearson intervals. Scenarios:

  * the worst-case selection gadget (`jaxdp.audit.attacks.selection_gadget`)
    under several laws of K (Poisson, geometric, logarithmic, fixed);
  * the same search without noise (not private: it must show leakage);
  * a realistic search: DP-SGD logistic regression whose learning rate is
    tuned on breast-cancer data with/without an outlier.

A lower bound above an accounted epsilon would be a bug (in the accountant or
the implementation); the script then says so on stderr and exits with 3.

Writes audit.{png,pdf,csv,json} to --out.

  python -m jaxdp.experiments.audit --profile quick --out figures
"""

from __future__ import annotations

import csv
import dataclasses
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


PROFILES = {
    "quick": Profile(gadget_trials=2000, outlier_trials=200, gadget_sigma=0.5, outlier_sigma=1.0),
    "full": Profile(gadget_trials=20000, outlier_trials=2000, gadget_sigma=0.5, outlier_sigma=1.0),
}
CSV_COLUMNS = ("scenario", "repetitions", "trials", "confidence", "delta", "lower_bound", "tpr", "fpr",
               "accounted_rdp", "accounted_profile", "accounted_best", "candidates_trained", "seconds")


def scenarios(profile: Profile) -> list:
  """(label, attack, K law, trials) of every audited search."""
  from jaxdp import accounting as acc  # pylint: disable=g-import-not-at-top
  from jaxdp.audit import attacks  # pylint: disable=g-import-not-at-top
  gadget = attacks.selection_gadget(profile.gadget_sigma)
  laws = [("Poisson(4)", acc.Poisson(mean=MEAN_K)), ("geometric(4)", acc.Geometric(mean=MEAN_K)),
          ("logarithmic(4)", acc.Logarithmic(mean=MEAN_K)), ("fixed(4)", acc.Fixed(MEAN_K))]
  out = [(f"gadget, K ~ {name}", gadget, law, profile.gadget_trials) for name, law in laws]
  import warnings  # pylint: disable=g-import-not-at-top
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # sigma = 0 is the point here: the non-private baseline
    out.append(("gadget, no noise (non-private)", attacks.selection_gadget(0.0), acc.Poisson(mean=MEAN_K),
                profile.gadget_trials))
  out.append(("outlier lr tuning, K ~ Poisson(4)", attacks.outlier_lr_tuning(profile.outlier_sigma),
              acc.Poisson(mean=MEAN_K), profile.outlier_trials))
  return out


def run(profile: Profile, progress: bool = True) -> list:
  """Audits every scenario; returns one CSV row per scenario."""
  import jax  # pylint: disable=g-import-not-at-top
  from jaxdp.audit import audit_search  # pylint: disable=g-import-not-at-top
  rows = []
  for i, (label, attack, law, trials) in enumerate(scenarios(profile)):
    res = audit_search(attack.config, attack.grid, attack.without, attack.with_, repetitions=law,
                       statistic=attack.statistic, trials=trials, key=jax.random.key(i), delta=DELTA,
                       confidence=CONFIDENCE, progress=progress, max_candidates_per_device=64)
    rows.append(dict(scenario=label, repetitions=repr(law), trials=trials, confidence=CONFIDENCE,
                     delta=DELTA, lower_bound=res.bound.epsilon, tpr=res.bound.tpr, fpr=res.bound.fpr,
                     accounted_rdp=res.accounted["rdp"], accounted_profile=res.accounted["profile"],
                     accounted_best=res.accounted["best"], candidates_trained=res.candidates_trained,
                     seconds=round(res.wall_time_s, 2)))
    print(f"{label}: lower bound {res.bound.epsilon:.3f} vs accounted best {res.accounted['best']:.3f} "
          f"(rdp {res.accounted['rdp']:.3f}); {trials} searches per data set, "
          f"{res.candidates_trained} candidates, {res.wall_time_s:.1f} s", flush=True)
  return rows


def plot(rows: list, path_base: str) -> None:
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  fig, ax = plt.subplots(figsize=(11, 4.6))
  y = np.arange(len(rows))[::-1]
  ax.barh(y, [r["lower_bound"] for r in rows], color="tab:red", alpha=0.7,
          label=f"empirical lower bound ({CONFIDENCE:.0%} confidence)")
  finite = [r[f"accounted_{m}"] for r in rows for m in ("rdp", "profile", "best")
            if np.isfinite(r[f"accounted_{m}"])]  # inf: not private; NaN: no theorem
  cap = 1.15 * max(finite + [r["lower_bound"] for r in rows])
  for method, marker, color in (("rdp", "s", "tab:blue"), ("profile", "^", "tab:green"), ("best", "o", "k")):
    vals = [r[f"accounted_{method}"] for r in rows]
    shown = [v if np.isfinite(v) else cap for v in vals]
    keep = [i for i, v in enumerate(vals) if not np.isnan(v)]
    ax.scatter([shown[i] for i in keep], y[keep], marker=marker, color=color, zorder=3,
               label=f"accounted ({method})")
    for v, yy in zip(vals, y):
      if np.isinf(v) and method == "best":
        ax.annotate("accounted: inf", (cap, yy), xytext=(-70, 6), textcoords="offset points", fontsize=8)
  ax.set_yticks(y)
  ax.set_yticklabels([r["scenario"] for r in rows], fontsize=8)
  ax.set_xlabel(f"epsilon at delta = {DELTA:g}")
  ax.set_xlim(0, cap * 1.02)
  ax.grid(axis="x", alpha=0.3)
  ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
  ax.set_title("Empirical epsilon lower bound vs accounted epsilon of the whole private search",
               fontsize=10)
  fig.tight_layout()
  fig.savefig(path_base + ".png", dpi=130)
  fig.savefig(path_base + ".pdf")
  plt.close(fig)


def main(argv: Optional[Sequence[str]] = None) -> int:
  """Writes audit.{png,pdf,csv,json}; returns 0, 2 for bad arguments, 3 if a bound is violated."""
  import argparse  # pylint: disable=g-import-not-at-top
  parser = argparse.ArgumentParser(prog="jaxdp audit", description=__doc__.split("\n\n")[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter,
                                   epilog=__doc__.split("\n\n", 1)[1])
  parser.add_argument("--profile", default="quick", choices=sorted(PROFILES),
                      help="quick: 2,000 searches per data set for each gadget scenario and 200 for "
                           "the realistic one (about 1 min on 2 cores); full: 10x more")
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
  rows = run(PROFILES[args.profile], progress=not args.no_progress)
  violations = [r for r in rows
                if any(r["lower_bound"] > r[f"accounted_{m}"] * (1 + 1e-9) for m in ("rdp", "profile", "best")
                       if r[f"accounted_{m}"] == r[f"accounted_{m}"])]  # NaN: no theorem
  with common.staged_outputs(out) as stage:
    with open(os.path.join(stage, "audit.csv"), "w", newline="") as f:
      writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
      writer.writeheader()
      writer.writerows(rows)
    common.write_json(os.path.join(stage, "audit.json"), {
        "profile": args.profile, "rows": rows, "violations": [r["scenario"] for r in violations],
        "seconds": round(time.perf_counter() - start, 1), "versions": common.package_versions(),
        "devices": common.device_list()})
    plot(rows, os.path.join(stage, "audit"))
  print(f"wrote {os.path.join(out, 'audit.png')} (+ .pdf, .csv, .json) in {time.perf_counter() - start:.1f} s")
  if violations:
    print("AUDIT VIOLATION: the empirical lower bound exceeds the accounted epsilon for "
          f"{[r['scenario'] for r in violations]}. This is a bug in jaxdp's accounting or training; "
          "please report it with audit.json.", file=sys.stderr)
    return 3
  return 0


if __name__ == "__main__":
  sys.exit(main())
