# %% [markdown]
# # Cheaper private tuning on a random subset (Koskela & Kulkarni)
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/jaxdp/jaxdp/blob/main/notebooks/04_subsampled_tuning.ipynb)
#
# Private random search (Papernot & Steinke, ICLR 2022) trains E[K] full models, so it costs E[K]
# times the compute of one training run. Koskela & Kulkarni (*Practical Differentially Private
# Hyperparameter Tuning with Subsampling*, NeurIPS 2023) tune on a **random subset** instead:
#
# 1. Poisson-subsample the training set X with rate q into X₁ (each example joins X₁ independently
#    with probability q);
# 2. run the private random search (K ~ Poisson) on X₁ only;
# 3. adapt the selected hyperparameters to the full data (for DP-SGD: scale the learning rate by
#    the ratio of the data set sizes) and train the final model once,
#    * **variant 1**: on X \ X₁ (the rest of the data), or
#    * **variant 2**: on all of X.
#
# Both stages are released. Subsampling makes the tuning stage both cheaper and *more private*
# (privacy amplification by subsampling), so the total ε can even be **smaller** than that of
# tuning on all of X. This notebook computes both effects.

# %%
from jaxdp.experiments import expose_host_devices

expose_host_devices()  # every CPU core as a JAX device (must precede JAX's first computation)

import jax
import matplotlib.pyplot as plt
import numpy as np
from matplotlib import ticker

from jaxdp import accounting as acc

DELTA = 1e-5


def plain_log_ticks(axis):
    # Log-axis ticks at 1, 2, 5 x 10^k, written as plain numbers.
    axis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(ticker.FormatStrFormatter("%g"))
    axis.set_minor_formatter(ticker.NullFormatter())


# %% [markdown]
# ## 1. The base run and the baseline search
#
# One DP-SGD run samples each example with probability γ = 0.01 per step, adds noise σ = 2 and
# runs T = 5000 steps (50 epochs). The baseline is Papernot & Steinke's search on all of X with
# K ~ Poisson(15).

# %%
gamma, sigma, steps, mu = 0.01, 2.0, 5000, 15
base = acc.dpsgd_event(gamma, sigma, steps)
baseline = acc.RepeatAndSelect(base, acc.Poisson(mean=mu))

print(acc.report(baseline, delta=DELTA))
eps_baseline = {m: acc.epsilon(baseline, DELTA, m) for m in ("rdp", "best")}

# %% [markdown]
# ## 2. Accounting for tuning on a subset
#
# `acc.SubsampledTuning(tune=..., final=..., q=q, variant=1|2)` is the whole procedure: `tune` is
# the search run on the subset (its base is one run's guarantee; the same γ, σ, T are used on X₁),
# `final` the final training run. Its accounting (`method="rdp"`, which is also what `best` picks
# here, since no privacy-profile theorem covers it yet):
#
# * **variant 1**: Koskela & Kulkarni, Theorem 1 (the tuning and the final run see disjoint
#   parts of the data), applied to Papernot & Steinke's Poisson bound (Thm 6) for the search;
# * **variant 2**: the Zhu & Wang bound for Poisson subsampling of an RDP mechanism (ICML 2019;
#   KK Thm 4) applied to the search, composed with the final run on all of X.

# %%
q = 0.1
for variant in (1, 2):
    event = acc.SubsampledTuning(tune=acc.RepeatAndSelect(base, acc.Poisson(mean=mu)), final=base,
                                 q=q, variant=variant)
    print(acc.report(event, delta=DELTA), "\n")

# %% [markdown]
# ### ε as a function of the subset rate q
#
# Dashed lines: the baseline (search on all of X), with its RDP bound (the fair comparison, as the
# subset bounds are RDP bounds too) and with the tightest bound (`best`). Dotted: the final training
# run alone, a floor for any procedure that releases it.

# %%
qs = np.geomspace(0.02, 0.8, 4 if SMALL else 16)
eps_q = {
    variant: np.array([acc.epsilon(acc.SubsampledTuning(tune=baseline, final=base, q=float(qq),
                                                        variant=variant), delta=DELTA) for qq in qs])
    for variant in (1, 2)
}

fig, ax = plt.subplots(figsize=(7, 4.5))
ax.plot(qs, eps_q[1], marker="o", ms=3, label="variant 1: final run on X \\ X1 (KK Thm 1)")
ax.plot(qs, eps_q[2], marker="o", ms=3, label="variant 2: final run on X (Zhu-Wang + composition)")
ax.axhline(eps_baseline["rdp"], color="k", ls="--", lw=1, label="baseline on all of X (RDP)")
ax.axhline(eps_baseline["best"], color="gray", ls="--", lw=1, label="baseline on all of X (best)")
ax.axhline(acc.epsilon(base, DELTA, "rdp"), color="k", ls=":", lw=1, label="the final run alone (RDP)")
ax.set(xscale="log", xlabel="subset rate q", ylabel=f"epsilon (delta = {DELTA:g})",
       title=f"Tuning on a subset: gamma={gamma}, sigma={sigma}, T={steps}, K ~ Poisson({mu})")
