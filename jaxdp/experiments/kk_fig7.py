"""Koskela & Kulkarni (NeurIPS 2023), Figure 7: tuning learning rate, epochs and gamma on a random subset.

Every candidate is DP-SGD with a grid point (batch size B -> sampling rate
gamma = B / N, epochs, learning rate) and the smallest noise multiplier sigma
that keeps that single run within a per-candidate target epsilon at
delta = 1e-5 (`acc.calibrate_noise_grid`, per (gamma, epochs)). Candidates
therefore have different RDP curves; every search is accounted with
`acc.UniformCandidates` over them (KK Lemma 1). For each target and each of R
repetitions the script runs

  * baseline: Papernot-Steinke random search (K ~ Poisson(mu)) on all of X,
    releasing the best candidate (`jaxdp.tuning.random_search`);
  * variant 1 / variant 2: `jaxdp.tuning.subsampled_search` with subset rate
    q (tune on X1, extrapolate the learning rate by n/m, train the final model
    on X \\ X1 or on X),

and plots the test accuracy of the released model (mean +- s.e. over the
repetitions) against the epsilon of the whole procedure, with the mean sigma,
chosen learning rate and gamma in extra panels and the relative training time
(gradient evaluations, baseline = 1) in the legend.

  python experiments/kk_fig7.py [--profile quick|paper|paper-fashion] [--out figures] [--dry-run]

The profiles (`quick`, `paper`, `paper-fashion`) are defined and described in
the repository's experiments/kk_fig7.py, the script that runs this pipeline on
them. `python -m jaxdp.experiments.kk_fig7` and `jaxdp reproduce kk-fig7` read
them from there (`PROFILES` below), so they too need a clone.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import os
import sys
from typing import Optional, Sequence

import numpy as np

from jaxdp.experiments import common

DELTA = 1e-5
FALLBACK_ACCURACY = 0.1  # baseline with K = 0 or only diverged runs: a data-independent default
METHODS = ("baseline", "variant 1", "variant 2")
CSV_COLUMNS = ("method", "target_epsilon", "epsilon", "accuracy_mean", "accuracy_stderr", "sigma_mean",
               "learning_rate_mean", "final_learning_rate_mean", "sampling_prob_mean", "epochs_mean",
               "gradient_evaluations_mean", "relative_training_time", "repetitions")


@dataclasses.dataclass(frozen=True)
class Profile:
  """Everything that defines a KK Figure 7 run."""

  name: str
  dataset: str
  model: str
  activation: str
  l2_clip_norm: float
  batch_sizes: tuple
  epochs: tuple
  learning_rates: tuple
  target_epsilons: tuple  # per-candidate targets: one point per method each
  mu: float               # E[K], K ~ Poisson(mu)
  q: float                # subset sampling rate
  repetitions: int        # R
  seed: int = 0
  candidates_per_device: Optional[int] = None  # engine default when None
  num_train: Optional[int] = None  # None: the dataset's size (gamma = B / N)


def __getattr__(name: str):
  # The profiles are the figure's configuration: defined once, beside its launch script in the
  # repository's experiments/ (which the wheel does not ship), and read from there on first use.
  if name == "PROFILES":
    return common.figure_profiles("kk_fig7")
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def build_space(profile: Profile, num_train: int, target_epsilon: float):
  """The profile's grid with sigma calibrated per (gamma, epochs) to `target_epsilon`."""
  from jaxdp import accounting as acc  # pylint: disable=g-import-not-at-top
  from jaxdp.sweep import SearchSpace  # pylint: disable=g-import-not-at-top
  from jaxdp.train import TrainConfig  # pylint: disable=g-import-not-at-top
  gammas = [b / num_train for b in profile.batch_sizes]
  sigma = acc.calibrate_noise_grid(np.array(gammas)[:, None], np.array(profile.epochs, float)[None, :],
                                   target_epsilon=target_epsilon, target_delta=DELTA)
  noise = {(g, float(e)): float(sigma[i, j]) for i, g in enumerate(gammas) for j, e in enumerate(profile.epochs)}
  base = TrainConfig(task=common.classifier_task(), l2_clip_norm=profile.l2_clip_norm,
                     noise_multiplier=float(sigma[0, 0]), sampling_prob=gammas[0],
                     epochs=float(profile.epochs[0]), target_delta=DELTA,
                     hparams=dict(learning_rate=profile.learning_rates[0], model=profile.model,
                                  activation=profile.activation))
  grid = {"sampling_prob": gammas, "epochs": [float(e) for e in profile.epochs],
          "learning_rate": list(profile.learning_rates)}
  calibrated = lambda c: c.replace(noise_multiplier=noise[(c.sampling_prob, c.epochs)])
  return SearchSpace(base, grid, derive=calibrated), noise


