# %% [markdown]
# # Privacy accounting for hyperparameter tuning
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/jaxdp/jaxdp/blob/main/notebooks/01_accounting.ipynb)
#
# Training a model once with DP-SGD gives an (ε, δ) guarantee. But nobody trains once: we try
# several learning rates, architectures or clipping norms and keep the best model. Every extra
# training run looks at the private data, so **the tuning itself must be accounted for**.
#
# Papernot & Steinke (*Hyperparameter Tuning with Rényi Differential Privacy*, ICLR 2022) show
# that if the **number of runs K is random** (drawn from a well-chosen distribution before
# looking at the data) and only the best run is released, the whole search costs only a small
# constant factor more than one run, instead of the factor K (or √K) of composition.
#
# This notebook uses `jaxdp.accounting` to answer, for one DP-SGD configuration:
#
# 1. What ε does one training run have?
# 2. What ε does tuning with K ~ Poisson / Geometric / Logarithmic / truncated negative
#    binomial cost, by every accounting method side by side?
# 3. The inverse questions: how many runs (E[K]) fit a budget, and how much noise σ does each
#    run need so that the whole search meets a target ε?
# 4. How ε grows with E[K], and what it buys (the expected quantile of the released run).

# %%
import dp_accounting as dpa
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
# ## 1. One DP-SGD training run
#
# The base mechanism is DP-SGD as in Papernot & Steinke's MNIST experiment: each step samples
# every training example independently with probability q = 256 / 60000 (expected batch 256),
# adds Gaussian noise with multiplier σ = 1.1 to the sum of clipped gradients, and runs for
# T = ⌈60 / q⌉ = 14063 steps (60 epochs; `acc.dpsgd_steps` is the step rule the trainer uses).
# `acc.dpsgd_event` describes it as a `dp_accounting.DpEvent`.
#
# `acc.report` lists the ε every accounting method gives; for a single run the `rdp` and
# `composition` rows are the classical RDP accountant and `profile` is the tighter
# privacy-loss-distribution (PLD) accountant.

# %%
q, sigma = 256 / 60000, 1.1
steps = acc.dpsgd_steps(60, q)  # 14063
base = acc.dpsgd_event(q, sigma, steps)  # SelfComposed(PoissonSampled(q, Gaussian(sigma)), steps)

print(acc.report(base, delta=DELTA))
eps_single = acc.epsilon(base, delta=DELTA)  # method="best": the tightest valid bound
print(f"\none run: epsilon = {eps_single:.3f} at delta = {DELTA:g}")

# %% [markdown]
# ## 2. Tuning: run K times, release only the best
#
# `acc.RepeatAndSelect(base, distribution)` is the event "draw K from `distribution`, train K
# candidates (each satisfying `base`), release the best one". The accounting methods are:
#
# | method | what it is | reference |
# |---|---|---|
# | `rdp` | Rényi-DP bounds for random K, converted to (ε, δ) | Papernot & Steinke 2022: Thm 2 (truncated negative binomial, incl. geometric η = 1 and logarithmic η = 0), Thm 6 (Poisson), Lemma 7 (any distribution, numerically) |
# | `composition` | as if all K runs were released (what you pay without the selection theorems) | composition of RDP, averaged over K |
# | `profile` | bounds on the privacy profile (δ as a function of ε) of the base run, computed with the PLD accountant | Koskela, Redberg & Wang, *Privacy Profiles for Private Selection* (ICML 2024): Thm 5.2 (truncated negative binomial), Cor 5.8 (Poisson) |
# | `profile-refined` | the same with a tighter, derived constant; shown, but `best` uses it only with `allow_refined=True` | derived from Koskela, Redberg & Wang |
# | `liu-talwar` | random stopping / threshold selection; needs a pure-DP base, so not applicable to DP-SGD | Liu & Talwar, *Private Selection from Private Candidates* (STOC 2019) |
# | `pld` | composition of the K runs by privacy-loss distributions, mixed over K (joint convexity); exact for a fixed K, light-tailed K only | dp-accounting's PLD accountant |
# | `best` | the smallest ε over the methods that apply | |
#
# Every method is a `dp_accounting.PrivacyAccountant` (`acc.make_accountant(method)`), and every
# jaxdp event is a `DpEvent`, so a search composes with anything else you release (section 3).
#
# First the full report for K ~ Poisson with mean 10:

# %%
MEAN = 10
print(acc.report(acc.RepeatAndSelect(base, acc.Poisson(mean=MEAN)), delta=DELTA))

# %% [markdown]
# Now every distribution of K with the same mean, side by side. The truncated negative
# binomial family D_{η,γ} (Papernot & Steinke, Def. 1) contains the geometric (η = 1) and the
# logarithmic (η = 0) distributions; smaller η means a heavier tail and a smaller privacy cost.

