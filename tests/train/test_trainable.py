"""Frozen parameters, public starting points and LoRA adapters (issue 24, items 1-3).

A frozen leaf must get no per-example gradient (none computed), count toward
no clipping norm on the vmap and the ghost path alike, get no noise and no
update; the DpEvent does not change.
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxdp import accounting as acc
from jaxdp.models import lora
from jaxdp.sweep import Candidate, engine
from jaxdp.train import DpSgdPlan, LoopSpec, Task, TrainConfig, program, train_candidate
from jaxdp.train import trainable as trainable_lib
from jaxdp.train import loop_spec
from jaxdp.train.ghost_analysis import ghost_layers
from jaxdp.tuning import LocalTrainer, random_search, RunConfig, SubsetTuning

HEAD = "params/head/"


class Backbone(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = x.reshape((x.shape[0], -1))
    x = nn.tanh(nn.Dense(32, name="body0")(x))
    return nn.tanh(nn.Dense(16, name="body1")(x))


class Net(nn.Module):
  """A backbone and a head; `rank` > 0 puts LoRA adapters on the backbone's layers."""
  rank: int = 0

  @nn.compact
  def __call__(self, x):
    if self.rank:
      x = x.reshape((x.shape[0], -1))
      x = nn.tanh(lora.LoRADense(32, self.rank, name="body0")(x))
      x = nn.tanh(lora.LoRADense(16, self.rank, name="body1")(x))
    else:
      x = Backbone(name="backbone")(x)
    return nn.Dense(10, name="head")(x)


def _loss(logits, batch):
  return optax.softmax_cross_entropy_with_integer_labels(logits, batch.labels)


def _task(trainable=None, clipping="vmap", model=None):
  return Task(model=model or Net(), loss=_loss, optimizer=lambda hp: optax.sgd(hp["learning_rate"]),
              score=lambda logits, batch: jnp.mean(jnp.argmax(logits, -1) == batch.labels),
              trainable=trainable, clipping=clipping, name=f"net-{clipping}")


def _head_only(path):
  return path.startswith(HEAD)


# One task object per kind, shared by the tests that train: equal specs share compiled programs.
HEAD_TASK = _task(_head_only)
FULL_TASK = _task()


def _config(task, **hparams):
  return TrainConfig(task=task, l2_clip_norm=0.05, noise_multiplier=1.0, sampling_prob=0.05, steps=8,
                     hparams=dict(learning_rate=0.5, **hparams))


# ---------------------------------------------------------------------------- the mask


def test_mask_from_a_predicate_a_tree_or_none():
  params = {"params": {"head": {"kernel": 1.0, "bias": 2.0}, "body": {"kernel": 3.0}}}
  assert trainable_lib.mask(None, params) == {"params": {"head": {"kernel": True, "bias": True},
                                                         "body": {"kernel": True}}}
  by_path = trainable_lib.mask(_head_only, params)
  assert by_path == {"params": {"head": {"kernel": True, "bias": True}, "body": {"kernel": False}}}
  assert trainable_lib.mask(by_path, params) == by_path
  trained, frozen = trainable_lib.partition(params, by_path)
  assert trained == {"params": {"head": {"kernel": 1.0, "bias": 2.0}, "body": {"kernel": None}}}
  assert frozen == {"params": {"head": {"kernel": None, "bias": None}, "body": {"kernel": 3.0}}}
  assert trainable_lib.combine(trained, frozen) == params


@pytest.mark.parametrize("trainable,match", [
    ({"params": {"head": True}}, r"trainable must have the parameters' structure"),
    (lambda path: "yes", r"the trainable predicate must return a bool, got 'yes' for 'params/body/kernel'"),
    (lambda path: False, r"trainable leaves no parameter to train; the parameters are \['params/body/kernel'"),
], ids=["structure", "not-bool", "nothing"])
def test_bad_masks_name_the_problem(trainable, match):
  params = {"params": {"body": {"kernel": 3.0}, "head": {"kernel": 1.0}}}
  with pytest.raises(ValueError, match=match):
    trainable_lib.mask(trainable, params)


@pytest.mark.parametrize("bad", ["head", 3, {"params": "yes"}], ids=repr)
def test_task_rejects_a_trainable_that_is_neither(bad):
  with pytest.raises(ValueError, match="trainable must be None, a predicate"):
    _task(trainable=bad)


# ---------------------------------------------------------------------------- the clipped sum


