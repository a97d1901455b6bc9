"""Transformers: ghost norms of embeddings and attention projections, LoRA in attention, the dry run.

The ghost forms for `nn.Embed` (token equality) and `nn.DenseGeneral` (any
contracted axes) must give the per-example-gradient path's clipped sum to
float32 round-off (`test_ghost._assert_same`) on tokens with repeats,
padding, ids that wrap and sequences of several lengths, and fall back where
a table is read twice. The adversarial bounds are in `tests/adversarial/test_clipping.py`.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxdp import accounting as acc
from jaxdp.data import DataSplit, Dataset
from jaxdp.models import SelfAttention, TransformerClassifier, lora
from jaxdp.train import LoopSpec, Task, TrainConfig, program
from jaxdp.train import loop_spec
from jaxdp.train.ghost_analysis import ghost_layers
from jaxdp.tuning import LocalTrainer, RunConfig
from tests.train.test_ghost import _assert_same, _classifier_loss

VOCAB = 7


def _tokens(length, rows=6, seed=0):
  """Tokens with repeats (a vocabulary of 7), padding (0; row 2 is all padding) and an id that
  wraps (-1 reads row 6, as jnp.take reads it)."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(1, VOCAB, size=(rows, length))
  tokens[1, length // 2:] = 0
  tokens[2] = 0
  tokens[3, 0] = -1
  tokens[4] = tokens[4, 0]  # one token throughout
  return jnp.asarray(tokens, jnp.int32)


def _small(**kwargs):
  return TransformerClassifier(vocab_size=VOCAB, max_length=8, width=8, num_heads=2, depth=1, mlp_width=4,
                               **kwargs)


# Width 8: a projection's T (d_in + d_out) is below d_in d_out = 64 for T = 3 (Gram form) and
# not for T = 8 (R^T G materialised); T = 1 is the one-position form.
@pytest.mark.slow  # 6-9 s each; the two small models below keep Embed and DenseGeneral in the default run
@pytest.mark.parametrize("length", [1, 3, 8])
def test_every_transformer_form_matches_the_per_example_path(length, random_params):
  model = _small()
  tokens = _tokens(length)
  batch = (tokens, jnp.arange(6) % 2)
  params = random_params(model, tokens[:1], seed=length)
  loss = _classifier_loss(model)
  split = ghost_layers(loss, params, batch)
  assert {layer.kind for layer in split.layers} == {"Embed", "DenseGeneral", "Dense"}
  assert all(layer.reason is None for layer in split.layers), split.layers
  # Only the LayerNorms' scales and biases have no ghost form: 2 d numbers per example each.
  assert split.fallback_leaves and all("['ln_" in leaf for leaf in split.fallback_leaves)
  mask = jnp.arange(6) < 5
  norms, clip = _assert_same(loss, params, batch, mask, relative_clip=0.5)
  assert np.any(norms[:5] > clip)
  _assert_same(loss, params, batch, mask, relative_clip=1e6)  # nothing clipped: the plain sum


class Bag(nn.Module):
  """An embedding, pooled: the Embed's Gram form alone (and a Dense head, T = 1)."""

  @nn.compact
  def __call__(self, tokens):
    return nn.Dense(3)(jnp.tanh(nn.Embed(VOCAB, 4)(tokens)).mean(axis=1))


def test_the_embedding_form_matches_the_per_example_path(random_params):
  tokens = _tokens(5)
  batch = (tokens, jnp.arange(6) % 3)
  model = Bag()
  params = random_params(model, tokens[:1], seed=5)
  loss = _classifier_loss(model)
  assert ghost_layers(loss, params, batch).fallback_leaves == ()
  norms, clip = _assert_same(loss, params, batch, jnp.arange(6) < 5, relative_clip=0.5)
  assert np.any(norms[:5] > clip)


class DenseGeneralAxes(nn.Module):
  """DenseGeneral contracting a middle axis, then a pair named out of order, then attention's
  output pair (flax lays a kernel's contracted axes out in ascending order, whatever `axis` says)."""

  @nn.compact
  def __call__(self, x):                                      # (b, 3, 4, 5)
    h = jnp.tanh(nn.DenseGeneral((2, 3), axis=1)(x))          # contracts the 3: (b, 4, 5, 2, 3)
    h = jnp.tanh(nn.DenseGeneral((3, 2), axis=(-1, -3))(h))   # contracts the 5 and the 3: (b, 4, 2, 3, 2)
    h = nn.DenseGeneral(4, axis=(-2, -1))(h)                  # (b, 4, 2, 4)
    return nn.Dense(3)(h.mean(axis=(1, 2)))


def test_dense_general_over_any_axes_matches_the_per_example_path(random_params):
  model = DenseGeneralAxes()
  x = jax.random.normal(jax.random.key(0), (5, 3, 4, 5))
  batch = (x, jnp.arange(5) % 3)
  params = random_params(model, x[:1], seed=2)
  loss = _classifier_loss(model)
  assert ghost_layers(loss, params, batch).fallback_leaves == ()
  _assert_same(loss, params, batch, jnp.ones(5, bool), relative_clip=0.5)


class TiedHead(nn.Module):
  """The embedding is also the output head (`Embed.attend`): its gradient has a second term."""

  @nn.compact
  def __call__(self, tokens):
    embed = nn.Embed(VOCAB, 6)
    h = jnp.tanh(nn.Dense(6)(embed(tokens)))
    return embed.attend(h.mean(axis=1))[:, :3]


class EmbeddedTwice(nn.Module):
  """One table looks up two sequences."""

  @nn.compact
  def __call__(self, tokens):
    embed = nn.Embed(VOCAB, 6)
    h = embed(tokens) + embed(jnp.flip(tokens, axis=1))
    return nn.Dense(3)(h.mean(axis=1))


@pytest.mark.parametrize("model,why", [(TiedHead(), "also used outside this call"),
                                       (EmbeddedTwice(), "shared with another")], ids=["attend", "twice"])
def test_a_table_read_twice_falls_back(model, why, random_params):
  tokens = _tokens(4)
  batch = (tokens, jnp.arange(6) % 3)
  params = random_params(model, tokens[:1], seed=3)
  loss = _classifier_loss(model)
  split = ghost_layers(loss, params, batch)
  assert "['params']['Embed_0']['embedding']" in split.fallback_leaves
  assert all(why in layer.reason for layer in split.layers if layer.kind == "Embed")
  assert "['params']['Dense_0']['kernel']" in split.ghost_leaves or isinstance(model, TiedHead)
  # A ghost norm would miss the other term (too weak a clip); the fallback is the exact sum.
  _assert_same(loss, params, batch, jnp.ones(6, bool), relative_clip=0.5)


@pytest.mark.parametrize("axis", [-1, (1, 2), (-1, -2)])
def test_lora_dense_general_loads_a_dense_general(axis):
  x = jax.random.normal(jax.random.key(0), (2, 3, 4, 4))
  plain = nn.DenseGeneral((2, 5), axis=axis)
  public = plain.init(jax.random.key(1), x)
  adapted = lora.LoRADenseGeneral((2, 5), rank=2, axis=axis)
  params = adapted.init(jax.random.key(2), x)
  assert jax.tree.map(jnp.shape, public["params"]) == {
      k: v for k, v in jax.tree.map(jnp.shape, params["params"]).items() if k in ("kernel", "bias")}
  params["params"].update(public["params"])
  np.testing.assert_allclose(adapted.apply(params, x), plain.apply(public, x), rtol=1e-6, atol=1e-6)


@pytest.mark.slow  # 3 s; LoRADenseGeneral's loading is checked in the default run
def test_self_attention_loads_flax_attention_weights_and_takes_adapters():
  x = jax.random.normal(jax.random.key(0), (2, 5, 8))
  flax_attention = nn.MultiHeadDotProductAttention(num_heads=2)
  public = flax_attention.init(jax.random.key(1), x, x)
  np.testing.assert_array_equal(SelfAttention(2).apply(public, x), flax_attention.apply(public, x, x))
  adapted = SelfAttention(2, lora_rank=3)
  params = adapted.init(jax.random.key(2), x)
  for name in ("query", "key", "value", "out"):
    assert set(params["params"][name]) == {"kernel", "bias", "lora_a", "lora_b"}
    params["params"][name].update(public["params"][name])
  # lora_b starts at zero: the adapted layer computes the pretrained one.
  np.testing.assert_allclose(adapted.apply(params, x), flax_attention.apply(public, x, x), rtol=1e-6, atol=1e-6)
  with pytest.raises(ValueError, match="multiple of num_heads"):
    SelfAttention(3).init(jax.random.key(0), x)


def _data(n=64, length=8, seed=0):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(1, VOCAB, size=(n, length)).astype(np.int32)
  labels = (tokens[:, 0] > VOCAB // 2).astype(np.int32)  # learnable from the first token
  return Dataset(name="tokens", train=DataSplit(tokens, labels), test=DataSplit(tokens[:16], labels[:16]),
                 num_examples=n, num_classes=2)


def _loss(out, batch):
  return optax.softmax_cross_entropy_with_integer_labels(out, batch[1])


def _adam(hp):
  return optax.adam(hp["learning_rate"])


def _lora_task(rank=2):
  return Task(model=_small(lora_rank=rank), loss=_loss, optimizer=_adam,
              trainable=lambda path: lora.adapters(path) or path.startswith("params/head/"),
              name="lora-attention")


def _public(data):
  """A 'pretrained' model of the same architecture without adapters (the public start)."""
  return {"params": _small().init(jax.random.key(9), jnp.asarray(data.train.inputs[:1]))["params"]}


def test_the_dry_run_names_every_parameter_with_lora_in_attention():
  data = _data()
  config = TrainConfig(task=_lora_task(), l2_clip_norm=1.0, noise_multiplier=1.0, sampling_prob=0.25,
                       steps=3, hparams=dict(learning_rate=0.05))
  paths = loop_spec.clipping_paths(LoopSpec.from_config(config, data), data.train)
  params = jax.eval_shape(_small(lora_rank=2).init, jax.random.key(0), jnp.zeros((1, 8), jnp.int32))
  assert len(paths) == len(jax.tree.leaves(params))  # every parameter, trainable or not
  by_path = {param: (path, why) for param, path, why in paths}
  assert by_path["params/tokens/embedding"] == ("frozen", "Task.trainable leaves it out")
  assert by_path["params/attention_0/query/kernel"][0] == "frozen"
  adapters = [p for p in by_path if "/lora_" in p]
  assert len(adapters) == 8 and all(by_path[p][0] in ("ghost", "per-example") for p in adapters)
  assert all("DenseGeneral 'attention_0/" in by_path[p][1] for p in adapters)
  assert {by_path[p][0] for p in by_path if p.startswith("params/head/")} <= {"ghost", "per-example"}


def test_auto_clips_a_large_vocabulary_by_its_ghost_norm_and_a_small_table_per_example():
  data = _data()
  model = TransformerClassifier(vocab_size=1000, max_length=8, width=8, num_heads=2, depth=1, mlp_width=4)
  config = TrainConfig(task=Task(model=model, loss=_loss, optimizer=_adam),
                       l2_clip_norm=1.0, noise_multiplier=1.0, sampling_prob=0.25, steps=2,
                       hparams=dict(learning_rate=0.05))
  by_path = {param: (path, why) for param, path, why in
             loop_spec.clipping_paths(LoopSpec.from_config(config, data), data.train)}
  # T^2 = 64 pairs of tokens against 1,000 rows: the ghost norm; 8 positions: the gradient.
  assert by_path["params/tokens/embedding"] == ("ghost", "Embed 'tokens'")
  assert by_path["params/positions/embedding"][0] == "per-example"
  assert by_path["params/positions/embedding"][1].startswith("Embed 'positions': auto:")
  assert {by_path[p] for p in by_path if "/ln_" in p} == {
      ("per-example", "no Embed/Dense/DenseGeneral/Conv call reads it alone")}


def test_the_dry_run_says_why_a_kernel_with_a_frozen_bias_is_per_example():
  data = _data()
  task = Task(model=_small(), loss=_loss, optimizer=_adam,
              trainable=lambda path: not path.endswith("/bias"))
  config = TrainConfig(task=task, l2_clip_norm=1.0, noise_multiplier=1.0, sampling_prob=0.25, steps=1,
                       hparams=dict(learning_rate=0.05))
  by_path = {param: (path, why) for param, path, why in
             loop_spec.clipping_paths(LoopSpec.from_config(config, data), data.train)}
  assert by_path["params/head/bias"] == ("frozen", "Task.trainable leaves it out")
  assert by_path["params/head/kernel"] == (
      "per-example", "Dense 'head': some of its parameters are not leaves of params (not trained, ['bias'])")


def test_the_per_example_working_set_does_not_grow_with_the_vocabulary():
  sizes = []
  for vocab in (1000, 8000):
    model = TransformerClassifier(vocab_size=vocab, max_length=8, width=16, num_heads=2, depth=1)
    task = Task(model=model, loss=_loss, optimizer=_adam)
    data = _data()
    config = TrainConfig(task=task, l2_clip_norm=1.0, noise_multiplier=1.0, sampling_prob=0.25, steps=1,
                         hparams=dict(learning_rate=0.05))
    sizes.append(loop_spec.per_example_bytes(LoopSpec.from_config(config, data), data.train))
  assert sizes[0] == sizes[1]
  vmap = Task(model=TransformerClassifier(vocab_size=8000, max_length=8, width=16, num_heads=2, depth=1),
              loss=_loss, optimizer=_adam, clipping="vmap")
  config = TrainConfig(task=vmap, l2_clip_norm=1.0, noise_multiplier=1.0, sampling_prob=0.25, steps=1,
                       hparams=dict(learning_rate=0.05))
  assert loop_spec.per_example_bytes(LoopSpec.from_config(config, _data()),
                                     _data().train) > 8000 * 16 * 4


@pytest.mark.slow  # a private random search of a LoRA-in-attention transformer: about 20 s
def test_a_private_search_over_the_learning_rate_with_lora_in_attention(two_devices):
  from jaxdp.tuning import random_search  # pylint: disable=g-import-not-at-top
  data = _data(n=256)
  config = TrainConfig(task=_lora_task(), l2_clip_norm=1.0, noise_multiplier=1.0, sampling_prob=0.125,
                       steps=20, hparams=dict(learning_rate=0.05))
  public = _public(data)
  result = random_search(config, {"learning_rate": [0.003, 0.03, 0.3]}, data, distribution=acc.Fixed(3),
                         key=jax.random.key(4), initial_params=public,
                         run_config=RunConfig(trainer=LocalTrainer(devices=two_devices)))
  assert result.hyperparameters["learning_rate"] in (0.003, 0.03, 0.3)
  assert result.epsilon == pytest.approx(
      acc.epsilon(acc.RepeatAndSelect(config.dp_event(data.num_examples), acc.Fixed(3)), 1e-5))
  # initial_params: the public model without adapters; the adapters start from the key and train.
  got = result.params["params"]
  np.testing.assert_array_equal(got["tokens"]["embedding"], public["params"]["tokens"]["embedding"])
  for name in ("query", "key", "value", "out"):
    np.testing.assert_array_equal(got["attention_0"][name]["kernel"], public["params"]["attention_0"][name]["kernel"])
    assert np.any(np.asarray(got["attention_0"][name]["lora_b"]["kernel"]) != 0)
  assert np.isfinite(result.score)