# %%
DISTRIBUTIONS = {
    "Poisson": lambda m: acc.Poisson(mean=m),
    "Geometric (eta=1)": lambda m: acc.Geometric(mean=m),
    "Logarithmic (eta=0)": lambda m: acc.Logarithmic(mean=m),
    "TNB eta=-0.5": lambda m: acc.TruncatedNegativeBinomial(-0.5, mean=m),
}
reports = {name: acc.report(acc.RepeatAndSelect(base, make(MEAN)), delta=DELTA)
           for name, make in DISTRIBUTIONS.items()}

W = 22
print(f"epsilon at delta = {DELTA:g}, E[K] = {MEAN}\n")
print(f"{'method':<16}" + "".join(f"{name:>{W}}" for name in reports))
methods = [r.method for r in next(iter(reports.values())).results]
for i, method in enumerate(methods):
    cells = [rep.results[i].epsilon for rep in reports.values()]
    print(f"{method:<16}" + "".join(f"{'n/a' if e is None else f'{e:.3f}':>{W}}" for e in cells))
print(f"{'best':<16}" + "".join(f"{rep.best_epsilon:>{W}.3f}" for rep in reports.values()))
print(f"{'best / 1 run':<16}" + "".join(f"{rep.best_epsilon / eps_single:>{W}.2f}" for rep in reports.values()))
print("\ntightest bound per distribution:")
for name, rep in reports.items():
    theorem = next(r.theorem for r in rep.results if r.method == rep.best_method)
    print(f"  {name:<20} {rep.best_method:<9} {theorem.split(';')[0]}")

# %% [markdown]
# For comparison, the naive approach: a **fixed** number of runs K = E[K], every run accounted by
# composition (a fixed K has no selection theorem; `best` uses dp-accounting's PLD composition,
# exact for K runs).

# %%
eps_fixed = acc.epsilon(acc.RepeatAndSelect(base, acc.Fixed(MEAN)), delta=DELTA)
print(f"fixed K = {MEAN}, composition: epsilon = {eps_fixed:.3f} "
      f"({eps_fixed / eps_single:.2f} x one run)")

# %% [markdown]
# ## 3. Tune, then train the final model
#
# The usual release is the tuned run *and* a final model trained with the selected
# hyperparameters. Both are `DpEvent`s, so `dp_accounting.ComposedDpEvent` composes them: RDP
# curves add; the profile method composes through privacy-loss distributions.

# %%
tune = acc.RepeatAndSelect(base, acc.Poisson(mean=MEAN))
release = dpa.ComposedDpEvent([tune, base])
for method in ("rdp", "profile"):
    print(f"tune + final run, {method:<8}: epsilon = {acc.epsilon(release, DELTA, method):.3f}")
print(f"(tuning alone: {acc.epsilon(tune, DELTA):.3f}; final run alone: {eps_single:.3f})")

# %% [markdown]
# ## 4. Inverse questions
#
# **Which distribution of K, and how many candidates, does a budget afford?**
# `acc.plan(base, epsilon=..., delta=...)` answers for each family (also
# `jaxdp account --base ... --plan EPS` on the command line).

# %%
print(acc.plan(base, epsilon=8.0, delta=DELTA))

# %% [markdown]
# **How many runs fit a budget?** `acc.max_mean(base, family, epsilon=..., delta=...)` returns the
# largest E[K] whose tuning still meets the target (a bisection on E[K]; the answer is always on
# the private side). `family` is `"poisson"`, `"geometric"`, `"logarithmic"` or any callable
# mapping a mean to a distribution. The budget below is an input you choose.

# %%
EPS_BUDGET = 6.0
FAMILIES = {
    "Poisson": "poisson",
    "Geometric (eta=1)": "geometric",
    "Logarithmic (eta=0)": "logarithmic",
    "TNB eta=-0.5": lambda m: acc.TruncatedNegativeBinomial(-0.5, mean=m),
}
print(f"largest E[K] with epsilon <= {EPS_BUDGET} at delta = {DELTA:g}:")
print(f"{'distribution':<22}{'method=best':>14}{'method=rdp':>14}")
for name, family in FAMILIES.items():
    m_best = acc.max_mean(base, family, epsilon=EPS_BUDGET, delta=DELTA)
    m_rdp = acc.max_mean(base, family, epsilon=EPS_BUDGET, delta=DELTA, method="rdp")
    print(f"{name:<22}{m_best:>14.1f}{m_rdp:>14.1f}")

# %% [markdown]
# **How much noise does each run need?** `acc.calibrate_noise(sampling_prob, iterations,
# distribution, epsilon=..., delta=...)` returns the smallest noise multiplier σ such that
# tuning with K ~ `distribution` (each run: `iterations` DP-SGD steps at rate `sampling_prob`)
# meets the target; `distribution=None` calibrates a single run.
#
# A natural question: *how much more noise does a search with E[K] = 10 need to be exactly as
# private as the single run above?* As a sanity check, calibrating the single run itself should
# give back σ ≈ 1.1.