@pytest.fixture(scope="module")
def batch_and_params(digits):
  batch = jax.tree.map(lambda x: jnp.asarray(x[:24]), digits.train)
  params = Net().init(jax.random.key(0), batch.inputs)
  return batch, params


def _plan():
  # A small C so every example is clipped: the norms decide the result.
  return DpSgdPlan(l2_clip_norm=0.05, noise_multiplier=1.0, sampling_prob=0.05, num_steps=1,
                   num_examples=1000)


# vmap (7 s) in the slow set (the suite's 5-minute budget); ghost differentiates the same leaves.
@pytest.mark.parametrize("method", [pytest.param("vmap", marks=pytest.mark.slow), "ghost"])
def test_the_clipped_sum_is_that_of_a_model_of_the_trainable_parameters_only(batch_and_params, method):
  batch, params = batch_and_params
  valid = jnp.arange(24) < 20  # four padding rows
  task = _task(_head_only, method)
  loss = task.per_example_loss(task.model_for({}))
  trained, frozen = trainable_lib.partition(params, task.trainable_mask(params))
  got = _plan().clipped_grad(trainable_lib.partial_loss(loss, frozen), method=method).fn(
      trained, batch, valid)
  assert got["params"]["backbone"] == {"body0": {"kernel": None, "bias": None},
                                       "body1": {"kernel": None, "bias": None}}

  # The reference: a model whose only parameters are the head's, on fixed features.
  features = Backbone().apply({"params": params["params"]["backbone"]}, batch.inputs)

  def head_loss(head, b):
    return _loss(nn.Dense(10).apply({"params": head}, b.inputs), b)
  want = _plan().clipped_grad(head_loss, method=method).fn(
      params["params"]["head"], batch._replace(inputs=features), valid)
  for a, b in zip(jax.tree.leaves(got["params"]["head"]), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=1e-7)
  # Full training clips the head by a norm that includes the backbone's gradient: another sum.
  full = _plan().clipped_grad(loss, method=method).fn(params, batch, valid)
  assert not np.allclose(np.asarray(full["params"]["head"]["kernel"]), np.asarray(want["kernel"]),
                         rtol=1e-3)


def _value_shapes(jaxpr) -> set:
  """Shapes of every value the jaxpr computes, inner jaxprs (scan, cond branches, pjit) included."""
  shapes = {tuple(getattr(v.aval, "shape", ())) for eqn in jaxpr.eqns for v in eqn.outvars}
  for eqn in jaxpr.eqns:
    for param in eqn.params.values():
      for inner in param if isinstance(param, (tuple, list)) else (param,):
        inner = getattr(inner, "jaxpr", inner)
        if hasattr(inner, "eqns"):
          shapes |= _value_shapes(inner)
  return shapes


def test_no_per_example_gradient_of_a_frozen_leaf_is_computed(batch_and_params):
  batch, params = batch_and_params
  valid = jnp.ones(24, bool)
  shapes = {}
  for name, trainable in (("full", None), ("head", _head_only)):
    task = _task(trainable)
    loss = task.per_example_loss(task.model_for({}))
    trained, frozen = trainable_lib.partition(params, task.trainable_mask(params))
    # The vmap path, which materialises every trained leaf's per-example gradient.
    fn = _plan().clipped_grad(trainable_lib.partial_loss(loss, frozen), method="vmap").fn
    shapes[name] = _value_shapes(jax.make_jaxpr(fn)(trained, batch, valid).jaxpr)
  # The per-example gradient of the first backbone kernel, (24, 64, 32), exists only
  # when that kernel trains.
  assert (24, 64, 32) in shapes["full"] and (24, 64, 32) not in shapes["head"]
  assert (24, 16, 10) in shapes["head"]  # the head's per-example gradient


def test_auto_clipping_of_a_frozen_backbone_names_it_frozen(digits):
  # The analysis traces the loss with the frozen leaves as abstract constants (no memory).
  task = _task(_head_only, "auto")
  spec = loop_spec.LoopSpec.from_config(_config(task), digits)
  paths = loop_spec.clipping_paths(spec, digits.train)
  assert [(param, path) for param, path, _ in paths] == [
      (f"params/{layer}/{leaf}", path) for layer, path in
      (("backbone/body0", "frozen"), ("backbone/body1", "frozen"), ("head", "ghost")) for leaf in ("bias", "kernel")]
  # The microbatch counts no per-example gradient of the head, whose norm is a ghost norm.
  assert loop_spec.per_example_bytes(spec, digits.train) < loop_spec.per_example_bytes(
      loop_spec.LoopSpec.from_config(_config(_task(_head_only, "vmap")), digits), digits.train)


