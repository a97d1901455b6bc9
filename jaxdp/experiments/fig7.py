"""Papernot & Steinke (ICLR 2022), Figure 7: accuracy of a private learning-rate search vs its epsilon.

Pipeline: (1) train a pool of DP-SGD candidates (learning rates on a log grid
from 0.025 to 1, several seeds each) with the batched sweep engine into a
durable, resumable pool; (2) for each distribution of K (Poisson, truncated
negative binomial with eta in {-0.5, 0, 0.5, 1}, naive fixed K) and each E[K],
simulate 500 private random searches over the pool and record the mean test
accuracy of the released model; (3) plot it against the search's total epsilon
at delta = 1e-5: left with the RDP bounds of the paper, right with
`method="best"` (privacy-profile bounds where tighter).

  python experiments/fig7.py [--profile quick|paper] [--out figures] [--dry-run]

The profiles (`quick`, `paper`) are defined, and their sizing explained, in
the repository's experiments/fig7.py, the script that runs this pipeline on
them. `python -m jaxdp.experiments.fig7` and `jaxdp reproduce fig7` read them
from there (`PROFILES` below), so they too need a clone.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import os
import sys
from typing import Optional, Sequence

import numpy as np

from jaxdp.experiments import common

DELTA = 1e-5
N_TRIALS = 500
FALLBACK_ACCURACY = 0.1  # K = 0 or every run diverged: a data-independent default (chance level)
ETAS = (-0.5, 0.0, 0.5, 1.0)
CSV_COLUMNS = ("panel", "distribution", "eta", "expected_k", "epsilon", "accuracy_mean",
               "accuracy_stderr", "trials", "trials_with_reuse", "theorem")


@dataclasses.dataclass(frozen=True)
class Profile:
  """Everything that defines a Figure 7 run."""

  name: str
  dataset: str
  model: str
  activation: str
  batch_size: int
  epochs: float
  noise_multiplier: float
  l2_clip_norm: float
  learning_rates: tuple
  seeds: tuple
  expected_ks: tuple
  num_train: Optional[int] = None  # None: the dataset's size (q = batch / N)


def __getattr__(name: str):
  # The profiles are the figure's configuration: defined once, beside its launch script in the
  # repository's experiments/ (which the wheel does not ship), and read from there on first use.
  if name == "PROFILES":
    return common.figure_profiles("fig7")
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def base_config(profile: Profile, num_train: int):
  """The profile's `TrainConfig` at its first learning rate (the classifier preset task)."""
  from jaxdp.train import TrainConfig  # pylint: disable=g-import-not-at-top
  return TrainConfig(task=common.classifier_task(), l2_clip_norm=profile.l2_clip_norm,
                     noise_multiplier=profile.noise_multiplier,
                     sampling_prob=profile.batch_size / num_train, epochs=profile.epochs,
                     target_delta=DELTA,
                     hparams=dict(learning_rate=profile.learning_rates[0], model=profile.model,
                                  activation=profile.activation))


def distributions(profile: Profile):
  """(label, eta or None, mean, distribution) for every curve point."""
  from jaxdp import accounting as acc  # pylint: disable=g-import-not-at-top
  for mean in profile.expected_ks:
    yield "Poisson", None, mean, acc.Poisson(mean=mean)
    for eta in ETAS:
      yield f"TNB eta={eta:g}", eta, mean, acc.TruncatedNegativeBinomial(eta, mean=mean)
  # K = 1 is the single run itself (the reference line), so naive repetition starts at 2.
  for k in sorted({max(2, int(round(m))) for m in profile.expected_ks}):
    yield "naive fixed K", None, float(k), acc.Fixed(k)


def curve_rows(profile: Profile, table, event, rng) -> list:
  """Simulated accuracy and both epsilons for every (distribution, E[K])."""
  from jaxdp import accounting as acc  # pylint: disable=g-import-not-at-top
  from jaxdp.sweep import simulate  # pylint: disable=g-import-not-at-top
  rows = []
  for label, eta, mean, dist in distributions(profile):
    sim = simulate(table, dist, N_TRIALS, rng, fallback=FALLBACK_ACCURACY)
    search = acc.RepeatAndSelect(event, dist)
    for panel, method in (("rdp", "rdp"), ("best", "best")):
      rep_eps = acc.epsilon(search, DELTA, method=method)
      rows.append(dict(panel=panel, distribution=label, eta="" if eta is None else eta, expected_k=mean,
                       epsilon=rep_eps, accuracy_mean=sim.mean, accuracy_stderr=sim.stderr,
                       trials=N_TRIALS, trials_with_reuse=sim.trials_with_reuse,
                       theorem=acc.make_accountant("rdp").compose(search).theorem if method == "rdp" else "best of all methods"))
  return rows


