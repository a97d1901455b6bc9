"""jaxdp: differentially private hyperparameter tuning in JAX.

Subpackages:
  accounting  (eps, delta) of "run a DP training K times, release the best" and friends.
  train       DP-SGD of any task (Flax model, loss, score, optax optimizer) with one DP plan.
  models      the networks of the papers (Flax).
  data        TFDS loaders and offline MNIST / digits.
  sweep       many candidates in one compiled program, a durable pool, a trial simulator.
  tuning      private random search, threshold search, tuning on a subset.
"""

__version__ = "0.1.0"