# ---------------------------------------------------------------------------- a search


@pytest.fixture(scope="module")
def pretrained(digits):
  """'Public' backbone weights: any fixed parameters will do for these tests."""
  params = Net().init(jax.random.key(42), jnp.asarray(digits.train.inputs[:1]))
  return {"params": {"backbone": params["params"]["backbone"]}}


@pytest.mark.slow  # two searches: about 8 s
def test_a_head_only_search_leaves_the_backbone_bit_for_bit(digits, pretrained, two_devices):
  config = _config(HEAD_TASK)
  result = random_search(config, {"learning_rate": [0.3, 1.0]}, digits, distribution=acc.Fixed(3),
                         key=jax.random.key(1), initial_params=pretrained,
                         run_config=RunConfig(trainer=LocalTrainer(devices=two_devices)))
  for got, want in zip(jax.tree.leaves(result.params["params"]["backbone"]),
                       jax.tree.leaves(pretrained["params"]["backbone"])):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert np.asarray(got).dtype == np.asarray(want).dtype
  init = Net().init(jax.random.split(jax.random.key(0))[0], jnp.asarray(digits.train.inputs[:1]))
  assert not np.array_equal(np.asarray(result.params["params"]["head"]["kernel"]),
                            np.asarray(init["params"]["head"]["kernel"]))  # the head trained
  # The same event as full training: frozen leaves change nothing accounted.
  full = random_search(_config(FULL_TASK), {"learning_rate": [0.3, 1.0]}, digits,
                       distribution=acc.Fixed(3), key=jax.random.key(1),
                       run_config=RunConfig(trainer=LocalTrainer(devices=two_devices)))
  assert result.event == full.event and result.epsilon == full.epsilon