def plot(rows: list, single_run: dict, profile: Profile, path_base: str) -> None:
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  from matplotlib import ticker  # pylint: disable=g-import-not-at-top
  from jaxdp import accounting as acc  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(1, 2, figsize=(12, 4.6), sharey=True)
  labels = list(dict.fromkeys(r["distribution"] for r in rows))
  colors = plt.get_cmap("tab10")
  for ax, panel, title in zip(axes, ("rdp", "best"),
                              ("epsilon by RDP (Papernot-Steinke)", 'epsilon by method="best" (incl. privacy profiles)')):
    for i, label in enumerate(labels):
      pts = sorted((r for r in rows if r["panel"] == panel and r["distribution"] == label),
                   key=lambda r: r["expected_k"])
      x = np.array([r["epsilon"] for r in pts])
      y = np.array([r["accuracy_mean"] for r in pts])
      se = np.array([r["accuracy_stderr"] for r in pts])
      style = "--" if label.startswith("naive") else "-"
      ax.plot(x, y, style, marker="o", ms=3, color=colors(i), label=label)
      ax.fill_between(x, y - se, y + se, color=colors(i), alpha=0.2, lw=0)
    ax.axvline(single_run[panel], color="k", ls=":", lw=1.2, label="single run")
    ax.annotate(f" one run\n eps={acc.format_epsilon(single_run[panel], '.2f')}", (single_run[panel], 0.02), xycoords=("data", "axes fraction"),
                fontsize=8)
    ax.set_xscale("log")
    # The epsilons span less than a decade: label 2, 3, 5 x 10^k as plain numbers.
    ax.xaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 3.0, 5.0)))
    ax.xaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
    ax.xaxis.set_minor_formatter(ticker.NullFormatter())
    ax.set_xlabel(f"total epsilon of the search (delta = {DELTA:g})")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
  axes[0].set_ylabel(f"mean test accuracy of the released model ({N_TRIALS} trials)")
  axes[1].legend(fontsize=8, loc="lower right")
  fig.suptitle(f"Papernot & Steinke Fig. 7 ({profile.name} profile: {profile.dataset}, {profile.model}, "
               f"{profile.epochs:g} epochs, batch {profile.batch_size}, sigma {profile.noise_multiplier})",
               fontsize=10)
  fig.tight_layout()
  fig.savefig(path_base + ".png", dpi=130)
  fig.savefig(path_base + ".pdf")
  plt.close(fig)


def _load_data(profile: Profile, data_dir: Optional[str] = None):
  from jaxdp.data import load_dataset  # pylint: disable=g-import-not-at-top
  return load_dataset(profile.dataset, data_dir)


def dry_run(profile: Profile) -> int:
  """Builds the profile's configuration and runs one DP step (CI-sized check)."""
  from jaxdp import accounting as acc  # pylint: disable=g-import-not-at-top
  from jaxdp.sweep.space import config_record  # pylint: disable=g-import-not-at-top
  config = base_config(profile, profile.num_train or 60000)
  print(f"profile {profile.name}: {config_record(config)}")
  print(f"  steps per run: {config.num_steps}; epsilon of one run at delta={DELTA:g}: "
        f"{acc.format_epsilon(acc.epsilon(config.dp_event(), DELTA, 'rdp'))} (rdp)")
  common.run_one_dp_step(config, profile.dataset)
  return 0


