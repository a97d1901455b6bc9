"""Adversarial clipping (issue 31): one example's bits chosen to break every clipping path
(vmap, ghost, auto) and layer kind (Dense in the Gram, one-position and direct forms, Conv,
Conv2D, LoRA; microbatched, data-parallel, frozen leaves): terms that cancel in the Gram form,
squares that overflow or underflow, subnormals, NaN and +-inf. The loss is sum(y * c), so the
example's cotangents are its `c`. Adding it must move the clipped sum by at most C, and one
DP-SGD step with sigma = 0, q = 1 by at most C / (q N), to a relative 1e-4 (the float additions
that combine the examples' contributions). Before issue 31 the Gram form moved it by 3,003 C.
"""

import functools
import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxdp.data import Dataset
from jaxdp.models import layers as jaxdp_layers
from jaxdp.models import lora
from jaxdp.sweep import Candidate, engine
from jaxdp.train import (ExecutionConfig, Model, NotPrivateWarning, Task, TrainConfig, clipping,
                         train_candidate)
from jaxdp.train.ghost import ghost_clipped_grad_sum
from jaxdp.train.ghost_analysis import ghost_layers


C = 1.0
RTOL = 1e-4
HONEST = 4


class Dense(nn.Module):
  """One flax Dense layer (its form follows from the input's shape: see MODELS)."""
  features: int
  use_bias: bool = True

  @nn.compact
  def __call__(self, x):
    return nn.Dense(self.features, use_bias=self.use_bias)(x)


class Conv(nn.Module):
  """One flax Conv layer."""
  features: int
  kernel: tuple
  use_bias: bool = True

  @nn.compact
  def __call__(self, x):
    return nn.Conv(self.features, self.kernel, padding="SAME", use_bias=self.use_bias)(x)


class JaxdpConv(nn.Module):
  impl: str

  @nn.compact
  def __call__(self, x):
    return jaxdp_layers.Conv2D(4, (3, 3), impl=self.impl)(x)


class DenseGeneral(nn.Module):
  """One flax DenseGeneral layer (attention's projections: heads out, or heads contracted)."""
  features: tuple
  axis: tuple = (-1,)

  @nn.compact
  def __call__(self, x):
    return nn.DenseGeneral(self.features, axis=self.axis)(x)


class LoRAAttentionProjection(nn.Module):
  @nn.compact
  def __call__(self, x):
    return lora.LoRADenseGeneral((2, 4), rank=2)(x)


class LoRASequence(nn.Module):
  @nn.compact
  def __call__(self, x):
    return lora.LoRADense(8, rank=2)(x)


class LoRAConvolution(nn.Module):
  @nn.compact
  def __call__(self, x):
    return lora.LoRAConv(4, (3, 3), rank=2)(x)


# name -> (module, one example's input shape)
MODELS = {
    # Dense over T = 2 positions, T (d_in + d_out) < d_in d_out: the Gram form.
    "dense-gram": (Dense(8, use_bias=False), (2, 8)),
    "dense-gram-bias": (Dense(8), (2, 8)),
    # T = 1: ||r||^2 ||g||^2.
    "dense-one-position": (Dense(8), (8,)),
    "dense-one-position-no-bias": (Dense(8, use_bias=False), (8,)),
    # y = w x: the one-position underflow (r = 9e-20, g = 1.5e19) in one weight.
    "dense-scalar": (Dense(1, use_bias=False), (1,)),
    # T (d_in + d_out) > d_in d_out: R^T G materialised.
    "dense-direct": (Dense(2), (8, 2)),
    # A 1x1 convolution over two pixels (the second case).
    "conv-1x1-two-pixels": (Conv(8, (1, 1), use_bias=False), (1, 2, 8)),
    "conv-3x3": (Conv(4, (3, 3)), (4, 4, 2)),
    "conv2d-im2col": (JaxdpConv("im2col"), (4, 4, 2)),
    "conv2d-native": (JaxdpConv("native"), (4, 4, 2)),
    # DenseGeneral: a query projection to (heads, head_dim) over T = 2 (Gram form), an output
    # projection contracting (heads, head_dim) (Gram form), and T = 8 positions to 2 x 1 (direct).
    "dense-general-heads": (DenseGeneral((2, 4)), (2, 8)),
    "dense-general-out": (DenseGeneral((8,), axis=(-2, -1)), (2, 2, 4)),
    "dense-general-direct": (DenseGeneral((2, 1)), (8, 8)),
    "lora-dense": (LoRASequence(), (2, 8)),
    "lora-attention": (LoRAAttentionProjection(), (2, 8)),
    "lora-conv": (LoRAConvolution(), (4, 4, 2)),
}


