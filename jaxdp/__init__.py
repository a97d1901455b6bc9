"""jaxdp: differentially private hyperparameter tuning in JAX.

Subpackages:
  accounting  (eps, delta) of "run a DP training K times, release the best" and friends.
  train       DP-SGD / DP-Adam with per-example clipping and honest Poisson sampling.
  models      the networks of the papers (Flax).
  data        TFDS loaders and offline MNIST / digits.
  sweep       many candidates in one compiled program, a durable pool, a trial simulator.
  tuning      private random search, threshold search, tuning on a subset.
"""

__version__ = "0.1.0"
