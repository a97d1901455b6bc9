import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxdp import models
from jaxdp.train import clipping


def _setup(name, shape, random_params, batch=4, conv_impl="im2col"):
  model = models.get_model(name, num_classes=10, conv_impl=conv_impl, activation="tanh")
  x = jax.random.normal(jax.random.key(0), (batch,) + shape)
  y = jnp.arange(batch) % 10
  params = random_params(model, x[:1], seed=1)  # no init compile

  def loss_fn(p, batch):
    xb, yb = batch
    return optax.softmax_cross_entropy_with_integer_labels(model.apply(p, xb), yb)
  return loss_fn, params, x, y


@pytest.mark.parametrize("name,shape,conv_impl", [
    ("logreg", (8, 8, 1), "im2col"),
    ("mlp", (8, 8, 1), "im2col"),
    # 7 s of compiling a Python loop of per-example CNN gradients: CI's slow set runs it.
    pytest.param("papernot_steinke_cnn", (6, 6, 1), "im2col", marks=pytest.mark.slow),
])
def test_per_example_grads_equal_python_loop(name, shape, conv_impl, random_params):
  loss_fn, params, x, y = _setup(name, shape, random_params, conv_impl=conv_impl)
  grads, losses = jax.jit(clipping.per_example_grads, static_argnums=0)(loss_fn, params, (x, y))
  single = jax.jit(jax.value_and_grad(lambda p, xi, yi: loss_fn(p, (xi[None], yi[None]))[0]))
  for i in range(x.shape[0]):
    loss_i, grad_i = single(params, x[i], y[i])
    np.testing.assert_allclose(losses[i], loss_i, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(grad_i)):
      np.testing.assert_allclose(a[i], b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("clip", [1e-3, 0.1, 1.0, 100.0])
def test_clipped_norms_at_most_c_and_small_ones_untouched(clip):
  grads = {"w": jax.random.normal(jax.random.key(0), (64, 7, 3)) * jnp.logspace(-4, 2, 64)[:, None, None],
           "b": jax.random.normal(jax.random.key(1), (64, 5))}
  clipped, norms = clipping.clip_per_example(grads, clip)
  np.testing.assert_allclose(
      norms, np.sqrt((np.asarray(grads["w"]) ** 2).sum((1, 2)) + (np.asarray(grads["b"]) ** 2).sum(1)),
      rtol=1e-5)
  new_norms = clipping.per_example_global_norms(clipped)
  assert np.all(new_norms <= clip * (1 + 1e-6))
  small = norms <= clip
  for key in grads:
    np.testing.assert_array_equal(np.asarray(clipped[key])[small], np.asarray(grads[key])[small])
  np.testing.assert_allclose(new_norms[~small], clip, rtol=1e-5)


def test_non_finite_gradient_contributes_exactly_zero():
  g = jnp.array([[3.0, 4.0], [jnp.nan, 1.0], [jnp.inf, 0.0], [0.0, 0.0]])
  clipped, _ = clipping.clip_per_example({"g": g}, 1.0)
  np.testing.assert_allclose(clipped["g"], [[0.6, 0.8], [0, 0], [0, 0], [0, 0]], rtol=1e-6)
  np.testing.assert_allclose(clipping.weighted_sum({"g": g}, jnp.array([1.0, 0.0, 0.0, 2.0]))["g"],
                             [3.0, 4.0])


def test_masked_padding_changes_nothing(random_params):
  loss_fn, params, x, y = _setup("mlp", (8, 8, 1), random_params, batch=6)
  fn = jax.jit(clipping.clipped_grad_sum, static_argnums=0)
  mask = jnp.array([True] * 4 + [False] * 2)
  ref, n_ref = fn(loss_fn, params, (x, y), mask, 0.5)
  # Padding rows full of NaN (a worst case for 0 * x arithmetic) must not matter.
  garbage = x.at[4:].set(jnp.nan)
  got, n_got = fn(loss_fn, params, (garbage, y), mask, 0.5)
  assert float(n_ref) == float(n_got) == 4.0
  for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(got)):
    np.testing.assert_array_equal(a, b)
  assert any(float(jnp.abs(a).sum()) > 0 for a in jax.tree.leaves(ref))


def test_clipped_grad_sum_matches_manual_clip_and_sum(random_params):
  loss_fn, params, x, y = _setup("logreg", (8, 8, 1), random_params, batch=5)
  mask = jnp.array([True, False, True, True, False])
  got, _ = jax.jit(clipping.clipped_grad_sum, static_argnums=0)(loss_fn, params, (x, y), mask, 0.3)
  single = jax.grad(lambda p, xi, yi: loss_fn(p, (xi[None], yi[None]))[0])
  want = jax.tree.map(jnp.zeros_like, params)
  for i in np.flatnonzero(mask):
    g = single(params, x[i], y[i])
    norm = float(jnp.sqrt(sum(jnp.sum(l ** 2) for l in jax.tree.leaves(g))))
    want = jax.tree.map(lambda w, gi: w + gi * min(1.0, 0.3 / norm), want, g)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_optax_clip_transform_matches_function_and_keeps_norm_in_state(random_params):
  loss_fn, params, x, y = _setup("logreg", (8, 8, 1), random_params, batch=5)
  mask = jnp.array([True, True, False, True, True])
  grads, _ = clipping.per_example_grads(loss_fn, params, (x, y))
  tx = clipping.clip_per_example_l2(0.2)
  state = tx.init(params)
  assert isinstance(state, clipping.ClipState)
  np.testing.assert_allclose(state.l2_clip_norm, 0.2)
  got, _ = tx.update(grads, state, params, mask=mask)
  want, _ = clipping.clipped_grad_sum(loss_fn, params, (x, y), mask, 0.2)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_batch_may_be_any_pytree_with_examples_leading():
  # A dict batch with leaves of different trailing shapes: each example's
  # gradient sees only its own row of every leaf.
  params = {"w": jnp.array([0.5, -1.0, 2.0])}
  batch = {"x": jnp.arange(12.0).reshape(4, 3) / 10, "y": jnp.array([1.0, 0.0, -1.0, 2.0]),
           "weight": jnp.array([[1.0], [2.0], [0.5], [3.0]])}

  def loss_fn(p, b):
    return 0.5 * b["weight"][:, 0] * (b["x"] @ p["w"] - b["y"]) ** 2
  grads, losses = clipping.per_example_grads(loss_fn, params, batch)
  residual = np.asarray(batch["x"] @ params["w"] - batch["y"])
  want = np.asarray(batch["weight"]) * residual[:, None] * np.asarray(batch["x"])
  np.testing.assert_allclose(grads["w"], want, rtol=1e-5)
  np.testing.assert_allclose(losses, 0.5 * np.asarray(batch["weight"][:, 0]) * residual ** 2, rtol=1e-5)
  got, count = clipping.clipped_grad_sum(loss_fn, params, batch, jnp.array([True, True, False, True]), 1.0)
  norms = np.linalg.norm(want, axis=1)
  keep = np.array([1.0, 1.0, 0.0, 1.0]) * np.minimum(1.0, 1.0 / norms)
  np.testing.assert_allclose(got["w"], keep @ want, rtol=1e-5)
  assert float(count) == 3.0
