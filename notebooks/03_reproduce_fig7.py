# %% [markdown]
# # Reproducing Papernot & Steinke, Figure 7, step by step
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/jaxdp/jaxdp/blob/main/notebooks/03_reproduce_fig7.ipynb)
#
# Figure 7 of Papernot & Steinke (ICLR 2022) plots the **test accuracy of the model released by a
# private learning-rate search** against the **ε of the whole search**, for several distributions
# of the number of runs K (Poisson, truncated negative binomial with η ∈ {−0.5, 0, 0.5, 1}) and for a
# naive fixed K.
#
# Training a fresh set of models for every point of every curve would be far too expensive. The
# pipeline instead:
#
# 1. trains a **pool** of candidates once: every learning rate of a grid with several seeds;
# 2. **simulates** many private searches over the pool: draw K, draw K learning rates, take a
#    distinct trained run of each, release the best;
# 3. computes the ε of each search with `jaxdp.accounting` and plots accuracy against ε.
#
# This notebook walks through what `python -m jaxdp.experiments.fig7` (`make reproduce-fig7`) does.

# %%
import dataclasses
import os

from jaxdp.experiments import expose_host_devices, fig7

expose_host_devices()  # every CPU core as a JAX device (must precede JAX's first computation)

import jax
import matplotlib.pyplot as plt
import numpy as np
from matplotlib import ticker

from jaxdp import accounting as acc
from jaxdp.data import load_dataset
from jaxdp.sweep import (LocalTrainer, SearchSpace, grid_candidates, run_sweep, simulate,
                         table_from_records)

DELTA = fig7.DELTA
print("devices:", jax.devices())

# %% [markdown]
# ## 1. Choose a profile
#
# A profile fixes the data set, model, DP-SGD parameters, learning-rate grid, seeds and the E[K]
# values on the x-axis. `"quick"` runs on a laptop CPU in minutes (the 5,000 offline MNIST digits,
# a small CNN, 5 epochs at batch 128 and σ = 1.1, so that one run costs about the paper's ε);
# `"paper"` is the paper's setting (TFDS MNIST, 60 epochs, batch 256, σ = 1.1; for accelerators,
# e.g. a Colab GPU). Change the switch below to reproduce the paper.
# In small mode (the tests) a tiny profile is used instead: scikit-learn digits, logistic
# regression, 2 epochs, 3 learning rates × 2 seeds.

# %%
PROFILE = "quick"  # or "paper"

# %%
if SMALL:
    profile = dataclasses.replace(
        fig7.PROFILES["quick"], name="tiny", dataset="digits", model="logreg", epochs=2, batch_size=64,
        learning_rates=(0.1, 1.0, 10.0), seeds=(0, 1), expected_ks=(1.5, 3, 8))
else:
    profile = fig7.PROFILES[PROFILE]
for field, value in dataclasses.asdict(profile).items():
    print(f"{field:>16}: {value}")

# %% [markdown]
# ## 2. Data and the DP-SGD configuration
#
# The sampling rate is q = batch size / N (each example joins each step's batch independently
# with probability q). Every candidate shares q, σ, the clip norm and the number of steps, hence
# the same DP guarantee: the learning rate is privacy-free to vary.

# %%
data = load_dataset(profile.dataset)
n = profile.num_train or int(data.train.inputs.shape[0])
config = fig7.base_config(profile, n)
event = config.dp_event()
single = {method: acc.epsilon(event, DELTA, method) for method in ("rdp", "best")}
print(f"{profile.dataset}: N = {n}, q = {config.sampling_prob:.5f}, {config.num_steps} steps, "
      f"sigma = {config.noise_multiplier}")
print(f"one run: epsilon = {single['rdp']:.3f} (RDP), {single['best']:.3f} (best) at delta = {DELTA:g}")

# %% [markdown]
# ## 3. The search space and the candidates of the pool
#
# `SearchSpace` turns the base configuration and a grid into one `TrainConfig` per grid point;
# `grid_candidates` pairs every grid point with every seed.

# %%
space = SearchSpace(config, {"learning_rate": list(profile.learning_rates)})
candidates = grid_candidates(space, profile.seeds)
print(f"{len(space)} grid points x {len(profile.seeds)} seeds = {len(candidates)} candidates")

# %% [markdown]
# ## 4. Train the pool
#
# `run_sweep` trains the candidates with the batched engine (vmapped over candidates, sharded
# over devices) and appends each finished chunk to a durable pool on disk. Rerunning the cell
# resumes: finished candidates are skipped. The fingerprint identifies the sweep, so a pool of a
# different configuration is refused rather than mixed in; it matches the one the script uses, so
# pointing `POOL_DIR` at the script's pool (`runs/fig7-<profile>` in the repository) reuses it.

# %%
POOL_DIR = os.path.join("runs", f"fig7-{profile.name}")  # relative to the notebook's directory
fingerprint = {"experiment": "ps_fig7", "profile": dataclasses.asdict(profile),
               "config": repr(config), "num_train": n}
