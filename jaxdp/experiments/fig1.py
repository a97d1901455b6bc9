"""Papernot & Steinke (ICLR 2022), Figure 1: a tuned hyperparameter reveals outliers.

A soft-margin linear SVM, l(w, b; x, y) = ||w||^2 + alpha * max(0, 1 - y (w.x + b)),
is trained by (sub)gradient descent in JAX on 40 points from two isotropic 2-D
Gaussians (std 1; negative class at (7.86, -3.36), positive at (6.42, -9.17)),
and again after adding 8 outliers at (7.9, -8.0) labelled negative. Training
accuracy as a function of alpha has a different maximiser with and without
the outliers, so releasing the tuned alpha (non-privately) tells whether the
outliers were in the data. Every alpha is trained at once with `jax.vmap`;
curves are averaged over several random draws of the 40 points.

  python experiments/fig1.py [--out figures] [--datasets 20]   (or python -m jaxdp.experiments.fig1)
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxdp.experiments import common

NEG_CENTRE = (7.86, -3.36)
POS_CENTRE = (6.42, -9.17)
OUTLIER = (7.9, -8.0)
N_OUTLIERS = 8
ALPHAS = tuple(float(a) for a in np.geomspace(0.01, 100.0, 41))


def make_data(key: jax.Array, n_per_class: int = 20, outliers: bool = False):
  """40 points (20 per class) and, optionally, 8 negative outliers; labels in {-1, +1}."""
  k_neg, k_pos = jax.random.split(key)
  neg = jnp.asarray(NEG_CENTRE) + jax.random.normal(k_neg, (n_per_class, 2))
  pos = jnp.asarray(POS_CENTRE) + jax.random.normal(k_pos, (n_per_class, 2))
  x = [neg, pos]
  y = [-jnp.ones(n_per_class), jnp.ones(n_per_class)]
  if outliers:
    x.append(jnp.tile(jnp.asarray(OUTLIER), (N_OUTLIERS, 1)))
    y.append(-jnp.ones(N_OUTLIERS))
  return jnp.concatenate(x), jnp.concatenate(y)


def train_svm(x: jax.Array, y: jax.Array, alpha: jax.Array, steps: int = 4000, lr: float = 0.05):
  """Subgradient descent on mean_i [||w||^2 + alpha hinge_i], with a decaying step size."""

  def objective(params):
    w, b = params
    margins = y * (x @ w + b)
    return jnp.sum(w**2) + alpha * jnp.mean(jnp.maximum(0.0, 1.0 - margins))

  grad = jax.grad(objective)

  def step(params, t):
    g = grad(params)
    eta = lr / (1.0 + alpha) / (1.0 + t / 500.0)  # stable for every alpha on the grid
    return jax.tree.map(lambda p, gp: p - eta * gp, params, g), None

  params, _ = jax.lax.scan(step, (jnp.zeros(2), jnp.zeros(())), jnp.arange(steps, dtype=jnp.float32))
  return params


@jax.jit
def accuracy_curve(x, y, alphas):
  """Training accuracy for every alpha (vmapped)."""

  def one(alpha):
    w, b = train_svm(x, y, alpha)
    return jnp.mean(jnp.sign(x @ w + b) == y)

  return jax.vmap(one)(alphas)


def run(n_datasets: int, seed: int = 0) -> dict:
  alphas = jnp.asarray(ALPHAS)
  keys = jax.random.split(jax.random.key(seed), n_datasets)
  curves = {}
  for outliers in (False, True):
    accs = np.stack([np.asarray(accuracy_curve(*make_data(k, outliers=outliers), alphas)) for k in keys])
    curves[outliers] = accs
  return curves


def main(argv: Optional[Sequence[str]] = None, prog: str = "python -m jaxdp.experiments.fig1") -> int:
  parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
  parser.add_argument("--out", default="figures", help="output directory (default: figures)")
  parser.add_argument("--datasets", type=int, default=20, help="random draws of the 40 points to average (>= 1)")
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args(argv)
  try:
    if args.datasets < 1:
      raise common.UsageError(f"--datasets must be >= 1, got {args.datasets}")
    out = common.check_writable_dir(args.out)
  except common.UsageError as err:
    print(f"error: {err}", file=sys.stderr)
    return 2
  curves = run(args.datasets, args.seed)
  common.use_headless_matplotlib()
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  rows = []
  fig, ax = plt.subplots(figsize=(6, 4))
  for outliers, label in ((False, "without outliers"), (True, f"with {N_OUTLIERS} outliers at {OUTLIER}")):
    acc = curves[outliers]
    mean, se = acc.mean(0), acc.std(0, ddof=1) / np.sqrt(acc.shape[0]) if acc.shape[0] > 1 else 0 * acc[0]
    best = ALPHAS[int(np.argmax(mean))]
    ax.plot(ALPHAS, mean, marker="o", ms=3, label=f"{label} (best alpha {best:.3g})")
    ax.fill_between(ALPHAS, mean - se, mean + se, alpha=0.2, lw=0)
    rows += [dict(outliers=outliers, alpha=a, train_accuracy_mean=m, train_accuracy_stderr=s, datasets=acc.shape[0])
             for a, m, s in zip(ALPHAS, mean, se)]
  ax.set_xscale("log")
  ax.set_xlabel("regularisation weight alpha (weight of the hinge loss)")
  ax.set_ylabel(f"training accuracy (mean of {args.datasets} draws)")
  ax.set_title("Papernot & Steinke Fig. 1: tuned alpha reveals outliers", fontsize=10)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  with common.staged_outputs(out) as stage:
    fig.savefig(os.path.join(stage, "fig1.png"), dpi=130)
    fig.savefig(os.path.join(stage, "fig1.pdf"))
    with open(os.path.join(stage, "fig1.csv"), "w", newline="") as f:
      writer = csv.DictWriter(f, fieldnames=list(rows[0]))
      writer.writeheader()
      writer.writerows(rows)
  plt.close(fig)
  for outliers in (False, True):
    mean = curves[outliers].mean(0)
    print(f"{'with' if outliers else 'without'} outliers: best alpha {ALPHAS[int(np.argmax(mean))]:.3g}, "
          f"accuracy {mean.max():.3f}")
  print(f"wrote {os.path.join(out, 'fig1.png')} (+ .pdf, .csv)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
