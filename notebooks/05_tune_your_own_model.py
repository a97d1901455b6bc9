# %% [markdown]
# # Tune your own model: a private search over your Flax model, loss, score and optimizer
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/jaxdp/jaxdp/blob/main/notebooks/05_tune_your_own_model.ipynb)
#
# jaxdp is not limited to its built-in classifiers. A `jaxdp.train.Task` is any Flax module (or
# plain `init`/`apply` functions), any per-example loss over any batch pytree, any score and any
# optax optimizer built from the hyperparameters; the data are any pytree of NumPy arrays. jaxdp
# adds what makes it private: per-example clipping, Gaussian noise, Poisson sampling, the
# accounting of the whole search, and the release of the best candidate only.
#
# This notebook tunes a small MLP on scikit-learn's breast-cancer data (569 examples, 30 features,
# shipped with scikit-learn, no download):
#
# 1. the data as a dict of arrays, split into private training data, a private validation split
#    and a public test split;
# 2. a task of our own: model, loss, score, optax optimizer;
# 3. a dry run: the ε of the search, the noise calibrated for a target ε, what compiles;
# 4. the private random search with `target_epsilon`: the noise is calibrated so that the
#    **whole search** (not one run) meets the budget;
# 5. a DP score on the private validation split instead of the public test split, and what it
#    costs.

# %%
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

# %% [markdown]
# ## 1. Data: private training data, private validation, public test
#
# A `jaxdp.data.Dataset` holds up to three splits, each any pytree of arrays with the examples
# on the leading axis (here dicts `{"x": features, "y": labels}`):
#
# * `train`: the private data. Only DP-SGD reads it.
# * `test`: **public** data. A plain score function reads it, and nothing computed on it is
#   accounted, so it must really be public (as the papers' test sets are treated).
# * `private_validation`: private held-out data. Only a DP score (`NoisyMean`, `DpScore`) reads
#   it, and its privacy cost is accounted (section 5).
#
# The split comes from a fixed permutation that does not depend on the data. The features are
# standardised with statistics of the **public** split: statistics of the private training data
# would themselves be a release that nothing accounts.

# %%
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


# %% [markdown]
# ## 2. The task: model, loss, score, optimizer
#
# * **model**: any Flax module; here a factory `hp -> MLP(width=hp["width"])`, so the width is
#   a hyperparameter.
# * **loss**: `(outputs, batch) -> per-example losses` of shape (b,); DP-SGD clips each
#   example's gradient of it. The model input is `batch["x"]` by default (`Task(inputs=...)`
#   changes that).
# * **score**: what selects the released candidate (higher is better), here accuracy on the
#   public test split.
# * **optimizer**: a factory `hp -> optax.GradientTransformation`. It receives the privatised
#   mean gradient (clipped, noised, divided by the expected batch size q·N), so any optax chain
#   is post-processing and costs no privacy.
#
# **Traced and static hyperparameters.** Floats that the model factory does not read
# (`learning_rate`, `weight_decay`) are *traced*: candidates that differ only in them are
# vmapped inside one compiled program. Everything else (ints, strings, objects, and anything the
# model factory reads, such as `width`) is *static*: the engine compiles once per distinct set of
# static values. A float the optimizer factory needs as a concrete value (an optax schedule's
# peak, say) is detected and made static too; the dry run says which and why. A hyperparameter
# neither factory reads is an error, not a silent no-op.
#
# **Privacy parameters.** `batch_size=50` is an *expected* batch: every example joins each
# step's batch independently with probability q = 50 / N. jaxdp treats the training set size N
# as public: it sets q and divides every update by q·N. The noise multiplier given here is a
# placeholder that `target_epsilon` replaces.

# %%
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

# %% [markdown]
# ## 3. Dry run
#
# The grid has 16 points: 4 learning rates × 2 weight decays × 2 widths. The number of candidates
# K ~ Poisson is drawn independently of the data. `dry_run` checks every argument and the task on
# the data's shapes, calibrates the noise multiplier σ so that the whole search meets the target
# ε, and shows the groups that will compile, all without training.

# %%
GRID = {"learning_rate": [3e-3, 1e-2, 3e-2, 1e-1], "weight_decay": [0.0, 1e-2], "width": [8, 32]}
K = acc.Poisson(mean=4 if SMALL else 6)
TARGET_EPSILON = 3.0
print(dry_run(config, GRID, data, distribution=K, target_epsilon=TARGET_EPSILON, target_delta=DELTA))