def _load_data(profile: Profile):
  from jaxdp.data import load_dataset  # pylint: disable=g-import-not-at-top
  return load_dataset(profile.dataset)


def run_repetitions(profile: Profile, data, watch) -> tuple[list, dict]:
  """Every (target, repetition, method) run; returns per-run records and the sigma tables."""
  import jax  # pylint: disable=g-import-not-at-top
  from jaxdp import accounting as acc  # pylint: disable=g-import-not-at-top
  from jaxdp.tuning import (LocalTrainer, RunConfig, SubsetTuning,  # pylint: disable=g-import-not-at-top
                            random_search, subsampled_search)
  n = int(data.train.inputs.shape[0])
  reps = acc.Poisson(mean=profile.mu)
  run = RunConfig(trainer=LocalTrainer(max_candidates_per_device=profile.candidates_per_device))
  records, tables = [], {}
  for target in profile.target_epsilons:
    space, noise = build_space(profile, n, target)
    tables[str(target)] = {f"gamma={g:.6g}, epochs={e:g}": s for (g, e), s in noise.items()}
    mean_cost = float(np.mean([c.num_steps * c.sampling_prob * n for c in space.configs]))
    with watch.stage(f"target eps {target:g}: {profile.repetitions} repetitions x {len(METHODS)} methods"):
      for r in range(profile.repetitions):
        # One key per repetition: baseline and both variants see the same X1 draw
        # (shared subset key), so their differences are the methods', not the draws'.
        base_key, sub_key = jax.random.split(jax.random.key(profile.seed * 100003 + r))
        res = random_search(space, None, data, distribution=reps, key=base_key, target_delta=DELTA,
                            run_config=run)
        released = res.config is not None
        records.append(dict(
            method="baseline", target_epsilon=target, repetition=r, epsilon=res.epsilon,
            accuracy=res.score if released else FALLBACK_ACCURACY,
            sigma=res.config.noise_multiplier if released else math.nan,
            learning_rate=res.config.hparams["learning_rate"] if released else math.nan,
            final_learning_rate=res.config.hparams["learning_rate"] if released else math.nan,
            sampling_prob=res.config.sampling_prob if released else math.nan,
            epochs=res.config.epochs if released else math.nan,
            num_candidates=res.unreleased.num_candidates, gradient_evaluations=reps.mean * mean_cost,
            baseline_gradient_evaluations=reps.mean * mean_cost))
        for variant in (1, 2):
          out = subsampled_search(space, None, data, subset=SubsetTuning(profile.q, variant),
                                  distribution=reps, key=sub_key, target_delta=DELTA,
                                  run_config=run)
          tuned = out.tuned_hyperparameters or {}
          records.append(dict(
              method=f"variant {variant}", target_epsilon=target, repetition=r, epsilon=out.epsilon,
              # The preset's score is test accuracy.
              accuracy=out.score if math.isfinite(out.score) else FALLBACK_ACCURACY,
              sigma=out.config.noise_multiplier,
              learning_rate=tuned.get("learning_rate", math.nan),
              final_learning_rate=out.config.hparams["learning_rate"],
              sampling_prob=out.config.sampling_prob, epochs=out.config.epochs,
              num_candidates=out.unreleased.num_candidates,
              gradient_evaluations=out.unreleased.gradient_evaluations,
              baseline_gradient_evaluations=out.unreleased.baseline_gradient_evaluations))
  return records, tables