@pytest.mark.slow  # two ghost-clipped compilations: about 5 s
def test_a_lone_run_and_the_engine_agree_with_frozen_leaves(digits, pretrained, two_devices):
  config = _config(_task(_head_only, "ghost"))
  cand = Candidate({"i": 0}, config, 5)
  lone = train_candidate(config, digits, cand.key(), initial_params=pretrained)
  batched = engine.train_candidates([cand], digits, devices=two_devices[:1], keep_params=True,
                                    initial_params=pretrained)[0]
  for a, b in zip(jax.tree.leaves(lone.params), jax.tree.leaves(batched.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  np.testing.assert_array_equal(np.asarray(lone.params["params"]["backbone"]["body0"]["kernel"]),
                                np.asarray(pretrained["params"]["backbone"]["body0"]["kernel"]))


@pytest.mark.parametrize("initial,match", [
    ({"params": {"backbone": {"body9": {"kernel": np.zeros((64, 32))}}}},
     r"the model has no \['params/backbone/body9/kernel'\]"),
    ({"params": {"head": {"kernel": np.zeros((16, 3))}}},
     r"initial_params leaf 'params/head/kernel' has shape \(16, 3\), the model needs \(16, 10\)"),
    ({}, r"the model has no array"),
], ids=["unknown-path", "shape", "empty"])
def test_public_parameters_that_do_not_fit_are_refused_before_k_is_drawn(digits, initial, match,
                                                                        monkeypatch):
  from jaxdp.tuning import draws  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(draws, "draw_search", lambda *a: pytest.fail("K was drawn"))
  with pytest.raises(ValueError, match=match):
    random_search(_config(HEAD_TASK), {"learning_rate": [0.3]}, digits,
                  distribution=acc.Fixed(2), key=jax.random.key(1), initial_params=initial)


# ---------------------------------------------------------------------------- LoRA


def test_lora_dense_starts_as_the_pretrained_dense_and_trains_only_adapters(digits):
  x = jnp.asarray(digits.train.inputs[:5]).reshape(5, -1)
  dense = nn.Dense(7)
  weights = dense.init(jax.random.key(0), x)
  adapted = lora.LoRADense(7, rank=2, alpha=4.0)
  params = adapted.init(jax.random.key(1), x)
  assert set(params["params"]) == {"kernel", "bias", "lora_a", "lora_b"}
  params = {"params": dict(params["params"], **weights["params"])}  # the pretrained Dense loads as is
  np.testing.assert_allclose(adapted.apply(params, x), dense.apply(weights, x), rtol=1e-6, atol=1e-6)
  leaf_mask = trainable_lib.mask(lora.adapters, params)
  assert leaf_mask == {"params": {"kernel": False, "bias": False, "lora_a": {"kernel": True},
                                  "lora_b": {"kernel": True}}}
  # The adapters are plain Dense calls: ghost clipping takes their norms.
  trained, frozen = trainable_lib.partition(params, leaf_mask)
  loss = lambda p, b: jnp.sum(adapted.apply(trainable_lib.combine(p, frozen), b) ** 2, axis=-1)  # noqa: E731
  split = ghost_layers(loss, trained, x)
  assert split.ghost_leaves == ("['params']['lora_a']['kernel']", "['params']['lora_b']['kernel']")
  assert split.fallback_leaves == ()
  with pytest.raises(ValueError, match="rank must be an integer"):
    lora.LoRADense(7, rank=0).init(jax.random.key(1), x)


def test_lora_conv_starts_as_the_pretrained_conv(digits):
  x = jnp.asarray(digits.train.inputs[:3])
  conv = nn.Conv(4, (3, 3))
  weights = conv.init(jax.random.key(0), x)
  adapted = lora.LoRAConv(4, (3, 3), rank=2)
  params = adapted.init(jax.random.key(1), x)
  params = {"params": dict(params["params"], **weights["params"])}
  np.testing.assert_allclose(adapted.apply(params, x), conv.apply(weights, x), rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # two ranks, two compilations of a ghost-clipped LoRA model: about 14 s
def test_a_lora_search_from_a_pretrained_backbone(digits, two_devices):
  # Pretrained backbone weights load into the LoRA model by their Dense names.
  plain = Net().init(jax.random.key(7), jnp.asarray(digits.train.inputs[:1]))["params"]["backbone"]
  public = {"params": {"body0": plain["body0"], "body1": plain["body1"]}}
  trainable = lambda path: lora.adapters(path) or path.startswith(HEAD)  # noqa: E731
  task = _task(trainable, "ghost", model=lambda hp: Net(rank=hp["rank"]))
  result = random_search(_config(task, rank=2),
                         {"learning_rate": [0.5, 2.0], "rank": [1, 4]}, digits,
                         distribution=acc.Fixed(3), key=jax.random.key(2), initial_params=public,
                         run_config=RunConfig(trainer=LocalTrainer(devices=two_devices)))
  assert result.hyperparameters["rank"] in (1, 4)
  for layer in ("body0", "body1"):
    np.testing.assert_array_equal(np.asarray(result.params["params"][layer]["kernel"]),
                                  np.asarray(public["params"][layer]["kernel"]))
    assert np.any(np.asarray(result.params["params"][layer]["lora_b"]["kernel"]) != 0)  # trained


@pytest.mark.slow  # a durable search: about 5 s
def test_a_durable_search_refuses_other_public_parameters(digits, pretrained, two_devices, tmp_path):
  from jaxdp.sweep import SearchMismatchError  # pylint: disable=g-import-not-at-top
  kwargs = dict(distribution=acc.Fixed(1), key=jax.random.key(1), run_config=RunConfig(run_dir=tmp_path,
                                                                                       trainer=LocalTrainer(devices=two_devices)))
  random_search(_config(HEAD_TASK), {"learning_rate": [0.3]}, digits, initial_params=pretrained,
                **kwargs)
  other = jax.tree.map(lambda x: x + 1.0, pretrained)
  with pytest.raises(SearchMismatchError, match="differs in: jaxdp_initial_params"):
    random_search(_config(HEAD_TASK), {"learning_rate": [0.3]}, digits, initial_params=other,
                  **kwargs)


@pytest.mark.slow  # a subset and a final run, each compiled for its size: about 8 s
def test_subsampled_search_starts_its_tuning_and_final_run_from_public_parameters(digits, pretrained,
                                                                                two_devices):
  from jaxdp.train import keep_hparams  # pylint: disable=g-import-not-at-top
  from jaxdp.tuning import subsampled_search  # pylint: disable=g-import-not-at-top
  task = dataclasses.replace(_task(_head_only), extrapolate=keep_hparams)
  result = subsampled_search(_config(task), {"learning_rate": [0.3, 1.0]}, digits,
                             subset=SubsetTuning(0.5, 1), distribution=acc.Fixed(2),
                             key=jax.random.key(3),
                             run_config=RunConfig(trainer=LocalTrainer(devices=two_devices)),
                             initial_params=pretrained)
  for got, want in zip(jax.tree.leaves(result.params["params"]["backbone"]),
                       jax.tree.leaves(pretrained["params"]["backbone"])):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