def run(profile: Profile, out_dir: str, pool_dir: str, data_dir: Optional[str] = None) -> dict:
  """The whole pipeline; returns the manifest."""
  from jaxdp import accounting as acc  # pylint: disable=g-import-not-at-top
  from jaxdp.sweep import (LocalTrainer, SearchSpace, grid_candidates,  # pylint: disable=g-import-not-at-top
                           run_sweep, table_from_records)
  from jaxdp.sweep.space import config_record  # pylint: disable=g-import-not-at-top

  watch = common.Stopwatch()
  with watch.stage("load data"):
    data = _load_data(profile, data_dir)
  n = profile.num_train or int(data.train.inputs.shape[0])
  config = base_config(profile, n)
  space = SearchSpace(config, {"learning_rate": list(profile.learning_rates)})
  candidates = grid_candidates(space, profile.seeds)
  # The task (name = preset and its arguments), every config field and the hyperparameters:
  # JSON, with no object addresses, so a rerun in another process matches.
  fingerprint = {"experiment": "ps_fig7", "profile": dataclasses.asdict(profile),
                 "config": config_record(config), "grid": {"learning_rate": list(profile.learning_rates)},
                 "num_train": n}
  with watch.stage(f"pool: {len(candidates)} candidates"):
    pool = run_sweep(candidates, data, pool_dir, fingerprint, trainer=LocalTrainer(progress=True))
  table = table_from_records(pool.records, score="score", value="test_score")
  event = config.dp_event()
  with watch.stage("simulate + account"):
    rows = curve_rows(profile, table, event, np.random.default_rng(2022))
  single = {"rdp": acc.epsilon(event, DELTA, "rdp"), "best": acc.epsilon(event, DELTA, "best")}
  pool_acc = [r["test_score"] for r in pool.records]  # the preset's score: test accuracy
  manifest = {
      "experiment": "Papernot & Steinke 2022, Figure 7", "profile": dataclasses.asdict(profile),
      "train_config": config_record(config) | {"num_steps": config.num_steps},
      "num_train": n, "num_test": int(data.test.inputs.shape[0]), "delta": DELTA, "trials": N_TRIALS,
      "fallback_accuracy": FALLBACK_ACCURACY, "seeds": list(profile.seeds),
      "learning_rates": list(profile.learning_rates), "pool_dir": os.path.abspath(pool_dir),
      "pool_size": len(pool.records), "pool_best_accuracy": float(np.nanmax(pool_acc)),
      "pool_diverged": int(sum(bool(r["diverged"]) for r in pool.records)),
      "single_run_epsilon": single, "packages": common.package_versions(),
      "devices": common.device_list(), "simulation_seed": 2022,
  }
  with common.staged_outputs(out_dir) as stage:
    with watch.stage("plot"):
      with open(os.path.join(stage, "fig7.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
      plot(rows, single, profile, os.path.join(stage, "fig7"))
    manifest["wall_time_s"] = dict(watch.stages)
    common.write_json(os.path.join(stage, "fig7.json"), manifest)
  return manifest


def build_parser(profiles: dict, prog: str = "python -m jaxdp.experiments.fig7") -> argparse.ArgumentParser:
  parser = common.profile_parser(prog, __doc__, profiles, "fig7")
  parser.add_argument("--pool-dir", default=None,
                      help="durable pool of trained candidates (default: runs/fig7-<profile>); rerun to resume")
  parser.add_argument("--data-dir", default=None,
                      help="TFDS data directory (paper profile), e.g. one filled by `tfds build mnist`")
  return parser


def main(argv: Optional[Sequence[str]] = None, profiles: Optional[dict] = None,
         prog: str = "python -m jaxdp.experiments.fig7") -> int:
  """Runs the pipeline on `profiles[--profile]` (default: experiments/fig7.py's); 0, or 2 for bad input."""
  try:
    profiles = common.figure_profiles("fig7") if profiles is None else profiles
  except common.UsageError as err:
    print(f"error: {err}", file=sys.stderr)
    return 2
  args = build_parser(profiles, prog).parse_args(argv)
  common.expose_host_devices()
  common.use_headless_matplotlib()
  profile = profiles[args.profile]
  from jaxdp.data import DatasetUnavailableError  # pylint: disable=g-import-not-at-top
  from jaxdp.sweep import PoolLockedError, PoolMismatchError  # pylint: disable=g-import-not-at-top
  try:
    if args.dry_run:
      return dry_run(profile)
    out = common.check_writable_dir(args.out)
    pool_dir = args.pool_dir or os.path.join("runs", f"fig7-{profile.name}")
    manifest = run(profile, out, pool_dir, args.data_dir)
  except (common.UsageError, PoolMismatchError, PoolLockedError, DatasetUnavailableError) as err:
    print(f"error: {err}", file=sys.stderr)
    return 2
  print(f"wrote {os.path.join(out, 'fig7.png')} (+ .pdf, .csv, .json); wall time {manifest['wall_time_s']}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