def summarise(records: list) -> list:
  """Mean +- standard error per (method, target); relative time vs the baseline's expected cost."""
  rows = []
  for method in METHODS:
    for target in dict.fromkeys(r["target_epsilon"] for r in records):
      rs = [r for r in records if r["method"] == method and r["target_epsilon"] == target]
      acc_ = np.array([r["accuracy"] for r in rs], dtype=float)
      mean = lambda k: float(np.nanmean([r[k] for r in rs])) if any(np.isfinite(r[k]) for r in rs) else math.nan
      rows.append(dict(
          method=method, target_epsilon=target, epsilon=rs[0]["epsilon"], accuracy_mean=float(acc_.mean()),
          accuracy_stderr=float(acc_.std(ddof=1) / math.sqrt(len(rs))) if len(rs) > 1 else 0.0,
          sigma_mean=mean("sigma"), learning_rate_mean=mean("learning_rate"),
          final_learning_rate_mean=mean("final_learning_rate"), sampling_prob_mean=mean("sampling_prob"),
          epochs_mean=mean("epochs"), gradient_evaluations_mean=mean("gradient_evaluations"),
          relative_training_time=mean("gradient_evaluations") / mean("baseline_gradient_evaluations"),
          repetitions=len(rs)))
  return rows


def plot(rows: list, profile: Profile, path_base: str) -> None:
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(1, 4, figsize=(17, 4.2))
  colors = {"baseline": "k", "variant 1": "tab:blue", "variant 2": "tab:orange"}
  panels = (("accuracy_mean", "test accuracy of the released model"), ("sigma_mean", "mean sigma"),
            ("final_learning_rate_mean", "mean learning rate of the final model"),
            ("sampling_prob_mean", "mean sampling rate gamma"))
  for method in METHODS:
    pts = sorted((r for r in rows if r["method"] == method), key=lambda r: r["epsilon"])
    x = [r["epsilon"] for r in pts]
    time_ = np.mean([r["relative_training_time"] for r in pts])
    label = f"{method} (training time {time_:.2f}x)" if method != "baseline" else "baseline PS, all data (1x)"
    for ax, (key, ylabel) in zip(axes, panels):
      y = [r[key] for r in pts]
      if key == "accuracy_mean":
        ax.errorbar(x, y, yerr=[r["accuracy_stderr"] for r in pts], color=colors[method], marker="o", ms=4,
                    capsize=3, label=label)
      else:
        ax.plot(x, y, color=colors[method], marker="o", ms=4, label=label)
      ax.set_ylabel(ylabel)
  for ax in axes:
    ax.set_xlabel(f"epsilon of the whole procedure (delta = {DELTA:g})")
    ax.grid(alpha=0.3)
  axes[2].set_yscale("log")
  axes[0].legend(fontsize=8, loc="lower right")
  fig.suptitle(f"Koskela & Kulkarni Fig. 7 ({profile.name}: {profile.dataset}, {profile.model}, "
               f"B in {list(profile.batch_sizes)}, epochs {list(profile.epochs)}, K ~ Poisson({profile.mu:g}), "
               f"q = {profile.q:g}, R = {profile.repetitions}; sigma calibrated per (gamma, epochs))", fontsize=10)
  fig.tight_layout()
  fig.savefig(path_base + ".png", dpi=130)
  fig.savefig(path_base + ".pdf")
  plt.close(fig)


def dry_run(profile: Profile) -> int:
  """Builds the profile's configuration (calibrated sigma) and runs one DP step."""
  from jaxdp import accounting as acc  # pylint: disable=g-import-not-at-top
  n = profile.num_train or 60000
  gamma, epochs, target = profile.batch_sizes[0] / n, float(profile.epochs[0]), profile.target_epsilons[0]
  sigma = float(acc.calibrate_noise_grid(gamma, epochs, target_epsilon=target, target_delta=DELTA))
  from jaxdp.sweep.space import config_record  # pylint: disable=g-import-not-at-top
  from jaxdp.train import TrainConfig  # pylint: disable=g-import-not-at-top
  config = TrainConfig(task=common.classifier_task(), l2_clip_norm=profile.l2_clip_norm,
                       noise_multiplier=sigma, sampling_prob=gamma, epochs=epochs, target_delta=DELTA,
                       hparams=dict(learning_rate=profile.learning_rates[0], model=profile.model,
                                    activation=profile.activation))
  print(f"profile {profile.name}: {config_record(config)}")
  print(f"  grid: B {list(profile.batch_sizes)} x epochs {list(profile.epochs)} x "
        f"{len(profile.learning_rates)} learning rates; K ~ Poisson({profile.mu:g}), q={profile.q:g}, "
        f"R={profile.repetitions}")
  print(f"  steps per run: {config.num_steps}; calibrated sigma {sigma:.4f} for target epsilon {target:g} "
        f"(run's epsilon {acc.format_epsilon(acc.epsilon(config.dp_event(), DELTA, 'rdp'))})")
  common.run_one_dp_step(config, profile.dataset)
  return 0