plain_log_ticks(ax.xaxis)
ax.grid(alpha=0.3, which="both")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# ## 3. Compute saved
#
# Count per-example gradient evaluations. One run of T steps at rate γ on n examples evaluates
# γ·T·n = E·n gradients in expectation, E = γT being the number of epochs. With E[K] = μ:
#
# * baseline (search on all of X): μ·n·E;
# * variant 1: E·(μ·q·n + (1 − q)·n): μ runs on qn examples, then one run on the remaining (1 − q)n;
# * variant 2: E·(μ·q·n + n): μ runs on qn examples, then one run on all n.
#
# The ratio does not depend on n; n = 60,000 (MNIST) makes the counts concrete.

# %%
n_examples, epochs = 60000, gamma * steps
cost_baseline = mu * n_examples * epochs
cost = {1: epochs * (mu * qs * n_examples + (1 - qs) * n_examples),
        2: epochs * (mu * qs * n_examples + n_examples)}

print(f"baseline: {cost_baseline:.3g} gradient evaluations, epsilon {eps_baseline['rdp']:.3f} (RDP), "
      f"{eps_baseline['best']:.3f} (best)\n")
print(f"{'q':>7}{'eps v1':>9}{'eps v2':>9}{'compute v1':>12}{'compute v2':>12}   (compute relative to baseline)")
for i, qq in enumerate(qs):
    print(f"{qq:>7.3f}{eps_q[1][i]:>9.3f}{eps_q[2][i]:>9.3f}"
          f"{cost[1][i] / cost_baseline:>12.3f}{cost[2][i] / cost_baseline:>12.3f}")

fig, ax = plt.subplots(figsize=(7, 4))
for variant in (1, 2):
    ax.plot(qs, cost[variant] / cost_baseline, marker="o", ms=3, label=f"variant {variant}")
ax.axhline(1.0, color="k", ls="--", lw=1, label="baseline")
ax.set(xscale="log", xlabel="subset rate q", ylabel="gradient evaluations / baseline",
       title="Compute of tuning on a subset")
plain_log_ticks(ax.xaxis)
ax.grid(alpha=0.3, which="both")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# ## 4. A small run on the digits: `jaxdp.tuning.subsampled_search`
#
# `subsampled_search` runs Koskela & Kulkarni's algorithm for real: it Poisson-subsamples the
# training set, runs the private random search on the subset with the batched engine, carries
# the selected hyperparameters over to the final run with the task's `extrapolate`, trains the
# final model, and reports the ε of the whole procedure together with the gradient evaluations
# it spent and those the baseline search on all of X would have spent.
#
# The classifier preset's `extrapolate` scales an SGD learning rate by n/m (n: final training
# set size, m: subset size, KK Sec. 4): DP-SGD divides each noisy gradient sum by the expected
# batch q·N, so keeping the per-step signal-to-noise ratio on more data needs a proportionally
# larger rate (Adam is scale invariant and keeps its rate). A task of your own passes
# `Task(extrapolate=jaxdp.train.scale_learning_rate())` or `jaxdp.train.keep_hparams`. This
# assumes the data set sizes are public: m and n are in the result, and the factor n/m is
# visible in the released configuration.
#
# Here on scikit-learn's 8×8 digits with logistic regression, a deliberately small example.

# %%
from jaxdp.data import load_dataset
from jaxdp.train import TrainConfig, presets
from jaxdp.tuning import SubsetTuning, subsampled_search

digits = load_dataset("digits")
digits_config = TrainConfig(task=presets.classifier(10), l2_clip_norm=1.0, noise_multiplier=1.1,
                            sampling_prob=0.05, epochs=2 if SMALL else 5,
                            hparams=dict(learning_rate=0.1, model="logreg"))
grid = {"learning_rate": [0.1, 0.3, 1.0, 3.0]}

# %%
variants = (1,) if SMALL else (1, 2)
for variant in variants:
    res = subsampled_search(digits_config, grid, digits, subset=SubsetTuning(q=0.2, variant=variant),
                            distribution=acc.Poisson(mean=3 if SMALL else 5), key=jax.random.key(0))
    print(f"variant {variant}: subset of m = {res.subset_size} examples")
    print(f"  selected on the subset: {res.tuned_hyperparameters} (subset-trained accuracy "
          f"{res.tuned_score:.3f})")
    print(f"  final run on {res.final_train_size} examples with {res.hyperparameters} "
          f"(learning rate x {res.learning_rate_factor:.2f}): test accuracy {res.score:.3f}")
    # The compute spent is a function of K: for you, not for publication (`res.unreleased`).
    spent = res.unreleased
    print(f"  epsilon {res.epsilon:.3f} at delta {res.delta:g}; compute {spent.gradient_evaluations:.0f} "
          f"vs {spent.baseline_gradient_evaluations:.0f} gradient evaluations for the baseline "
          f"({spent.compute_ratio:.2f}x less)")

# %% [markdown]
# **Take-aways.** Tuning on a small random subset saves most of the compute of a private search
# and, thanks to amplification by subsampling, often *lowers* ε as well. The price is that the
# hyperparameters are chosen on less data and must be extrapolated to the full set, which works
# well for learning rates of DP-SGD but not for every hyperparameter.