def _output_shape(name):
  module, shape = MODELS[name]
  return jax.eval_shape(lambda x: module.apply(module.init(jax.random.key(0), x), x),
                        jnp.zeros((1,) + shape)).shape[1:]


def _attack(kind, x_shape, c_shape):
  """One adversarial example (x, c) of the given shapes."""
  rng = np.random.default_rng(5)
  x, c = np.ones(x_shape, np.float32), np.ones(c_shape, np.float32)
  if kind.startswith("cancel"):
    # Rows 1e4 (1, ..., 1) / sqrt(d) at every position; cotangents +g and -(1 - eps) g
    # at alternate positions, ||g|| = 1e4: the Gram terms cancel, the gradient is
    # eps 1e8 in size (clipped), and its exact cancellation (eps = 0) is 0.
    eps = float(kind[len("cancel-"):])
    x = np.full(x_shape, 1e4 / np.sqrt(x_shape[-1]), np.float32)
    g = rng.normal(size=c_shape[-1])
    g = g / np.linalg.norm(g) * 1e4
    flat = c.reshape(-1, c_shape[-1])
    flat[0::2] = g
    flat[1::2] = -(1 - eps) * g
    c = flat.reshape(c_shape).astype(np.float32)
  elif kind == "underflow-overflow":
    x, c = np.full(x_shape, 9e-20, np.float32), np.full(c_shape, 1.5e19, np.float32)
  elif kind == "overflow-underflow":
    x, c = np.full(x_shape, 1.5e19, np.float32), np.full(c_shape, 9e-20, np.float32)
  elif kind == "huge":
    x, c = np.full(x_shape, 1e18, np.float32), np.full(c_shape, 1e18, np.float32)
  elif kind == "float-max":
    x, c = np.full(x_shape, 3.4e38, np.float32), np.full(c_shape, -3.4e38, np.float32)
  elif kind == "tiny":
    x, c = np.full(x_shape, 1e-20, np.float32), np.full(c_shape, 1e-20, np.float32)
  elif kind == "subnormal":
    x, c = np.full(x_shape, 1e-40, np.float32), np.full(c_shape, 1e35, np.float32)
  elif kind == "positions-apart":
    # Large rows where the cotangents are tiny and the reverse: products of order 1,
    # while every per-position norm product is; scaled per example, no entry overflows.
    x = np.where(np.arange(x.size).reshape(x_shape) % 2 == 0, 1e30, 1e-30).astype(np.float32)
    c = np.where(np.arange(c.size).reshape(c_shape) % 2 == 0, 1e-30, 1e30).astype(np.float32)
  elif kind == "random-scales":
    x = (rng.normal(size=x_shape) * 10.0 ** rng.uniform(-30, 30, x_shape)).astype(np.float32)
    c = (rng.normal(size=c_shape) * 10.0 ** rng.uniform(-30, 30, c_shape)).astype(np.float32)
  elif kind in ("nan-input", "inf-input", "-inf-cotangent", "nan-cotangent"):
    value = {"nan": np.nan, "inf": np.inf, "-inf": -np.inf}[kind.rsplit("-", 1)[0]]
    target = x if kind.endswith("input") else c
    target.reshape(-1)[0] = value
  else:
    raise ValueError(kind)
  return x, c


ATTACKS = ["cancel-3e-5", "cancel-1e-3", "cancel-1e-7", "cancel-0", "underflow-overflow",
           "overflow-underflow", "huge", "float-max", "tiny", "subnormal", "positions-apart",
           "random-scales", "nan-input", "inf-input", "-inf-cotangent", "nan-cotangent"]


def _loss(module):
  def loss_fn(params, batch):
    y = module.apply(params, batch["x"])
    return jnp.sum((y * batch["c"]).reshape(y.shape[0], -1), axis=1)
  return loss_fn


