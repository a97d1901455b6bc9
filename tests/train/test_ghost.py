"""Ghost clipping gives the vmap path's clipped sum, and never claims a shared kernel.

Every comparison is against `clipping.clipped_grad_sum` (per-example
gradients materialised by vmap) in float32 with rtol 1e-5, atol 1e-6: the
two paths compute the same sums in a different order (and the norms by the
Gram or direct formula), so they agree to rounding, not bit for bit. Each
path clips against its own rigorous upper bound of an example's norm, with
rounding (`jaxdp.train.clipping`), so a clipped example adds C (1 - s) with a
slack s that differs between them: at most CLIP_SLACK here (measured up to
8e-5 for the Gram form of the Opacus CNN, 5e-6 on the vmap path); the
comparisons allow each example's clipped gradient to differ by that much.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxdp.data import DataSplit
from jaxdp.train import clipping, presets
from jaxdp.train.ghost import ghost_clipped_grad_sum
from jaxdp.train.ghost_analysis import ghost_layers

RTOL, ATOL = 1e-5, 1e-6
CLIP_SLACK = 2e-4


@functools.partial(jax.jit, static_argnums=0)
def _both(loss_fn, params, batch, mask, relative_clip):
  """Both paths at C = relative_clip x the median finite per-example norm; also returns the norms."""
  grads, _ = clipping.per_example_grads(loss_fn, params, batch)
  norms = clipping.per_example_global_norms(grads)
  clip = relative_clip * jnp.median(jnp.where(jnp.isfinite(norms), norms, 0.0))
  # sum_i |w_i g_i| per coordinate (w_i = min(1, C / ||g_i||), unmasked finite rows): how far
  # the two paths' sums may move apart when each clipped example shrinks by CLIP_SLACK.
  factors = jnp.where(mask & jnp.isfinite(norms), jnp.minimum(1.0, clip / norms), 0.0)
  mass = jax.tree.map(lambda g: jnp.tensordot(factors, jnp.abs(jnp.where(
      jnp.isfinite(g), g, 0.0)), axes=1), grads)
  return (clipping.clipped_grad_sum(loss_fn, params, batch, mask, clip),
          ghost_clipped_grad_sum(loss_fn, params, batch, mask, clip), norms, clip, mass)


def _assert_same(loss_fn, params, batch, mask, relative_clip=1.0):
  (want, want_count), (got, got_count), norms, clip, mass = _both(loss_fn, params, batch, mask,
                                                                  relative_clip)
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for (path, w), g, m in zip(jax.tree_util.tree_leaves_with_path(want), jax.tree.leaves(got),
                             jax.tree.leaves(mass)):
    assert g.shape == w.shape and g.dtype == w.dtype, jax.tree_util.keystr(path)
    assert np.all(np.isfinite(g)), jax.tree_util.keystr(path)
    np.testing.assert_array_less(np.abs(np.asarray(g) - np.asarray(w)),
                                 RTOL * np.abs(np.asarray(w)) + ATOL + CLIP_SLACK * np.asarray(m),
                                 err_msg=jax.tree_util.keystr(path))
  assert got_count.dtype == jnp.float32 and got_count == want_count == np.sum(mask)
  return norms, clip


def _classifier_loss(model):
  def loss_fn(p, batch):
    x, y = batch
    return optax.softmax_cross_entropy_with_integer_labels(model.apply(p, x), y)
  return loss_fn


def _data(shape, batch, seed=0):
  x = jax.random.normal(jax.random.key(seed), (batch,) + shape)
  return x, jnp.arange(batch) % 3


class MLP(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = jnp.tanh(nn.Dense(16)(x.reshape(x.shape[0], -1)))
    x = jnp.tanh(nn.Dense(8, use_bias=False)(x))
    return nn.Dense(3)(x)


# One loss function object (and batch shape) for the MLP tests, so the jitted
# steps compile once for all of them.
_MLP_LOSS = _classifier_loss(MLP())
_ghost = jax.jit(ghost_clipped_grad_sum, static_argnums=0)


@pytest.mark.parametrize("relative_clip", [0.5, 1.0, 1e6], ids=["most-clipped", "half", "none"])
def test_mlp_matches_vmap_path(relative_clip, random_params):
  x, y = _data((5,), 8)
  params = random_params(MLP(), x[:1], seed=1)
  mask = jnp.arange(8) < 6  # two padding rows
  norms, clip = _assert_same(_MLP_LOSS, params, (x, y), mask, relative_clip)
  if relative_clip == 1.0:  # the median splits the real rows: some clipped, some not
    assert np.any(norms[:6] > clip) and np.any(norms[:6] < clip)
  split = ghost_layers(_MLP_LOSS, params, (x, y))
  assert split.fallback_leaves == () and [layer.reason for layer in split.layers] == [None] * 3


class ConvNet(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = jnp.tanh(nn.Conv(4, (3, 3), strides=2, padding="SAME")(x))
    x = jnp.tanh(nn.Conv(5, (2, 3), padding="VALID", kernel_dilation=2)(x))
    x = jnp.tanh(nn.Conv(4, (3, 3), padding="CIRCULAR", use_bias=False)(x))
    x = jnp.tanh(nn.Conv(4, (2, 2), padding=((1, 0), (0, 1)), input_dilation=2)(x))
    x = jnp.tanh(nn.Conv(4, (3, 3), feature_group_count=2)(x))  # not ghost: falls back
    return nn.Dense(3)(x.reshape(x.shape[0], -1))


@pytest.mark.slow  # 6 s; nn.Conv's ghost path runs in tests/adversarial/test_clipping.py's default set (conv-1x1)
def test_conv_padding_modes_match_vmap_path(random_params):
  x, y = _data((9, 9, 2), 6)
  model = ConvNet()
  params = random_params(model, x[:1], seed=2)
  _assert_same(_classifier_loss(model), params, (x, y), jnp.arange(6) != 2)
  split = ghost_layers(_classifier_loss(model), params, (x, y))
  assert [(layer.module, layer.reason) for layer in split.layers] == [
      ("Conv_0", None), ("Conv_1", None), ("Conv_2", None), ("Conv_3", None),
      ("Conv_4", "feature_group_count != 1"), ("Dense_0", None)]
  assert split.fallback_leaves == ("['params']['Conv_4']['bias']", "['params']['Conv_4']['kernel']")


@pytest.mark.parametrize("model,conv_impl,shape", [
    ("logreg", "im2col", (4, 4, 1)),
    ("mlp", "im2col", (4, 4, 1)),
    # Both lowerings (7 s and 6 s of compiling) in the slow set (the 5-minute budget); Conv2D's
    # im2col ghost path runs in tests/adversarial/test_clipping.py's default set (conv2d-im2col).
    pytest.param("papernot_steinke_cnn", "im2col", (4, 4, 1), marks=pytest.mark.slow),
    pytest.param("papernot_steinke_cnn", "native", (4, 4, 1), marks=pytest.mark.slow),
    pytest.param("opacus_cnn", "im2col", (28, 28, 1), marks=pytest.mark.slow),
], ids=["logreg", "mlp", "papernot-im2col", "papernot-native", "opacus"])
def test_preset_models_are_all_ghost_and_match(model, conv_impl, shape, random_params):
  task = presets.classifier(10, conv_impl=conv_impl)
  hparams = dict(model=model, learning_rate=0.1)
  module = task.model(hparams)
  x = jax.random.normal(jax.random.key(0), (4,) + shape)
  batch = DataSplit(x, jnp.arange(4))
  params = random_params(module, x[:1], seed=3)
  loss_fn = task.per_example_loss(task.model_for(hparams))
  _assert_same(loss_fn, params, batch, jnp.array([True, True, True, False]))
  # jaxdp's own Conv2D (both lowerings) is handled like nn.Conv.
  assert ghost_layers(loss_fn, params, batch).fallback_leaves == ()


class SequenceModel(nn.Module):
  """Token ids (T,) -> logits: LayerNorm falls back; the Embed and Dense layers are ghost."""

  @nn.compact
  def __call__(self, tokens):
    h = nn.Embed(11, 12)(tokens)                    # (b, T=6, 12)
    # T (d_in + d_out) = 6 x 28 < d_in d_out = 12 x 16: the Gram form.
    h = jnp.tanh(nn.Dense(16)(h))
    h = nn.LayerNorm()(h)
    # 6 x (16 + 2) > 16 x 2: the per-example R^T G is materialised.
    h = jnp.tanh(nn.Dense(2)(h))
    h = nn.Conv(3, (3,), padding="CAUSAL")(h)       # 1-D causal convolution over T
    return nn.Dense(3)(h.mean(axis=1))              # T = 1


@pytest.mark.slow  # 6 s; test_transformer's forms test covers Embed and Dense in the default run
def test_sequence_model_mixes_ghost_and_fallback(random_params):
  tokens = jax.random.randint(jax.random.key(0), (6, 6), 0, 11)
  model = SequenceModel()
  params = random_params(model, tokens[:1], seed=4)
  loss_fn = _classifier_loss(model)
  norms, clip = _assert_same(loss_fn, params, (tokens, jnp.arange(6) % 3), jnp.arange(6) < 5)
  assert np.any(norms[:5] > clip) and np.any(norms[:5] < clip)
  split = ghost_layers(loss_fn, params, (tokens, jnp.arange(6) % 3))
  assert split.fallback_leaves == ("['params']['LayerNorm_0']['bias']",
                                   "['params']['LayerNorm_0']['scale']")
  assert "['params']['Embed_0']['embedding']" in split.ghost_leaves
  assert len(split.ghost_leaves) == 9 and {layer.kind for layer in split.layers} == {"Dense", "Conv", "Embed"}


def test_non_finite_row_adds_exactly_zero(random_params):
  x, y = _data((5,), 8)
  params = random_params(MLP(), x[:1], seed=5)
  bad = x.at[3, 0].set(jnp.inf)
  mask = jnp.ones(8, bool)
  norms, _ = _assert_same(_MLP_LOSS, params, (bad, y), mask)
  assert not np.isfinite(norms[3])
  # The row with inf contributes what a masked-out row does: exactly nothing.
  with_inf, count = _ghost(_MLP_LOSS, params, (bad, y), mask, 0.1)
  masked, _ = _ghost(_MLP_LOSS, params, (x, y), mask.at[3].set(False), 0.1)
  assert count == 8
  for a, b in zip(jax.tree.leaves(with_inf), jax.tree.leaves(masked)):
    np.testing.assert_array_equal(a, b)


class CalledTwice(nn.Module):
  @nn.compact
  def __call__(self, x):
    dense = nn.Dense(5)
    return nn.Dense(3)(jnp.tanh(dense(jnp.tanh(dense(x)))))


class KernelReadElsewhere(nn.Module):
  def setup(self):
    self.encode = nn.Dense(4)
    self.head = nn.Dense(3)

  def __call__(self, x):
    h = jnp.tanh(self.encode(x))
    # Ties the decoder to the encoder: x @ W W^T reads W outside its Dense call.
    back = h @ self.encode.variables["params"]["kernel"].T
    return self.head(jnp.concatenate([h, back], axis=-1))


class Readout(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(3)(jnp.tanh(nn.Dense(5)(x)))


def _penalised_loss(model):
  """Cross-entropy plus a per-example L2 penalty on the first kernel: a use outside any call."""
  base = _classifier_loss(model)

  def loss_fn(p, batch):
    penalty = jnp.sum(jnp.square(p["params"]["Dense_0"]["kernel"]))
    return base(p, batch) + 0.1 * penalty
  return loss_fn


@pytest.mark.parametrize("model,make_loss,tied", [
    (CalledTwice(), _classifier_loss, ["Dense_0"]),
    (KernelReadElsewhere(), _classifier_loss, ["encode"]),
    (Readout(), _penalised_loss, ["Dense_0"]),
], ids=["same-dense-twice", "kernel-read-by-another-module", "kernel-in-loss-penalty"])
def test_shared_kernels_fall_back(model, make_loss, tied, random_params):
  x, y = _data((5,), 6)
  params = random_params(model, x[:1], seed=6)
  loss_fn = make_loss(model)
  # A ghost norm here would miss the kernel's other gradient terms (a too-weak
  # clip); the fallback keeps the exact vmap sum.
  _assert_same(loss_fn, params, (x, y), jnp.ones(6, bool), relative_clip=0.5)
  split = ghost_layers(loss_fn, params, (x, y))
  fallback = {layer.module for layer in split.layers if layer.reason is not None}
  assert sorted(fallback) == tied
  for name in tied:
    assert f"['params']['{name}']['kernel']" in split.fallback_leaves
  assert split.ghost_leaves  # the untied head is still ghost


class Scanned(nn.Module):
  @nn.compact
  def __call__(self, x):
    scan = nn.scan(lambda module, carry, _: (jnp.tanh(module(carry)), None),
                   variable_broadcast="params", split_rngs={"params": False}, length=2)
    h, _ = scan(nn.Dense(5), x, None)
    return nn.Dense(3)(h)


class RematBlock(nn.Module):
  @nn.compact
  def __call__(self, x):
    return jnp.tanh(nn.Dense(5)(x))


class Rematted(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(3)(nn.remat(RematBlock)()(x))


@pytest.mark.parametrize("model,lifted", [
    (Scanned(), "Dense_0"), (Rematted(), "CheckpointRematBlock_0/Dense_0"),
], ids=["nn.scan", "nn.remat"])
def test_dense_inside_lifted_transform_falls_back(model, lifted, random_params):
  x, y = _data((5,), 6)
  params = random_params(model, x[:1], seed=7)
  loss_fn = _classifier_loss(model)
  _assert_same(loss_fn, params, (x, y), jnp.ones(6, bool))
  split = ghost_layers(loss_fn, params, (x, y))
  head = [layer.module for layer in split.layers if layer.reason is None]
  assert len(head) == 1 and head[0] != lifted
  assert {layer.module for layer in split.layers if layer.reason is not None} == {lifted}
  assert all("lifted transform" in layer.reason for layer in split.layers if layer.module == lifted)
  assert len(split.ghost_leaves) == 2 and len(split.fallback_leaves) == 2


def test_loss_whose_layer_calls_change_between_traces_raises(random_params):
  x, y = _data((5,), 8)
  model = Readout()
  params = random_params(model, x[:1], seed=10)
  traces = []

  def loss_fn(p, batch):
    # Skips the model from the second trace on: the analysis would not hold.
    traces.append(None)
    logits = model.apply(p, batch[0]) if len(traces) == 1 else jnp.zeros((batch[0].shape[0], 3))
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch[1])
  with pytest.raises(RuntimeError, match="depend on shapes only"):
    ghost_clipped_grad_sum(loss_fn, params, (x, y), jnp.ones(8, bool), 1.0)


def _linear_loss(p, batch):
  return optax.softmax_cross_entropy_with_integer_labels(batch[0] @ p["w"], batch[1])


def test_plain_function_model_is_the_vmap_path():
  w = jax.random.normal(jax.random.key(0), (5, 3))
  x, y = _data((5,), 6)
  assert ghost_layers(_linear_loss, {"w": w}, (x, y)) == ((), (), ("['w']",), 0)
  mask = jnp.arange(6) < 4
  got = _ghost(_linear_loss, {"w": w}, (x, y), mask, 0.3)
  want = jax.jit(clipping.clipped_grad_sum, static_argnums=0)(_linear_loss, {"w": w}, (x, y), mask, 0.3)
  np.testing.assert_array_equal(got[0]["w"], want[0]["w"])
  assert got[1] == want[1] == 4


@pytest.mark.slow  # 8 s of compiling; CI's slow set runs it, so make test stays under 5 min
def test_vmap_over_candidates_jit_and_eager_agree(random_params):
  x, y = _data((5,), 8)
  candidates = [random_params(MLP(), x[:1], seed=s) for s in (8, 9)]
  stacked = jax.tree.map(lambda *a: jnp.stack(a), *candidates)
  clips = jnp.array([0.05, 2.0])
  mask = jnp.arange(8) < 7

  def run(fun):
    return jax.jit(jax.vmap(lambda p, c: fun(_MLP_LOSS, p, (x, y), mask, c)))(stacked, clips)
  (got, got_count), (want, want_count) = run(ghost_clipped_grad_sum), run(clipping.clipped_grad_sum)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    assert g.shape[0] == 2
    np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)
  np.testing.assert_array_equal(got_count, [7.0, 7.0])
  np.testing.assert_array_equal(want_count, got_count)
  # Triangle inequality: 7 contributions of norm <= C sum to norm <= 7 C.
  total_norm = jnp.sqrt(sum(jnp.sum(jnp.square(g.reshape(2, -1)), 1) for g in jax.tree.leaves(got)))
  assert np.all(total_norm <= 7 * clips * (1 + 1e-6))
  # Eager (op by op) gives the jitted candidate's result.
  eager, _ = ghost_clipped_grad_sum(_MLP_LOSS, candidates[1], (x, y), mask, clips[1])
  for e, g in zip(jax.tree.leaves(eager), jax.tree.leaves(got)):
    np.testing.assert_allclose(e, g[1], rtol=RTOL, atol=ATOL)


# --- Through the trainer: Task(clipping='ghost') selects this path. ---

def _digits_like(n=90, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, 8, 8, 1)).astype(np.float32)
  y = (np.arange(n) % 10).astype(np.int32)
  x[:, 0, 0, 0] += y
  return DataSplit(x, y)


# The MLP variant (10 s of compiling) runs in the slow set, which CI runs; keeps make test < 5 min.
@pytest.mark.parametrize("model", ["logreg", pytest.param("mlp", marks=pytest.mark.slow)])
def test_ghost_task_trains_like_the_vmap_task(model):
  import dataclasses  # pylint: disable=g-import-not-at-top
  from jaxdp.data import Dataset  # pylint: disable=g-import-not-at-top
  from jaxdp.train import ExecutionConfig, TrainConfig, train_candidate  # pylint: disable=g-import-not-at-top
  train = _digits_like()
  data = Dataset(name="d", train=train, test=train, num_examples=len(train.labels), num_classes=10)
  vmap_task = dataclasses.replace(presets.classifier(10), clipping="vmap")
  ghost_task = dataclasses.replace(vmap_task, clipping="ghost")
  # Same microbatches for both, so the only difference is how norms and sums are computed.
  execution = ExecutionConfig(padded_batch_size=60, microbatch_size=20)
  runs = [train_candidate(TrainConfig(task=task, l2_clip_norm=0.1, noise_multiplier=0.8, sampling_prob=0.3,
                                      steps=5, hparams=dict(model=model, learning_rate=0.5),
                                      execution=execution), data, jax.random.key(4))
          for task in (vmap_task, ghost_task)]
  assert runs[0].epsilon == runs[1].epsilon  # same privacy: same DpEvent
  for a, b in zip(jax.tree.leaves(runs[0].params), jax.tree.leaves(runs[1].params)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_clipping_method_is_validated():
  import dataclasses  # pylint: disable=g-import-not-at-top
  from jaxdp.train import DpSgdPlan  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError, match=r"clipping must be one of \('auto', 'vmap', 'ghost'\), got 'fast'"):
    dataclasses.replace(presets.classifier(10), clipping="fast")
  plan = DpSgdPlan(l2_clip_norm=1.0, noise_multiplier=1.0, sampling_prob=0.1, num_steps=1, num_examples=10)
  with pytest.raises(ValueError, match="method must be 'auto', 'vmap' or 'ghost', got 'x'"):
    plan.clipped_grad(_linear_loss, method="x")


# --- clipping="auto": the cost model's choice per layer, and the same sum. ---

class _PapernotSteinkeLike(nn.Module):
  """Convolutions whose patches outweigh their kernels, then a small head."""
  @nn.compact
  def __call__(self, x):
    x = jnp.tanh(nn.Conv(16, (3, 3))(x))
    x = jnp.tanh(nn.Conv(16, (3, 3), strides=2)(x))
    return nn.Dense(3)(x.mean((1, 2)))


class _ConvWideHead(nn.Module):
  """A small convolution, then Dense layers whose kernels outweigh everything else."""
  @nn.compact
  def __call__(self, x):
    x = jnp.tanh(nn.Conv(4, (3, 3))(x))
    x = jnp.tanh(nn.Dense(256)(x.reshape(x.shape[0], -1)))
    return nn.Dense(3)(x)


def _auto_paths(model, shape, budget=None, monkeypatch=None):
  from jaxdp.train import microbatching  # pylint: disable=g-import-not-at-top
  if budget is not None:
    monkeypatch.setattr(microbatching, "budget_bytes", lambda device=None: budget)
  x, y = _data(shape, 4)
  params = jax.eval_shape(model.init, jax.random.key(0), x[:1])
  split = ghost_layers(_classifier_loss(model), params, (x, y), auto=True)
  return {layer.module: layer.reason for layer in split.layers}, split


def test_auto_keeps_a_small_cnn_on_per_example_gradients():
  reasons, split = _auto_paths(_PapernotSteinkeLike(), (8, 8, 3))
  assert split.ghost_leaves == () and all(r.startswith("auto:") for r in reasons.values())
  # The first convolution's patches (64 rows of 27) cost more than its 27 x 16 kernel gradient
  # and its Gram matrix more work; the others' saving is too small to pay for the ghost path.
  assert "more work" in reasons["Conv_0"]
  assert "< 10%" in reasons["Dense_0"]
  # Every layer is eligible for 'ghost' itself: auto's choice is the cost model's, not eligibility.
  x, y = _data((8, 8, 3), 4)
  params = jax.eval_shape(_PapernotSteinkeLike().init, jax.random.key(0), x[:1])
  assert ghost_layers(_classifier_loss(_PapernotSteinkeLike()), params, (x, y)).fallback_leaves == ()


def test_auto_takes_ghost_norms_where_the_kernels_dominate():
  reasons, split = _auto_paths(_ConvWideHead(), (6, 6, 2))
  assert reasons["Dense_0"] is None and reasons["Dense_1"] is None  # T = 1: ||r||^2 ||g||^2
  assert reasons["Conv_0"].startswith("auto:") and "more work" in reasons["Conv_0"]
  assert {"['params']['Dense_0']['kernel']", "['params']['Dense_1']['bias']"} <= set(split.ghost_leaves)
  assert "['params']['Conv_0']['kernel']" in split.fallback_leaves


def test_auto_saves_every_byte_when_one_example_exceeds_the_budget(monkeypatch):
  # A 1-byte microbatch budget: memory decides, so the CNN's small savings are taken too.
  reasons, _ = _auto_paths(_PapernotSteinkeLike(), (8, 8, 3), budget=1, monkeypatch=monkeypatch)
  assert reasons["Dense_0"] is None
  assert reasons["Conv_0"].startswith("auto:") and "more work" in reasons["Conv_0"]


@pytest.mark.parametrize("model,shape", [
    (_ConvWideHead(), (6, 6, 2)),
    pytest.param(_PapernotSteinkeLike(), (8, 8, 3), marks=pytest.mark.slow)],  # the vmap path itself
    ids=["mixed", "all-per-example"])
def test_auto_matches_vmap_path(model, shape, random_params):
  x, y = _data(shape, 6)
  params = random_params(model, x[:1], seed=2)
  mask = jnp.arange(6) < 5
  loss_fn = _classifier_loss(model)
  grads, _ = clipping.per_example_grads(loss_fn, params, (x, y))
  clip = jnp.median(clipping.per_example_global_norms(grads))
  want, _ = clipping.clipped_grad_sum(loss_fn, params, (x, y), mask, clip)
  got, count = jax.jit(functools.partial(ghost_clipped_grad_sum, auto=True), static_argnums=0)(
      loss_fn, params, (x, y), mask, clip)
  assert count == 5
  for w, g in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
    np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)