def run(profile: Profile, out_dir: str) -> dict:
  """The whole pipeline; returns the manifest."""
  watch = common.Stopwatch()
  with watch.stage("load data"):
    data = _load_data(profile)
  n = profile.num_train or int(data.train.inputs.shape[0])
  if n != int(data.train.inputs.shape[0]):
    raise common.UsageError(f"profile {profile.name!r} expects {n} training examples, "
                            f"{profile.dataset!r} has {data.train.inputs.shape[0]}")
  records, tables = run_repetitions(profile, data, watch)
  rows = summarise(records)
  manifest = {
      "experiment": "Koskela & Kulkarni 2023, Figure 7", "profile": dataclasses.asdict(profile),
      "num_train": n, "num_test": int(data.test.inputs.shape[0]), "delta": DELTA,
      "hyperparameter_grid": {"batch_sizes": list(profile.batch_sizes),
                              "sampling_probs": [b / n for b in profile.batch_sizes],
                              "epochs": list(profile.epochs), "learning_rates": list(profile.learning_rates),
                              "l2_clip_norm": profile.l2_clip_norm},
      "calibrated_sigma": tables, "fallback_accuracy": FALLBACK_ACCURACY,
      "seeds": {"base_seed": profile.seed,
                "repetition_keys": [profile.seed * 100003 + r for r in range(profile.repetitions)]},
      "compute_ratio_baseline_over": {
          m: float(np.mean([r["relative_training_time"] for r in rows if r["method"] == m])) ** -1
          for m in METHODS[1:]},
      "runs": records, "packages": common.package_versions(), "devices": common.device_list(),
  }
  with common.staged_outputs(out_dir) as stage:
    with watch.stage("plot"):
      with open(os.path.join(stage, "kk_fig7.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
      plot(rows, profile, os.path.join(stage, "kk_fig7"))
    manifest["wall_time_s"] = dict(watch.stages)
    common.write_json(os.path.join(stage, "kk_fig7.json"), manifest)
  manifest["wall_time_s"] = dict(watch.stages)
  manifest["rows"] = rows
  return manifest


def build_parser(profiles: dict, prog: str = "python -m jaxdp.experiments.kk_fig7") -> argparse.ArgumentParser:
  return common.profile_parser(prog, __doc__, profiles, "kk_fig7")


def main(argv: Optional[Sequence[str]] = None, profiles: Optional[dict] = None,
         prog: str = "python -m jaxdp.experiments.kk_fig7") -> int:
  """Runs the pipeline on `profiles[--profile]` (default: experiments/kk_fig7.py's); 0, or 2 for bad input."""
  try:
    profiles = common.figure_profiles("kk_fig7") if profiles is None else profiles
  except common.UsageError as err:
    print(f"error: {err}", file=sys.stderr)
    return 2
  args = build_parser(profiles, prog).parse_args(argv)
  common.expose_host_devices()
  common.use_headless_matplotlib()
  profile = profiles[args.profile]
  from jaxdp.data import DatasetUnavailableError  # pylint: disable=g-import-not-at-top
  try:
    if args.dry_run:
      return dry_run(profile)
    out = common.check_writable_dir(args.out)
    manifest = run(profile, out)
  except (common.UsageError, DatasetUnavailableError) as err:
    print(f"error: {err}", file=sys.stderr)
    return 2
  for m, ratio in manifest["compute_ratio_baseline_over"].items():
    print(f"compute ratio baseline / {m}: {ratio:.2f}")
  print(f"wrote {os.path.join(out, 'kk_fig7.png')} (+ .pdf, .csv, .json); wall time {manifest['wall_time_s']}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
