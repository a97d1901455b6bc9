"""What a user reads when a task does not fit its data (issue 32).

Each message names the user's function (model, loss, score, optimizer
factory, inputs), says what it returned as plain shape tuples nested as the
returned tree, and what was expected; JAX's `PyTreeDef(...)` reprs and an
inner library's words alone are not a message. The inner error stays chained
(`__cause__`) for debugging.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import dp_accounting

from jaxdp.data import Dataset
from jaxdp.train import DpScore, LoopSpec, Model, Task, TrainConfig, check_task, checks

N_TRAIN, N_TEST, N_VAL, D, CLASSES = 32, 8, 16, 5, 3


def _split(rng, n):
  x = rng.normal(size=(n, D)).astype(np.float32)
  return {"x": x, "y": rng.integers(0, CLASSES, size=n).astype(np.int32)}


_RNG = np.random.default_rng(0)
DATA = Dataset(name="toy", train=_split(_RNG, N_TRAIN), test=_split(_RNG, N_TEST),
               private_validation=_split(_RNG, N_VAL), num_examples=N_TRAIN)


class Net(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(CLASSES)(x)


class DictNet(nn.Module):
  @nn.compact
  def __call__(self, x):
    return {"logits": nn.Dense(CLASSES)(x)}


def ce(logits, batch):
  return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"])


def accuracy(logits, batch):
  return jnp.mean(jnp.argmax(logits, -1) == batch["y"])


def sgd(hp):
  return optax.sgd(hp["learning_rate"])


PARAMS = "{'params': {'Dense_0': {'bias': (3,), 'kernel': (5, 3)}}}"


def _message(**task_fields) -> ValueError:
  fields = dict(model=Net(), loss=ce, score=accuracy, optimizer=sgd, name="mine")
  fields.update(task_fields)
  config = TrainConfig(task=Task(**fields), l2_clip_norm=1.0, noise_multiplier=1.0, sampling_prob=0.25,
                       steps=2, hparams={"learning_rate": 0.1})
  with pytest.raises(ValueError) as info:
    check_task(LoopSpec.from_config(config, DATA), DATA)
  err = info.value
  assert "PyTreeDef" not in str(err) and "ShapeDtypeStruct" not in str(err), str(err)
  assert str(err).startswith("task 'mine': "), str(err)
  return err


# ------------------------------------------------------------------- the loss


def test_a_dict_output_given_to_an_array_loss_names_the_model_the_loss_and_the_key():
  err = _message(model=DictNet())
  text = str(err)
  assert "the model DictNet returns a dict of shapes {'logits': (2, 3)}, not an array" in text
  assert "the loss ce fails on it" in text and "outputs['logits']" in text
  # optax's own words are not the message; they stay in the chained error.
  assert "2- or 3- tuple" not in text and err.__cause__ is not None


def test_a_loss_that_averages_is_named_with_what_it_returned():
  def mean_loss(logits, batch):
    return jnp.mean(ce(logits, batch))
  text = str(_message(loss=mean_loss))
  assert ("the loss must return one value per example, shape (2,) for a batch of 2; the loss "
          "mean_loss returned ()") in text
  assert "not their mean or sum" in text


def test_a_loss_returning_a_dict_shows_its_shapes():
  text = str(_message(loss=lambda logits, batch: {"l": ce(logits, batch)}))
  assert "returned {'l': (2,)}" in text
  assert "(lambda at test_checks.py:" in text  # a lambda is named by where it is written


def test_a_loss_returning_a_pair_without_has_aux_is_told_about_has_aux():
  text = str(_message(loss=lambda logits, batch: (ce(logits, batch), logits)))
  assert "returned ((2,), (2, 3))" in text and "Task(has_aux=True)" in text


def test_has_aux_with_a_plain_array():
  text = str(_message(loss=ce, has_aux=True))
  assert "with Task(has_aux=True) the loss ce must return (losses, aux)" in text
  assert "it returned an array of shape (2,)" in text


def test_an_integer_loss():
  def wrong(logits, batch):
    del batch
    return jnp.argmax(logits, -1)
  assert "the loss wrong returned int32 values; per-example losses must be floats" in str(_message(loss=wrong))


# ------------------------------------------------------------------- the score


def test_a_per_example_score_names_the_score_and_its_shape():
  def correct(logits, batch):
    return jnp.argmax(logits, -1) == batch["y"]
  text = str(_message(score=correct))
  assert f"the score must return a scalar, got ({N_TEST},) from the score correct on data.test" in text
  assert "return their mean" in text


def test_a_score_returning_a_dict():
  def scores(logits, batch):
    return {"accuracy": accuracy(logits, batch)}
  err = _message(score=scores)
  assert "got {'accuracy': ()} from the score scores" in str(err)
  assert err.__cause__ is not None  # what the scoring program raised on it


def test_a_score_returning_none_or_a_string():
  assert "got None from the score" in str(_message(score=lambda logits, batch: None))
  assert "got str from the score" in str(_message(score=lambda logits, batch: "high"))


def test_an_array_score_on_a_dict_output():
  text = str(_message(model=DictNet(), loss=lambda out, batch: ce(out["logits"], batch)))
  assert "the score fails on data.test" in text
  assert f"the model DictNet returns a dict of shapes {{'logits': ({N_TEST}, 3)}}" in text
  assert "the score accuracy fails on it" in text


def test_a_dp_score_returning_a_vector():
  score = DpScore(fn=lambda logits, batch, key: logits, event=dp_accounting.GaussianDpEvent(1.0))
  text = str(_message(score=score))
  assert f"got ({N_VAL}, 3) from the score DpScore(fn=(lambda at test_checks.py:" in text
  assert "on data.private_validation" in text


# ------------------------------------------------------------ model and inputs


def test_a_model_that_cannot_take_the_inputs():
  model = Model(init=lambda key, x: {"w": jnp.zeros((D + 1, CLASSES))}, apply=lambda p, x: x @ p["w"])
  err = _message(model=model)
  text = str(err)
  assert "the model Model(init=(lambda at test_checks.py:" in text
  assert "cannot take inputs of shape (2, 5): its apply raised TypeError" in text
  assert isinstance(err.__cause__, TypeError)


def test_inputs_that_select_nothing():
  text = str(_message(inputs="z"))
  assert ("inputs cannot select the model input from a batch of shapes {'x': (2, 5), 'y': (2,)}: "
          "Task.inputs='z' raised KeyError: 'z'") in text


# ------------------------------------------------------------------ the optimizer


def _transformation(init, update):
  def my_optimizer(hp):
    lr = hp["learning_rate"]
    return optax.GradientTransformation(init, lambda u, s, p=None: update(lr, u, s))
  return my_optimizer


def test_updates_not_shaped_like_the_parameters():
  def init(params):
    return ()
  err = _message(optimizer=_transformation(init, lambda lr, u, s: ({"a": lr}, s)))
  text = str(err)
  assert "one DP step fails with static hyperparameters {} and traced ['learning_rate']" in text
  assert "the optimizer from the factory my_optimizer: " in text  # not 'test_....<locals>.my_optimizer'
  assert f"its update returned updates {{'a': ()}}; they must be shaped like the parameters {PARAMS}" in text


def test_a_state_that_changes_its_dtype_across_a_step():
  def init(params):
    return jnp.zeros((), jnp.int32)
  def update(lr, u, s):
    return jax.tree.map(lambda g: -lr * g, u), s + 0.5
  text = str(_message(optimizer=_transformation(init, update)))
  assert "its update returned the state float32[], its init int32[]" in text
  assert "must keep its structure, shapes and dtypes" in text


def test_an_inner_error_quoting_a_treedef_shows_the_nesting_only():
  def init(params):
    raise ValueError(f"cannot handle {jax.tree.structure(params)}")
  text = str(_message(optimizer=_transformation(init, lambda lr, u, s: (u, s))))
  assert "its init raised ValueError: cannot handle {'params': {'Dense_0': {'bias': *, 'kernel': *}}}" in text
  assert f"on the parameters {PARAMS}" in text


def test_trainable_of_another_structure():
  text = str(_message(trainable={"params": {"Dense_0": {"kernel": True}}}))
  assert (f"Task.trainable must be shaped like the model's parameters {PARAMS} (or be a predicate on "
          "their '/'-joined paths); it is {'params': {'Dense_0': {'kernel': True}}}") in text


# ---------------------------------------------------------- describe_tree itself


def test_describe_tree_shows_shapes_as_plain_tuples():
  tree = {"a": jnp.zeros((2, 10)), "b": (np.zeros(3, np.int32), jax.ShapeDtypeStruct((), jnp.float32)),
          "c": None, "d": 1.5, "e": True, "f": "text"}
  assert checks.describe_tree(tree) == "{'a': (2, 10), 'b': ((3,), ()), 'c': None, 'd': float, 'e': True, 'f': str}"
  assert checks.describe_tree(jnp.zeros(4)) == "(4,)"
  assert checks.describe_tree({"s": jnp.zeros((), jnp.int32)}, dtypes=True) == "{'s': int32[]}"


def test_initial_params_messages_name_paths_and_shapes():
  expected = {"params": {"Dense_0": {"kernel": jax.ShapeDtypeStruct((5, 3), jnp.float32)}}}
  with pytest.raises(ValueError, match=r"the model has no \['params/Dense_1/kernel'\]") as info:
    checks.check_initial_params({"params": {"Dense_1": {"kernel": np.zeros((5, 3))}}}, expected)
  assert "PyTreeDef" not in str(info.value)
  with pytest.raises(ValueError, match=r"'params/Dense_0/kernel' has shape \(4, 3\), the model needs \(5, 3\)"):
    checks.check_initial_params({"params": {"Dense_0": {"kernel": np.zeros((4, 3))}}}, expected)