# %% [markdown]
# ## 4. The private random search
#
# `random_search(..., target_epsilon=...)` calibrates σ as the dry run did, draws K and K grid
# points, trains the candidates and releases only the best one, with the ε of the whole search
# re-accounted from the configurations that ran. The score read the public test split, so its
# use is not accounted (`score_source` says so).

# %%
result = random_search(config, GRID, data, distribution=K, target_epsilon=TARGET_EPSILON, target_delta=DELTA,
                       key=jax.random.key(0))
print(f"noise multiplier sigma = {result.noise_multiplier:.3f}")
print(f"released: {result.hyperparameters}")
print(f"score: {result.score:.3f} ({result.score_source})")
print(f"epsilon of the whole search: {result.epsilon:.3f} at delta = {result.delta:g}")


# %% [markdown]
# The released parameters are an ordinary Flax parameter tree:

# %%
def public_test_accuracy(res):
    if res.params is None:
        return float("nan")  # nothing released (K = 0 or every candidate diverged)
    model = MLP(width=res.config.hparams["width"])
    return float(accuracy(model.apply(res.params, data.test["x"]), data.test))


print(f"released model on the public test split: accuracy {public_test_accuracy(result):.3f}")

# %% [markdown]
# ## 5. When no public data is available: a DP score
#
# A score can be computed privately on the `private_validation` split instead. jaxdp has two
# kinds, and accounts both:
#
# * `NoisyMean(fn, low, high, noise_multiplier, num_examples=n)`: `fn(outputs, batch)` gives
#   one value per example, clipped to [low, high]; the score is their sum plus Gaussian noise,
#   divided by the declared public validation size n (never by the count of private rows,
#   which would itself leak). Its `GaussianDpEvent(noise_multiplier)` is composed into every
#   candidate's event.
# * `DpScore(fn, event)`: your own randomised score `fn(outputs, batch, key)` and the
#   `dp_accounting.DpEvent` you vouch for.
#
# Below the same search with a `NoisyMean` accuracy on the 100 private validation examples
# (noise std 0.02 on the accuracy) and the training noise of section 4: every candidate now
# also pays for its score, so ε grows. (With `target_epsilon` the search would instead
# calibrate a larger training σ; accounting a composed candidate by privacy profiles is slower,
# so this notebook keeps σ fixed.)

# %%
SCORE_NOISE = 4.0
private_task = dataclasses.replace(
    task, score=NoisyMean(lambda logit, batch: (logit > 0) == (batch["y"] > 0.5), low=0.0, high=1.0,
                          noise_multiplier=SCORE_NOISE, num_examples=100))
private_config = config.replace(task=private_task, noise_multiplier=result.noise_multiplier)
private_result = random_search(private_config, GRID, data, distribution=K, target_delta=DELTA,
                               key=jax.random.key(0))
print(f"released: {private_result.hyperparameters}")
print(f"score: {private_result.score:.3f} ({private_result.score_source})")
print(f"epsilon of the whole search: {private_result.epsilon:.3f} at delta = {DELTA:g} "
      f"(section 4, same training noise: {result.epsilon:.3f})")
print(f"released model on the public test split: accuracy {public_test_accuracy(private_result):.3f}")

# %% [markdown]
# The released score is the best of K noisy scores on a small validation split, so it is an
# optimistic estimate of the released model's accuracy; here the public test split, which this
# demo also has, gives an unbiased check.
#
# ### The price of the DP score as the search grows
#
# ε of the search against E[K] at the training noise of section 4, for both scores (by
# Papernot & Steinke's RDP bound, which is quick to compute; the searches above report the
# tighter `method="best"`).

# %%
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

# %% [markdown]
# **Take-aways.** Bring any Flax model, loss, score and optax optimizer; jaxdp privatises the
# gradients, accounts the whole search and releases one candidate. Decide where the score comes
# from: a public test split costs nothing but must really be public; a DP score on private
# validation data is accounted. The training set size N is treated as public (it sets q = b/N
# and scales every update), and the key must stay secret. See the guide "Privacy
# assumptions" (docs/guides/privacy.md) for the full list.