pool = run_sweep(candidates, data, POOL_DIR, fingerprint, trainer=LocalTrainer(progress=not SMALL))
print(f"pool at {POOL_DIR}: {len(pool.records)} trained candidates")

# %% [markdown]
# `table_from_records` groups the pool by grid point: one row per learning rate, one column per
# seed. This is the non-private view of the sweep (it is only used to *simulate* private searches;
# a real private search would not publish it).

# %%
table = table_from_records(pool.records)
for point, accs in zip(table.points, table.values):
    print(f"learning rate {point['learning_rate']:8.4g}: test accuracy per seed "
          + ", ".join(f"{a:.3f}" for a in accs))

# %% [markdown]
# ## 5. Simulate private searches and account for them
#
# For every distribution of K and every E[K] of the profile (`fig7.distributions`), `simulate` runs
# many searches over the pool: draw K, draw K grid points, use a distinct seed of each, release the
# best run's test accuracy. When K = 0 (possible for Poisson) the search releases a
# data-independent default, counted as chance accuracy. The ε of each search comes from
# `acc.epsilon(acc.RepeatAndSelect(one_run, distribution), delta, method)`, by Papernot & Steinke's
# RDP bounds (Thm 2 for the truncated negative binomial, Thm 6 for Poisson; composition for a
# fixed K) and by `method="best"` (which adds the privacy-profile bounds of Koskela, Redberg &
# Wang, ICML 2024).
#
# The last column is the fraction of simulated searches that drew some grid point more often than
# the pool has seeds for it and so had to reuse a trained run; the more often that happens (large
# E[K], few seeds), the less faithful the simulation of that point. More seeds fix it.

# %%
rng = np.random.default_rng(2022)
rows = []
for label, eta, mean, dist in fig7.distributions(profile):
    sim = simulate(table, dist, fig7.N_TRIALS, rng, fallback=fig7.FALLBACK_ACCURACY)
    search = acc.RepeatAndSelect(event, dist)
    rows.append(dict(distribution=label, expected_k=mean, accuracy=sim.mean, stderr=sim.stderr,
                     reused=sim.trials_with_reuse / fig7.N_TRIALS,
                     eps_rdp=acc.epsilon(search, DELTA, "rdp"), eps_best=acc.epsilon(search, DELTA, "best")))

print(f"{'distribution':<15}{'E[K]':>6}{'eps (rdp)':>11}{'eps (best)':>12}{'accuracy':>10}{'reused':>8}")
for r in rows:
    print(f"{r['distribution']:<15}{r['expected_k']:>6g}{r['eps_rdp']:>11.3f}{r['eps_best']:>12.3f}"
          f"{r['accuracy']:>10.3f}{r['reused']:>8.2f}")

# %% [markdown]
# ## 6. The figure
#
# Left: ε by the RDP bounds of the paper; right: the tightest valid ε (`method="best"`). Shaded:
# ± one standard error over the simulated searches. The dotted vertical line is a single run.

# %%
fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
labels = list(dict.fromkeys(r["distribution"] for r in rows))
for ax, key, title in zip(axes, ("eps_rdp", "eps_best"), ("RDP (Papernot & Steinke)", 'method="best"')):
    for label in labels:
        pts = sorted((r for r in rows if r["distribution"] == label), key=lambda r: r["expected_k"])
        x = np.array([r[key] for r in pts])
        y = np.array([r["accuracy"] for r in pts])
        se = np.array([r["stderr"] for r in pts])
        (line,) = ax.plot(x, y, "--" if label.startswith("naive") else "-", marker="o", ms=3, label=label)
        ax.fill_between(x, y - se, y + se, color=line.get_color(), alpha=0.2, lw=0)
    ax.axvline(single["rdp" if key == "eps_rdp" else "best"], color="k", ls=":", lw=1.2, label="single run")
    ax.set(xscale="log", xlabel=f"epsilon of the search (delta = {DELTA:g})", title=title)
    ax.xaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
    ax.xaxis.set_minor_formatter(ticker.FormatStrFormatter("%g"))
    ax.grid(alpha=0.3, which="both")
axes[0].set_ylabel(f"mean test accuracy of the released model ({fig7.N_TRIALS} searches)")
axes[1].legend(fontsize=8, loc="lower right")
fig.suptitle(f"Papernot & Steinke Fig. 7, {profile.name} profile ({profile.dataset}, {profile.model})")
fig.tight_layout()
plt.show()

# %% [markdown]
# **Reading the figure.** Moving right along a curve means a larger E[K]: more candidates, a
# better chance of finding a good learning rate, and a larger ε. Compare curves at equal ε (read
# vertically): the higher curve releases better models for the same privacy. A random K pays a
# constant-factor overhead at small E[K] but its ε then grows slowly, while the ε of a fixed K grows
# by composition; where the curves cross depends on the setting (pool size, training length).
# With the tiny profile of small mode the curves are short and noisy.
#
# To write the figure, its data (CSV) and a manifest to disk instead, run
# `python -m jaxdp.experiments.fig7 --profile quick` (or `--profile paper`).
