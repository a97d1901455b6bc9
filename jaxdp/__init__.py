"""jaxdp: differentially private hyperparameter tuning in JAX.

Subpackages:
  accounting  privacy accounting for "repeat a DP run K times, release the best".
"""

__version__ = "0.1.0"