_LOSSES = {name: _loss(module) for name, (module, _) in MODELS.items()}
_SUMS = {"vmap": jax.jit(clipping.clipped_grad_sum, static_argnums=0),
         "ghost": jax.jit(ghost_clipped_grad_sum, static_argnums=0)}


def _honest(name, seed=1):
  _, shape = MODELS[name]
  rng = np.random.default_rng(seed)
  return (rng.normal(size=(HONEST,) + shape).astype(np.float32),
          rng.normal(size=(HONEST,) + _output_shape(name)).astype(np.float32))


def _norm64(tree) -> float:
  return float(np.sqrt(sum(np.sum(np.square(np.asarray(leaf, np.float64))) for leaf in jax.tree.leaves(tree))))


@pytest.mark.slow  # eleven models analysed: about 5 s (the suite's time budget)
def test_every_model_here_is_ghost_where_it_should_be():
  # The ghost path must really use ghost norms for these layers, or the tests
  # below would only exercise the vmap fallback. A LoRA layer's own kernel and
  # bias are no Dense/Conv call: they fall back, and its sum mixes both kinds.
  for name, (module, shape) in MODELS.items():
    params = module.init(jax.random.key(0), jnp.zeros((1,) + shape))
    batch = {"x": jnp.zeros((2,) + shape), "c": jnp.zeros((2,) + _output_shape(name))}
    split = ghost_layers(_LOSSES[name], params, batch)
    if name.startswith("lora"):
      assert split.ghost_leaves and all("lora_" in leaf for leaf in split.ghost_leaves), split
      assert split.fallback_leaves, split
    else:
      assert not split.fallback_leaves, (name, split)


# Three convolution and three DenseGeneral variants run in the slow set (the suite's 5-minute
# budget): Conv2D im2col, nn.Conv 1x1, LoRADense and the attention output projection keep every
# form (direct, Gram, one position, mixed) in the default run.
_SLOW_MODELS = ("conv-3x3", "conv2d-native", "lora-conv", "dense-general-heads", "dense-general-direct",
                "lora-attention")


@pytest.mark.parametrize("path", ["vmap", "ghost"])
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in _SLOW_MODELS else n
                                  for n in MODELS])
def test_adding_one_adversarial_example_moves_the_clipped_sum_by_at_most_c(name, path):
  module, shape = MODELS[name]
  params = module.init(jax.random.key(0), jnp.zeros((1,) + shape))
  hx, hc = _honest(name)
  summed = functools.partial(_SUMS[path], _LOSSES[name], params)
  with_it = jnp.arange(HONEST + 1) < HONEST + 1
  without = jnp.arange(HONEST + 1) < HONEST
  for attack in ATTACKS:
    if attack.startswith("cancel") and np.prod(_output_shape(name)[:-1]) < 2:
      continue  # one position: nothing to cancel
    ax, ac = _attack(attack, shape, _output_shape(name))
    batch = {"x": jnp.asarray(np.concatenate([hx, ax[None]])), "c": jnp.asarray(np.concatenate([hc, ac[None]]))}
    added, _ = summed(batch, with_it, C)
    base, _ = summed(batch, without, C)
    assert all(np.all(np.isfinite(leaf)) for leaf in jax.tree.leaves(added)), attack
    moved = _norm64(jax.tree.map(lambda a, b: np.asarray(a, np.float64) - np.asarray(b, np.float64),
                                 added, base))
    assert moved <= C * (1 + RTOL), f"{name}/{path}/{attack}: moved {moved / C:.6g} C"


VOCAB, POSITIONS, WIDTH = 5, 6, 4


class Embedding(nn.Module):
  @nn.compact
  def __call__(self, tokens):
    return nn.Embed(VOCAB, WIDTH)(tokens)