# %%
sigma_one = acc.calibrate_noise(q, steps, None, epsilon=eps_single, delta=DELTA)
print(f"single run, target epsilon {eps_single:.3f}: sigma = {sigma_one:.3f} (the run above used {sigma})")

calibrate = {"Poisson": acc.Poisson(mean=MEAN)} if SMALL else {
    name: make(MEAN) for name, make in DISTRIBUTIONS.items()}
for name, dist in calibrate.items():
    s = acc.calibrate_noise(q, steps, dist, epsilon=eps_single, delta=DELTA)
    check = acc.epsilon(acc.RepeatAndSelect(acc.dpsgd_event(q, s, steps), dist), delta=DELTA)
    print(f"tuning with K ~ {name}, E[K] = {MEAN}: sigma = {s:.3f} "
          f"({s / sigma:.2f} x), giving epsilon {check:.3f}")

# %% [markdown]
# ## 5. ε as a function of E[K]
#
# Solid lines: `method="best"`; dashed: Papernot & Steinke's RDP bounds alone. The dotted black
# line is a fixed K accounted by composition, and the horizontal line the single run. For the
# truncated negative binomial family, ε grows only logarithmically with E[K] (Papernot & Steinke,
# Thm 2). The Poisson bound (Thm 6: ε' = ε + μ·δ̂ + log(μ)/(λ − 1), where the run is also
# (ε̂, δ̂)-DP) has a term linear in the mean μ that takes over for large E[K]. Composition of a
# fixed K grows fastest.

# %%
means = np.geomspace(1.5, 100, 4 if SMALL else 16)
eps_best, eps_rdp = {}, {}
for name, make in DISTRIBUTIONS.items():
    events = [acc.RepeatAndSelect(base, make(m)) for m in means]
    eps_best[name] = [acc.epsilon(ev, delta=DELTA) for ev in events]
    eps_rdp[name] = [acc.epsilon(ev, delta=DELTA, method="rdp") for ev in events]
fixed_ks = np.unique(np.round(means).astype(int))
eps_fixed_k = [acc.epsilon(acc.RepeatAndSelect(base, acc.Fixed(int(k))), delta=DELTA) for k in fixed_ks]

fig, ax = plt.subplots(figsize=(7, 4.5))
for name in DISTRIBUTIONS:
    (line,) = ax.plot(means, eps_best[name], marker="o", ms=3, label=name)
    ax.plot(means, eps_rdp[name], ls="--", color=line.get_color())
ax.plot(fixed_ks, eps_fixed_k, "k:", marker="s", ms=3, label="fixed K (composition)")
ax.axhline(eps_single, color="gray", lw=1, label=f"single run ({eps_single:.2f})")
ax.set(xscale="log", yscale="log", xlabel="E[K] (expected number of training runs)",
       ylabel=f"epsilon of the search (delta={DELTA:g})",
       title="Tuning cost of DP-SGD (solid: best, dashed: RDP)")
plain_log_ticks(ax.xaxis)
plain_log_ticks(ax.yaxis)
ax.grid(alpha=0.3, which="both")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# ## 6. What the privacy buys: expected quantile of the released run
#
# Which E[K] is enough? Papernot & Steinke (Sec. 3.6) measure utility distribution-free: if each
# run's score is an independent draw, the released (best) run lies on average at quantile
# E[K / (K + 1)] of the score distribution (`acc.expected_quantile`; K = 0 counts as quantile 0).
# Plotting it against ε shows which distribution buys the most utility per unit of privacy.

# %%
fig, ax = plt.subplots(figsize=(7, 4.5))
for name, make in DISTRIBUTIONS.items():
    quantiles = [acc.expected_quantile(make(m)) for m in means]
    ax.plot(eps_best[name], quantiles, marker="o", ms=3, label=name)
ax.plot(eps_fixed_k, [acc.expected_quantile(acc.Fixed(int(k))) for k in fixed_ks], "k:", marker="s",
        ms=3, label="fixed K (composition)")
ax.axvline(eps_single, color="gray", lw=1, label="single run")
ax.set(xscale="log", xlabel=f"epsilon of the search (delta={DELTA:g}, method=best)",
       ylabel="expected quantile of the released run", title="Utility vs privacy of the search")
plain_log_ticks(ax.xaxis)
ax.grid(alpha=0.3, which="both")
ax.legend(fontsize=8)
plt.show()

print(f"at E[K] = {MEAN}:")
for name, make in DISTRIBUTIONS.items():
    print(f"  {name:<20} expected quantile {acc.expected_quantile(make(MEAN)):.3f}, "
          f"epsilon {reports[name].best_epsilon:.3f}")

# %% [markdown]
# **Take-aways.** Randomising the number of runs and releasing only the best one lets you tune
# at a small multiple of one run's ε; the report tells you which theorem gives the bound. Fix the
# distribution and its mean **before** looking at the data, and release nothing but the selected
# model (and its hyperparameters): the scores of the other runs are not covered. The next
# notebook does exactly that with `jaxdp.tuning.random_search`.
