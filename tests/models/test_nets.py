"""`jaxdp.models.nets` and `layers`: the presets' shapes and parameter counts, im2col convolutions, bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdp import models


def _count(params):
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))


@pytest.mark.parametrize("name,shape,expected_params", [
    ("papernot_steinke_cnn", (28, 28, 1), 102570),
    ("opacus_cnn", (28, 28, 1), 26010),   # Opacus' MNIST example has 26,010 parameters
    ("mlp", (28, 28, 1), 784 * 120 + 120 + 120 * 120 + 120 + 120 * 10 + 10),
    ("logreg", (28, 28, 1), 7850),
    ("logreg", (4096,), 4096 * 2 + 2),
])
def test_output_shape_and_parameter_count(name, shape, expected_params):
  num_classes = 2 if shape == (4096,) else 10
  model = models.get_model(name, num_classes=num_classes)
  x = jax.ShapeDtypeStruct((3,) + shape, jnp.float32)
  params = jax.eval_shape(model.init, jax.random.key(0), x)
  assert jax.eval_shape(model.apply, params, x).shape == (3, num_classes)
  assert _count(params) == expected_params


@pytest.mark.parametrize("name,size", [
    pytest.param("papernot_steinke_cnn", 6, marks=pytest.mark.slow),  # 6 s; CI's slow set runs it
    pytest.param("opacus_cnn", 28, marks=pytest.mark.slow),
])
def test_im2col_equals_native_convolution(name, size, random_params):
  x = jax.random.normal(jax.random.key(1), (3, size, size, 1))
  y = jnp.arange(3) % 10
  fast = models.get_model(name, num_classes=10, conv_impl="im2col")
  ref = models.get_model(name, num_classes=10, conv_impl="native")
  params = random_params(ref, x, seed=2)  # same tree for both lowerings; no init compile

  def loss(m, p):
    logits = m.apply(p, x)
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1))

  np.testing.assert_allclose(jax.jit(fast.apply)(params, x), jax.jit(ref.apply)(params, x),
                             rtol=1e-4, atol=1e-5)
  g_fast = jax.jit(jax.grad(lambda p: loss(fast, p)))(params)
  g_ref = jax.jit(jax.grad(lambda p: loss(ref, p)))(params)
  for a, b in zip(jax.tree.leaves(g_fast), jax.tree.leaves(g_ref)):
    np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("kernel,strides,padding", [
    ((3, 3), (1, 1), "SAME"), ((3, 3), (2, 2), "SAME"), ((8, 8), (2, 2), ((3, 3), (3, 3))),
    ((4, 4), (2, 2), "VALID"), ((2, 3), (1, 2), ((0, 1), (2, 0))),
])
def test_conv2d_im2col_equals_native_layer(kernel, strides, padding, random_params):
  x = jax.random.normal(jax.random.key(0), (2, 11, 13, 3))
  fast = models.Conv2D(4, kernel, strides, padding, "im2col")
  ref = models.Conv2D(4, kernel, strides, padding, "native")
  # Same parameter tree for both lowerings; random values need no init compile.
  params = random_params(ref, x, seed=1)
  params = jax.tree.map(lambda p: p + 0.1, params)  # non-zero bias
  np.testing.assert_allclose(jax.jit(fast.apply)(params, x), jax.jit(ref.apply)(params, x),
                             rtol=1e-4, atol=1e-5)


def test_papernot_steinke_spatial_path():
  # 28 -> 28 -> 14 -> 14 -> 7 -> 7 under SAME padding with strides (1,2,1,2,1).
  model = models.PapernotSteinkeCNN(num_classes=10)
  x = jnp.ones((1, 28, 28, 1))
  params = jax.eval_shape(model.init, jax.random.key(0), x)
  kernels = [params["params"][f"Conv2D_{i}"]["kernel"].shape for i in range(5)]
  assert kernels == [(3, 3, 1, 32), (3, 3, 32, 32), (3, 3, 32, 64), (3, 3, 64, 64), (3, 3, 64, 64)]
  _, state = jax.eval_shape(lambda p: model.apply(p, x, capture_intermediates=True,
                                                  mutable=["intermediates"]), params)
  shapes = [state["intermediates"][f"Conv2D_{i}"]["__call__"][0].shape[1:3] for i in range(5)]
  assert shapes == [(28, 28), (14, 14), (14, 14), (7, 7), (7, 7)]


def test_activation_option_changes_the_model():
  x = jax.random.normal(jax.random.key(0), (2, 8, 8, 1))
  relu = models.MLP(num_classes=10, activation="relu")
  ts = models.MLP(num_classes=10, activation=models.TemperedSigmoid(scale=1.5))
  params = jax.jit(relu.init)(jax.random.key(1), x)
  assert not np.allclose(jax.jit(relu.apply)(params, x), jax.jit(ts.apply)(params, x))


@pytest.mark.parametrize("kwargs,match", [
    (dict(name="resnet", num_classes=10), "model must be one of"),
    (dict(name="mlp", num_classes=1), "num_classes"),
    (dict(name="mlp", num_classes=10, activation="gelu"), "activation"),
    (dict(name="opacus_cnn", num_classes=10, conv_impl="fft"), "conv_impl"),
])
def test_get_model_rejects_bad_input(kwargs, match):
  name = kwargs.pop("name")
  with pytest.raises(ValueError, match=match):
    models.get_model(name, **kwargs)