# Token patterns of the added example: every position reading one row (its cotangents may then
# cancel in the row's gradient), ids that wrap to the same row (-3 reads row 2, as jnp.take
# reads it), ids out of range (no row: the lookup is NaN and its gradient drops them), distinct.
TOKENS = {"one-row": [2] * POSITIONS, "wrapped": [2, -3] * (POSITIONS // 2),
          "out-of-range": [VOCAB, -VOCAB - 1, 2, 2, 10 ** 6, -(10 ** 6)], "distinct": [0, 1, 2, 3, 4, -1]}


@pytest.mark.parametrize("path", ["vmap", "ghost"])
def test_adding_one_adversarial_token_sequence_moves_the_clipped_sum_by_at_most_c(path):
  module = Embedding()
  tokens = jnp.zeros((1, POSITIONS), jnp.int32)
  params = module.init(jax.random.key(0), tokens)
  loss_fn = _loss(module)
  if path == "ghost":
    assert ghost_layers(loss_fn, params, {"x": tokens, "c": jnp.zeros((1, POSITIONS, WIDTH))}).fallback_leaves == ()
  summed = jax.jit(functools.partial(_SUMS[path], loss_fn, params))
  rng = np.random.default_rng(2)
  hx = rng.integers(0, VOCAB, size=(HONEST, POSITIONS)).astype(np.int32)
  hc = rng.normal(size=(HONEST, POSITIONS, WIDTH)).astype(np.float32)
  with_it, without = jnp.arange(HONEST + 1) < HONEST + 1, jnp.arange(HONEST + 1) < HONEST
  for pattern, ids in TOKENS.items():
    for attack in ATTACKS:
      if attack.endswith("input"):
        continue  # tokens are integers: their attack is the pattern
      _, ac = _attack(attack, (POSITIONS, 1), (POSITIONS, WIDTH))
      batch = {"x": jnp.asarray(np.concatenate([hx, np.asarray([ids], np.int32)])),
               "c": jnp.asarray(np.concatenate([hc, ac[None]]))}
      added, _ = summed(batch, with_it, C)
      base, _ = summed(batch, without, C)
      assert all(np.all(np.isfinite(leaf)) for leaf in jax.tree.leaves(added)), (pattern, attack)
      moved = _norm64(jax.tree.map(lambda a, b: np.asarray(a, np.float64) - np.asarray(b, np.float64),
                                   added, base))
      assert moved <= C * (1 + RTOL), f"embed/{path}/{pattern}/{attack}: moved {moved / C:.6g} C"


@pytest.mark.parametrize("name", ["dense-gram", "dense-one-position", "conv-1x1-two-pixels"])
def test_a_clipped_honest_example_loses_little_to_the_bound(name):
  # The bound's slack on honest data: a clipped example still adds nearly C.
  module, shape = MODELS[name]
  params = module.init(jax.random.key(0), jnp.zeros((1,) + shape))
  hx, hc = _honest(name)
  batch = {"x": jnp.asarray(hx * 100), "c": jnp.asarray(hc)}
  for path, fn in _SUMS.items():
    one = fn(_LOSSES[name], params, batch, jnp.arange(HONEST) == 0, C)[0]
    assert 1 - 1e-4 <= _norm64(one) / C <= 1.0, (path, _norm64(one))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
def test_clip_per_example_holds_for_low_precision_gradients(dtype):
  # A weight and product rounded in bfloat16 grew a clipped row to 1.0049 C; they are float32 now.
  rng = np.random.default_rng(0)
  grads = rng.normal(size=(256, 16))
  grads = grads / np.linalg.norm(grads, axis=1, keepdims=True) * rng.uniform(1.5, 3.0, (256, 1))
  clipped, _ = clipping.clip_per_example({"w": jnp.asarray(grads, dtype)}, C)
  assert clipped["w"].dtype == jnp.promote_types(dtype, jnp.float32)
  assert np.max(np.linalg.norm(np.asarray(clipped["w"], np.float64), axis=1)) <= C
  tx = clipping.clip_per_example_l2(C)
  summed, _ = tx.update({"w": jnp.asarray(grads[:1], dtype)}, tx.init(None))
  assert _norm64(summed) <= C


# ------------------------------------------------------------------- end to end

def _task(name, clipping_method, trainable=None):
  module, _ = MODELS[name]
  kwargs = {} if trainable is None else {"trainable": trainable}
  return Task(model=Model(init=module.init, apply=module.apply),
              loss=lambda out, batch: jnp.sum((out * batch["c"]).reshape(out.shape[0], -1), axis=1),
              optimizer=lambda hp: optax.sgd(1.0), clipping=clipping_method,
              name=f"{name}-{clipping_method}", **kwargs)


_TASKS = {}


def _one_step(name, clipping_method, rows, execution=None, trainable=None, devices=None):
  """Parameters after one SGD step (rate 1) with sigma = 0, q = 1, declared N = HONEST."""
  key = (name, clipping_method, trainable)
  if key not in _TASKS:
    _TASKS[key] = _task(name, clipping_method, trainable)
  x, c = rows
  data = Dataset(train={"x": x, "c": c}, test={"x": x[:1], "c": c[:1]}, num_examples=HONEST)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", NotPrivateWarning)
    config = TrainConfig(task=_TASKS[key], l2_clip_norm=C, noise_multiplier=0.0, sampling_prob=1.0,
                         steps=1, execution=execution or ExecutionConfig())
  module, shape = MODELS[name]
  initial = module.init(jax.random.key(0), jnp.zeros((1,) + shape))
  if devices is None:
    return train_candidate(config, data, jax.random.key(1), initial_params=initial).params
  cand = Candidate({"i": 0}, config, 0)
  return engine.train_candidates([cand], data, devices=devices, keep_params=True,
                                 initial_params=initial)[0].params


# `Dataset` admits finite values only (the data domain); non-finite ones still arise inside
# the step (float-max overflows the products to inf and their differences to NaN).
E2E_ATTACKS = ["cancel-3e-5", "positions-apart", "underflow-overflow", "huge", "float-max"]


def _assert_step_moves_at_most_c_over_n(name, clipping_method, **kwargs):
  hx, hc = _honest(name)
  base = _one_step(name, clipping_method, (hx, hc), **kwargs)
  for attack in E2E_ATTACKS:
    if attack.startswith("cancel") and np.prod(_output_shape(name)[:-1]) < 2:
      continue
    ax, ac = _attack(attack, MODELS[name][1], _output_shape(name))
    added = _one_step(name, clipping_method, (np.concatenate([hx, ax[None]]), np.concatenate([hc, ac[None]])),
                      **kwargs)
    moved = _norm64(jax.tree.map(lambda a, b: np.asarray(a, np.float64) - np.asarray(b, np.float64),
                                 added, base))
    # q = 1, N = HONEST: the update is the clipped sum / (q N).
    assert moved <= C / HONEST * (1 + RTOL), f"{name}/{clipping_method}/{attack}: {moved * HONEST / C:.6g} C"


# vmap in the slow set (3 s; the function-level tests above cover its sum in the default run).
@pytest.mark.parametrize("clipping_method", [pytest.param("vmap", marks=pytest.mark.slow), "ghost", "auto"])
def test_one_dp_sgd_step_moves_by_at_most_c_over_qn(clipping_method):
  _assert_step_moves_at_most_c_over_n("dense-gram", clipping_method)


def test_one_microbatched_step_moves_by_at_most_c_over_qn():
  _assert_step_moves_at_most_c_over_n("dense-gram", "ghost",
                                      execution=ExecutionConfig(microbatch_size=2, padded_batch_size=6))


@pytest.mark.slow  # one compilation per model and path: about 30 s
@pytest.mark.parametrize("clipping_method", ["vmap", "ghost", "auto"])
@pytest.mark.parametrize("name", ["conv-1x1-two-pixels", "conv2d-im2col", "dense-direct"])
def test_one_step_of_other_layers_moves_by_at_most_c_over_qn(name, clipping_method):
  _assert_step_moves_at_most_c_over_n(name, clipping_method)


@pytest.mark.slow  # about 10 s
@pytest.mark.parametrize("clipping_method", ["vmap", "ghost"])
def test_lora_adapters_with_frozen_weights_move_by_at_most_c_over_qn(clipping_method):
  _assert_step_moves_at_most_c_over_n("lora-dense", clipping_method, trainable=lora.adapters)


@pytest.mark.slow  # a sharded program compiled: about 3 s
def test_a_data_parallel_step_moves_by_at_most_c_over_qn(two_devices):
  _assert_step_moves_at_most_c_over_n("dense-gram", "ghost",
                                      execution=ExecutionConfig(data_parallel=2), devices=two_devices)
