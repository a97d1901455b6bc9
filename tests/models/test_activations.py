"""`jaxdp.models.activations`: the tempered sigmoid and its bad input."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxdp import models


def test_tempered_sigmoid_defaults_to_tanh_and_follows_formula():
  x = jnp.linspace(-3.0, 3.0, 13)
  np.testing.assert_allclose(models.TemperedSigmoid()(x), jnp.tanh(x), atol=1e-6)
  np.testing.assert_allclose(models.get_activation("tempered_sigmoid")(x), jnp.tanh(x), atol=1e-6)
  ts = models.TemperedSigmoid(scale=3.0, inverse_temperature=0.5, offset=0.25)
  np.testing.assert_allclose(ts(x), 3.0 / (1.0 + np.exp(-0.5 * np.asarray(x))) - 0.25, rtol=1e-5)


@pytest.mark.parametrize("kwargs,match", [
    (dict(scale=0.0), "scale"),
    (dict(inverse_temperature=-1.0), "inverse_temperature"),
    (dict(offset=float("nan")), "offset"),
])
def test_tempered_sigmoid_rejects_bad_input(kwargs, match):
  with pytest.raises(ValueError, match=match):
    models.TemperedSigmoid(**kwargs)
