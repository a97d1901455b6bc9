"""jaxdp: differentially private hyperparameter tuning in JAX.

Subpackages:
  accounting  (eps, delta) of "run a DP training K times, release the best" and friends.
  train       DP-SGD of any task (Flax model, loss, score, optax optimizer) with one DP plan.
  models      the networks of the papers (Flax).
  data        TFDS loaders and offline MNIST / digits.
  sweep       many candidates in one compiled program, a durable pool, a trial simulator.
  tuning      private random search, threshold search, tuning on a subset.
  audit       empirical lower bounds on the epsilon of a whole search.

`jaxdp.clear_caches()` empties every bounded cache of the package (accounting
curves and PLDs, compiled programs, shape checks).
"""

from jaxdp._cache import clear_caches

__version__ = "0.1.0"
__all__ = ["clear_caches", "__version__"]
