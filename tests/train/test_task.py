"""A user's own task, not a preset, end to end through `train_candidate` (issue 12).

Own Flax module or plain init/apply pair, own per-example loss over dict
batches, own score, an optax chain built from the hyperparameters, NumPy data;
which hyperparameters are traced and which static; where scores read data and
what they cost in privacy; bad input refused, naming the culprit, before
anything trains.
"""

import functools
import math

import dp_accounting
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from dp_accounting import rdp

from jaxdp import accounting as acc
from jaxdp.data import Dataset
from jaxdp.train import (CONFIG_FIELDS, DpScore, HParams, LoopSpec, Model, NoisyMean,
                         NotPrivateWarning, Task, TrainConfig, UncheckedHparamsWarning, presets,
                         check_task, program, train_candidate, trainer)
from jaxdp.train import loop_spec

D, N_TRAIN, N_TEST, N_VAL = 5, 64, 24, 400


def _split(rng, w, n):
  x = rng.normal(size=(n, D)).astype(np.float32)
  return {"x": x, "y": (x @ w > 0).astype(np.float32)}


def _make_data():
  rng = np.random.default_rng(0)
  w = rng.normal(size=D)
  # Three splits of different sizes, so a score's batch tells which one it read.
  return Dataset(name="halfspace", train=_split(rng, w, N_TRAIN), test=_split(rng, w, N_TEST),
                 private_validation=_split(rng, w, N_VAL), num_examples=N_TRAIN)


DATA = _make_data()


class MLP(nn.Module):
  """Two layers, one logit per example."""
  width: int
  scale: float = 1.0

  @nn.compact
  def __call__(self, x):
    hidden = jnp.tanh(nn.Dense(self.width)(x))
    return self.scale * nn.Dense(1)(hidden)[..., 0]


def bce(logits, batch):
  return optax.sigmoid_binary_cross_entropy(logits, batch["y"])


def accuracy(logits, batch):
  return jnp.mean((logits > 0) == (batch["y"] > 0.5))


def correct(logits, batch):
  return ((logits > 0) == (batch["y"] > 0.5)).astype(jnp.float32)


def clipped_adamw(hp):
  return optax.chain(optax.clip_by_global_norm(1.0),
                     optax.adamw(hp["learning_rate"], weight_decay=hp["weight_decay"]))


def sgd(hp):
  return optax.sgd(hp["learning_rate"])


def _linear_init(key, x):
  del key  # deterministic zeros: the exact-GD check below starts from them
  return {"w": jnp.zeros(x.shape[1:], jnp.float32), "b": jnp.zeros((), jnp.float32)}


def _linear_apply(params, x):
  return x @ params["w"] + params["b"]


LINEAR = Model(init=_linear_init, apply=_linear_apply)

# Tasks are compared by identity: module-level objects share compiled programs.
MLP_TASK = Task(model=lambda hp: MLP(width=hp["width"]), loss=bce, score=accuracy,
                optimizer=clipped_adamw, name="mlp-bce")
LINEAR_TASK = Task(model=LINEAR, loss=bce, optimizer=sgd, name="linear-bce")  # score: -mean loss


MLP_HP = dict(width=8, learning_rate=0.05, weight_decay=1e-4)


def _config(task=MLP_TASK, hparams=None, **kw):
  """Config fields by name; other names are hyperparameters over `hparams` (MLP_HP for MLP_TASK)."""
  fields = dict(l2_clip_norm=1.0, noise_multiplier=0.5, sampling_prob=0.25, steps=40)
  hparams = dict(hparams or (MLP_HP if task is MLP_TASK else dict(learning_rate=0.5)))
  for name, value in kw.items():
    (fields if name in CONFIG_FIELDS + ("execution",) else hparams)[name] = value
  return TrainConfig(task=task, hparams=hparams, **fields)


@pytest.fixture
def no_training(monkeypatch):
  """Fails the test if anything gets as far as compiling a training run."""
  def refuse(spec):
    raise AssertionError(f"training was reached for task {spec.task.name!r}")
  monkeypatch.setattr(trainer, "compiled", refuse)


# ---------------------------------------------------------------- a user's task


def test_user_flax_task_trains_and_is_scored_on_the_public_test_split():
  cfg = _config()
  result = train_candidate(cfg, DATA, jax.random.key(0))
  assert not result.diverged and result.steps == result.planned_steps == 40
  assert result.params["params"]["Dense_0"]["kernel"].shape == (D, 8)  # width from the factory
  logits = MLP(width=8).apply(result.params, DATA.test["x"])
  assert result.score == result.test_score == pytest.approx(float(accuracy(logits, DATA.test)), abs=1e-6)
  assert result.test_loss == pytest.approx(float(jnp.mean(bce(logits, DATA.test))), rel=1e-5)
  assert result.test_score >= 0.8  # it learned (chance is about 0.5)
  assert result.score_source == trainer.PUBLIC_SOURCE
  want = rdp.RdpAccountant().compose(acc.dpsgd_event(0.25, 0.5, 40)).get_epsilon(1e-5)
  assert result.epsilon == pytest.approx(want, rel=1e-12) and result.delta == 1e-5


def test_batch_size_is_the_same_run_as_sampling_prob_b_over_n():
  # b = 16 on N = 64 is q = 1/4: same spec, same program, same result.
  by_q = train_candidate(_config(), DATA, jax.random.key(0))
  by_b = train_candidate(_config(batch_size=16.0, sampling_prob=None), DATA, jax.random.key(0))
  for a, b in zip(jax.tree.leaves(by_q.params), jax.tree.leaves(by_b.params)):
    np.testing.assert_array_equal(a, b)
  assert (by_b.score, by_b.epsilon, by_b.planned_steps) == (by_q.score, by_q.epsilon, 40)


def test_init_apply_pair_with_q_one_and_no_noise_is_exact_gradient_descent():
  with pytest.warns(NotPrivateWarning):
    cfg = _config(LINEAR_TASK, sampling_prob=1.0, noise_multiplier=0.0, l2_clip_norm=1e6, steps=3)
  result = train_candidate(cfg, DATA, jax.random.key(0))

  def mean_loss(p):
    return jnp.mean(bce(_linear_apply(p, DATA.train["x"]), DATA.train))
  p = _linear_init(None, DATA.train["x"])
  for _ in range(3):
    p = jax.tree.map(lambda w, g: w - 0.5 * g, p, jax.grad(mean_loss)(p))
  for a, b in zip(jax.tree.leaves(result.params), jax.tree.leaves(p)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  # score=None: minus the mean loss on the public test split.
  test_loss = float(jnp.mean(bce(_linear_apply(p, DATA.test["x"]), DATA.test)))
  assert result.test_loss == pytest.approx(test_loss, rel=1e-5)
  assert result.score == result.test_score == -result.test_loss


def test_has_aux_loss_trains_exactly_like_the_plain_loss():
  def bce_with_aux(logits, batch):
    return bce(logits, batch), {"mean_logit": jnp.mean(logits)}
  aux_task = Task(model=LINEAR, loss=bce_with_aux, has_aux=True, optimizer=sgd, name="aux")
  # Same q, T, N as the exact-GD test (its program is reused); sigma is traced.
  plain = train_candidate(_config(LINEAR_TASK, sampling_prob=1.0, steps=3), DATA, jax.random.key(4))
  aux = train_candidate(_config(aux_task, sampling_prob=1.0, steps=3), DATA, jax.random.key(4))
  for a, b in zip(jax.tree.leaves(aux.params), jax.tree.leaves(plain.params)):
    np.testing.assert_array_equal(a, b)
  assert (aux.score, aux.test_loss) == (plain.score, plain.test_loss)
  assert not any(np.array_equal(a, np.zeros_like(a)) for a in jax.tree.leaves(aux.params))


def test_inputs_select_the_model_input_from_the_batch():
  batch = {"features": np.ones((2, 3)), "label": np.zeros(2)}
  assert Task(model=LINEAR, loss=bce, optimizer=sgd, inputs="features").model_inputs(batch) is batch["features"]
  pick = Task(model=LINEAR, loss=bce, optimizer=sgd, inputs=lambda b: b["features"] * 2)
  np.testing.assert_array_equal(pick.model_inputs(batch), 2 * batch["features"])
  x, y = np.ones((2, 3)), np.zeros(2)
  assert LINEAR_TASK.model_inputs((x, y)) is x  # tuples (and DataSplit): element 0
  assert LINEAR_TASK.model_inputs({"x": x, "y": y}) is x  # dicts: 'x'
  assert Task(model=LINEAR, loss=bce, optimizer=sgd, inputs=1).model_inputs((x, y)) is y


# ------------------------------------------------------- traced vs static hparams


class _Recorder:
  """An optimizer factory that records what each hyperparameter was when it built."""

  def __init__(self):
    self.types = {}

  def __call__(self, hp):
    self.types = {name: type(hp[name]) for name in ("learning_rate", "weight_decay", "warmup",
                                                     "schedule")}
    lr = hp["learning_rate"]
    if hp["schedule"] == "warmup":
      lr = optax.linear_schedule(0.0, lr, hp["warmup"])
    return optax.adamw(lr, weight_decay=hp["weight_decay"])


HP = dict(width=8, scale=0.5, learning_rate=0.1, weight_decay=0.01, warmup=5, schedule="warmup")


def _split_task(static=(), optimizer=None):
  return Task(model=lambda hp: MLP(width=hp["width"], scale=hp["scale"]), loss=bce, score=accuracy,
              optimizer=optimizer or _Recorder(), static=static, name="split")


def test_floats_are_traced_unless_the_model_reads_them_the_rest_is_static():
  task = _split_task()
  static, traced = task.split_hparams(HP)
  # 'scale' is a float, but the model factory reads it: it shapes the program.
  assert static == dict(width=8, scale=0.5, warmup=5, schedule="warmup")
  assert traced == dict(learning_rate=0.1, weight_decay=0.01)
  assert task.model_reads(HP) == {"width", "scale"}
  # NumPy floats are floats; an int learning rate is an int, hence static.
  assert task.split_hparams({**HP, "learning_rate": np.float32(0.1)})[1].keys() == traced.keys()
  assert "learning_rate" in task.split_hparams({**HP, "learning_rate": 1})[0]


def test_loop_spec_groups_candidates_by_static_values_only():
  task = _split_task()
  cfg = _config(task, **HP)
  spec = LoopSpec.from_config(cfg, DATA)
  assert spec.static_hparams == (("scale", 0.5), ("schedule", "warmup"), ("warmup", 5), ("width", 8))
  assert spec.traced_names == ("learning_rate", "weight_decay")
  traced = loop_spec.traced_hparams(spec, cfg)
  assert {k: (v.dtype, v.shape) for k, v in traced.items()} == {
      "learning_rate": (jnp.float32, ()), "weight_decay": (jnp.float32, ())}
  np.testing.assert_allclose([traced["learning_rate"], traced["weight_decay"]], [0.1, 0.01])
  # A traced value changes nothing static: one compiled program serves both.
  same = LoopSpec.from_config(cfg.replace(learning_rate=3.0, weight_decay=0.0), DATA)
  assert same == spec and hash(same) == hash(spec)
  for change in (dict(width=16), dict(scale=2.0), dict(warmup=6), dict(schedule="constant")):
    assert LoopSpec.from_config(cfg.replace(**change), DATA) != spec, change
  # Inside the loop the factory sees tracers for traced names, Python values for static ones.
  loop = program.build_train_loop(spec)
  params = jax.eval_shape(functools.partial(program.init_params, spec), jax.random.key(0), DATA.train)
  jax.eval_shape(loop, params, cfg.plan(N_TRAIN), traced, jax.random.key(1), DATA.train)
  types = task.optimizer.types
  assert issubclass(types["learning_rate"], jax.core.Tracer)
  assert issubclass(types["weight_decay"], jax.core.Tracer)
  assert (types["warmup"], types["schedule"]) == (int, str)


def test_task_static_makes_a_float_static():
  task = _split_task(static=("weight_decay",))
  spec = LoopSpec.from_config(_config(task, **HP), DATA)
  assert ("weight_decay", 0.01) in spec.static_hparams and spec.traced_names == ("learning_rate",)
  assert Task(model=LINEAR, loss=bce, optimizer=sgd, static=["a", "b"]).static == ("a", "b")


def _branchy(hp):
  # Python control flow on a float: needs a concrete value.
  if hp["learning_rate"] > 0.5:
    return optax.sgd(hp["learning_rate"])
  return optax.adam(hp["learning_rate"])


def test_python_control_flow_on_a_traced_float_makes_it_static(no_training):
  # Issue 24: what used to raise (asking for Task(static=...)) is detected when the task is
  # checked; the float becomes static and the check passes.
  task = Task(model=LINEAR, loss=bce, optimizer=_branchy, name="branchy")
  cfg = _config(task, learning_rate=0.1)  # concrete at construction: fine
  spec = LoopSpec.from_config(cfg, DATA)
  assert spec.traced_names == () and spec.static_hparams == (("learning_rate", 0.1),)
  assert [name for name, _ in spec.auto_static] == ["learning_rate"]
  # In plain words: where the value is needed and what for, no exception class.
  assert spec.auto_static[0][1].startswith("the optimizer factory needs a concrete value: the code at "
                                           "line ")
  assert spec.auto_static[0][1].endswith("uses it in Python control flow (an if or a comparison)")
  assert "Error" not in spec.auto_static[0][1]
  check_task(spec, DATA)  # passes; nothing compiled
  fixed = Task(model=LINEAR, loss=bce, optimizer=_branchy, static=("learning_rate",), name="fixed")
  spec = LoopSpec.from_config(_config(fixed, learning_rate=0.1), DATA)
  assert spec.traced_names == ()
  check_task(spec, DATA)  # passes; nothing compiled


# ------------------------------------------------------------------ score modes


def test_public_score_reads_only_the_public_test_split():
  seen = []

  def recording_accuracy(logits, batch):
    seen.append(jax.tree.map(np.shape, batch))
    return accuracy(logits, batch)
  task = Task(model=lambda hp: MLP(width=hp["width"]), loss=bce, score=recording_accuracy,
              optimizer=clipped_adamw, name="recorded")
  cfg = _config(task, MLP_HP)
  a = train_candidate(cfg, DATA, jax.random.key(2))
  # Every batch the score was ever given has the test split's size (24), never
  # the private train (64) or private validation (400) size.
  assert seen and all(s == {"x": (N_TEST, D), "y": (N_TEST,)} for s in seen)
  # Same private training data, test labels flipped: the training (params) is
  # untouched and the score is exactly the complement, so it reads test only.
  flipped = Dataset(train=DATA.train, test={"x": DATA.test["x"], "y": 1.0 - DATA.test["y"]},
                    private_validation=DATA.private_validation, num_examples=N_TRAIN)
  b = train_candidate(cfg, flipped, jax.random.key(2))
  for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
    np.testing.assert_array_equal(x, y)
  logits = MLP(width=8).apply(a.params, DATA.test["x"])
  assert not np.any(logits == 0)  # no ties: flipping every label flips every hit
  assert b.score == pytest.approx(1.0 - a.score, abs=1e-6) and 0.0 < a.score < 1.0
  assert b.test_loss != a.test_loss
  assert a.epsilon == b.epsilon == cfg.epsilon(N_TRAIN)  # the public score costs nothing


@pytest.mark.parametrize("task", [MLP_TASK, LINEAR_TASK], ids=["score", "minus-loss"])
def test_public_score_without_public_data_is_refused(task, no_training):
  cfg = _config(task)
  for data in (Dataset(train=DATA.train, num_examples=N_TRAIN),
               Dataset(train=DATA.train, private_validation=DATA.private_validation,
                       num_examples=N_TRAIN)):
    with pytest.raises(ValueError, match="jaxdp never scores on the private training data"):
      train_candidate(cfg, data, jax.random.key(0))


NOISY = NoisyMean(fn=correct, low=0.0, high=1.0, noise_multiplier=2.0, num_examples=N_VAL)
NOISY_TASK = Task(model=LINEAR, loss=bce, optimizer=sgd, score=NOISY, name="noisy")


def test_noisy_mean_score_is_accounted_and_reads_private_validation():
  cfg = _config(NOISY_TASK, sampling_prob=0.25, noise_multiplier=1.0, steps=20)
  train_event = acc.dpsgd_event(0.25, 1.0, 20)
  want_event = dp_accounting.ComposedDpEvent([train_event, dp_accounting.GaussianDpEvent(2.0)])
  assert cfg.dp_event(N_TRAIN) == want_event == cfg.dp_event()
  result = train_candidate(cfg, DATA, jax.random.key(1))
  want = rdp.RdpAccountant().compose(want_event).get_epsilon(1e-5)
  assert result.epsilon == pytest.approx(want, rel=1e-12) == cfg.epsilon(N_TRAIN)
  assert result.epsilon > rdp.RdpAccountant().compose(train_event).get_epsilon(1e-5)
  assert result.score_source == trainer.PRIVATE_SOURCE
  # The score: validation accuracy plus noise of std 2 * (1 - 0) / 2 / 400 = 0.005.
  logits = _linear_apply(result.params, DATA.private_validation["x"])
  true = float(accuracy(logits, DATA.private_validation))
  assert result.score != true and abs(result.score - true) < 5 * 0.005
  # The public test columns are still reported (minus the test loss: no plain score).
  assert result.test_score == -result.test_loss
  test_logits = _linear_apply(result.params, DATA.test["x"])
  assert result.test_loss == pytest.approx(float(jnp.mean(bce(test_logits, DATA.test))), rel=1e-5)


def test_noisy_mean_noise_std_and_clipping():
  score = NoisyMean(fn=lambda out, batch: out, low=-1.0, high=3.0, noise_multiplier=1.5, num_examples=50)
  values = jnp.linspace(-0.5, 2.5, 50)  # inside [low, high]; mean 1.0
  draws = 20_000
  keys = jax.random.split(jax.random.key(8), draws)
  scores = np.asarray(jax.jit(jax.vmap(lambda k: score(values, None, k)))(keys), np.float64)
  want_std = 1.5 * (3.0 - (-1.0)) / 2 / 50  # sigma * (high - low) / 2 / n = 0.06
  # 20,000 draws: the std estimate's relative standard error is 1/sqrt(2 * 20000) = 0.5%.
  np.testing.assert_allclose(scores.std(), want_std, rtol=0.03)
  assert abs(scores.mean() - 1.0) < 5 * want_std / math.sqrt(draws)
  # Values are clipped to [low, high] before the sum; the noise does not depend on them,
  # and the sum is divided by the declared 50, not by the 4 rows given.
  raw = jnp.array([-5.0, 0.5, 10.0, 2.0])
  key = jax.random.key(3)
  assert float(score(raw, None, key)) == float(score(jnp.clip(raw, -1.0, 3.0), None, key))
  other = jnp.array([0.0, 0.0, 0.0, 0.0])
  np.testing.assert_allclose(float(score(raw, None, key)) - float(score(other, None, key)),
                             float(jnp.sum(jnp.clip(raw, -1.0, 3.0))) / 50, rtol=1e-5)
  assert score.event == dp_accounting.GaussianDpEvent(1.5)


def test_dp_score_adds_exactly_its_event_and_reads_private_validation():
  seen = []
  event = dp_accounting.LaplaceDpEvent(0.5)

  def size_score(logits, batch, key):
    seen.append(batch["y"].shape)
    return jnp.float32(batch["y"].shape[0]) + 0.0 * jax.random.normal(key) + 0.0 * jnp.sum(logits)
  task = Task(model=LINEAR, loss=bce, optimizer=sgd, score=DpScore(size_score, event), name="dp-score")
  cfg = _config(task, sampling_prob=0.25, noise_multiplier=1.0, steps=20)
  want_event = dp_accounting.ComposedDpEvent([acc.dpsgd_event(0.25, 1.0, 20), event])
  assert cfg.dp_event(N_TRAIN) == want_event
  result = train_candidate(cfg, DATA, jax.random.key(1))
  assert result.score == N_VAL and seen and set(seen) == {(N_VAL,)}
  assert result.epsilon == pytest.approx(rdp.RdpAccountant().compose(want_event).get_epsilon(1e-5),
                                         rel=1e-12)
  assert result.score_source == trainer.PRIVATE_SOURCE


def test_dp_score_without_private_validation_is_refused(no_training):
  cfg = _config(NOISY_TASK)
  with pytest.raises(ValueError, match=r"DP score.*data.private_validation.*None"):
    train_candidate(cfg, Dataset(train=DATA.train, test=DATA.test, num_examples=N_TRAIN),
                    jax.random.key(0))


# -------------------------------------------------------------------- bad input


def _linear3_init(key, x):
  del key
  return {"w": jnp.zeros(x.shape[1:] + (3,), jnp.float32)}


def _per_example_shape(model, loss=bce, **kw):
  return Task(model=model, loss=loss, optimizer=sgd, name="bad", **kw)


@pytest.mark.parametrize("task,data,match", [
    (_per_example_shape(Model(_linear3_init, lambda p, x: x @ p["w"])), DATA,
     r"task 'bad': the loss does not fit the model's outputs \(2, 3\)"),
    (_per_example_shape(LINEAR, loss=lambda out, batch: jnp.mean(bce(out, batch))), DATA,
     r"the loss must return one value per example.*returned \(\)"),
    (_per_example_shape(LINEAR, loss=lambda out, batch: bce(out, batch)[:, None]), DATA,
     r"the loss must return one value per example.*returned \(2, 1\)"),
    (_per_example_shape(LINEAR, score=correct), DATA, r"the score must return a scalar, got \(24,\)"),
    (_per_example_shape(LINEAR, score=NoisyMean(fn=accuracy, low=0.0, high=1.0, noise_multiplier=1.0,
                                                num_examples=N_VAL)),
     DATA, r"the score fails on data.private_validation"),
    (_per_example_shape(LINEAR, inputs="y"), DATA, r"the model .* cannot take inputs of shape \(2,\)"),
    (_per_example_shape(LINEAR, inputs="features"), DATA, r"inputs cannot select the model input"),
    (_per_example_shape(LINEAR),
     Dataset(train={"features": DATA.train["x"], "y": DATA.train["y"]},
             test={"features": DATA.test["x"], "y": DATA.test["y"]}, num_examples=N_TRAIN),
     r"batch\['x'\].*Task\(inputs="),
], ids=["output-vs-loss", "loss-scalar", "loss-2d", "score-not-scalar", "noisy-fn-not-per-example",
        "model-input", "inputs-key", "default-inputs"])
def test_a_task_that_does_not_fit_the_data_is_refused_before_training(task, data, match, no_training):
  with pytest.raises(ValueError, match=match):
    train_candidate(_config(task), data, jax.random.key(0))


def _fails_above_one(hp):
  if hp["learning_rate"] > 1:  # a concrete check: construction sees Python floats
    raise RuntimeError("learning rate above 1 is not supported")
  return optax.sgd(hp["learning_rate"])


def test_optimizer_factory_failing_for_a_value_is_refused_at_construction():
  task = Task(model=LINEAR, loss=bce, optimizer=_fails_above_one, static=("learning_rate",),
              name="picky")
  cfg = _config(task, learning_rate=0.5)
  with pytest.raises(ValueError, match=r"task 'picky': the optimizer factory fails for hyperparameters "
                                       r"\{'learning_rate': 2.0\}: RuntimeError: learning rate above 1"):
    cfg.replace(learning_rate=2.0)  # what a grid point does
  with pytest.raises(ValueError, match=r"optimizer factory rejects.*learning_rate must be in"):
    _config(presets.classifier(2), learning_rate=-1.0)


@pytest.mark.parametrize("task,hparams,match", [
    (LINEAR_TASK, dict(learning_rate=0.1, momentum=0.9),
     r"hyperparameter\(s\) \['momentum'\] are not read by task 'linear-bce'"),
    (MLP_TASK, dict(learning_rate=0.1, weight_decay=0.0),
     r"task 'mlp-bce': the model factory fails .*KeyError.*hyperparameter 'width' is not set"),
    (LINEAR_TASK, dict(learning_rate=0.1, l2_clip_norm=1.0), r"must not name TrainConfig fields \['l2_clip_norm'\]"),
    (LINEAR_TASK, dict(learning_rate=float("nan")), r"hyperparameter 'learning_rate' must be finite"),
    (LINEAR_TASK, dict(learning_rate=1 + 2j), r"hyperparameter 'learning_rate' must be real"),
    (LINEAR_TASK, {1: 0.1}, r"hparams must be a mapping name -> value"),
    (Task(model=lambda hp: "mlp", loss=bce, optimizer=sgd, name="m"), dict(learning_rate=0.1),
     r"model factory of task 'm' must return a flax.linen.Module or a jaxdp.train.Model, got str"),
    (Task(model=LINEAR, loss=bce, optimizer=lambda hp: hp["learning_rate"], name="o"),
     dict(learning_rate=0.1), r"optimizer factory of task 'o' must return an optax.GradientTransformation"),
], ids=["unread", "missing", "config-field", "nan", "complex", "non-str-name", "model-type",
        "optimizer-type"])
def test_bad_hyperparameters_are_refused_at_construction(task, hparams, match):
  with pytest.raises(ValueError, match=match):
    TrainConfig(task=task, l2_clip_norm=1.0, noise_multiplier=1.0, sampling_prob=0.25, steps=5,
                hparams=hparams)


def test_unhashable_static_hyperparameter_is_refused_before_training(no_training):
  task = Task(model=lambda hp: MLP(width=hp["widths"][0]), loss=bce, optimizer=sgd, name="listy")
  cfg = _config(task, widths=[4, 8])
  with pytest.raises(ValueError, match=r"static hyperparameter\(s\) \['widths'\] of task 'listy' must be hashable"):
    train_candidate(cfg, DATA, jax.random.key(0))
  with pytest.raises(ValueError, match="task must be a jaxdp.train.Task"):
    TrainConfig(task=MLP, l2_clip_norm=1.0, noise_multiplier=1.0, sampling_prob=0.25, steps=5)


@pytest.mark.parametrize("kwargs,match", [
    (dict(model=3), "model must be a flax.linen.Module"),
    (dict(loss="bce"), "loss must be a callable"),
    (dict(optimizer=optax.sgd(0.1)), r"optimizer must be a factory hparams -> optax.GradientTransformation"),
    (dict(optimizer=None), "optimizer must be a factory"),
    (dict(score=0.5), "score must be None, a callable"),
    (dict(inputs=1.5), "inputs must be None, a key/index or a function"),
    (dict(has_aux=1), "has_aux must be a bool"),
    (dict(static="learning_rate"), "static must be a tuple of hyperparameter names"),
    (dict(static=(1,)), "static must be a tuple of hyperparameter names"),
    (dict(extrapolate=2.0), "extrapolate must be None or a callable"),
])
def test_task_rejects_bad_fields(kwargs, match):
  fields = dict(model=LINEAR, loss=bce, optimizer=sgd)
  fields.update(kwargs)
  with pytest.raises(ValueError, match=match):
    Task(**fields)


@pytest.mark.parametrize("kwargs,match", [
    (dict(fn=None), "NoisyMean.fn must be a callable"),
    (dict(low="0"), "low must be a real number"),
    (dict(high=float("inf")), "high must be finite"),
    (dict(low=1.0, high=1.0), "NoisyMean needs low < high"),
    (dict(low=2.0), "NoisyMean needs low < high"),
    (dict(noise_multiplier=0.0), r"noise_multiplier must be in \(0.0, inf\)"),
    (dict(noise_multiplier=-1.0), "noise_multiplier must be in"),
    (dict(noise_multiplier=float("nan")), "noise_multiplier must be finite"),
    (dict(num_examples=None), "NoisyMean needs num_examples, the public validation size"),
    (dict(num_examples=0), r"num_examples must be an integer in \[1, inf\), got 0"),
    (dict(num_examples=2.5), "num_examples must be an integer, got 2.5"),
])
def test_noisy_mean_rejects_bad_fields(kwargs, match):
  fields = dict(fn=correct, low=0.0, high=1.0, noise_multiplier=1.0, num_examples=N_VAL)
  fields.update(kwargs)
  with pytest.raises(ValueError, match=match):
    NoisyMean(**fields)


def test_dp_score_rejects_bad_fields():
  with pytest.raises(ValueError, match="DpScore.fn must be a callable"):
    DpScore(fn=1.0, event=dp_accounting.GaussianDpEvent(1.0))
  with pytest.raises(ValueError, match="DpScore.event must be a dp_accounting.DpEvent"):
    DpScore(fn=lambda out, batch, key: 0.0, event=1.0)


def test_hparams_mapping_records_reads_and_names_missing_ones():
  hp = HParams({"a": 1.0, "b": 2})
  assert hp["a"] == 1.0 and hp.read == {"a"} and len(hp) == 2
  assert "b" in hp and hp.read == {"a", "b"}
  with pytest.raises(KeyError, match=r"hyperparameter 'c' is not set; the candidate has \['a', 'b'\]"):
    hp["c"]  # pylint: disable=pointless-statement


def test_hparams_iteration_reads_nothing_and_says_so():
  hp = HParams({"a": 1.0, "b": 2})
  assert sorted(hp) == ["a", "b"] and hp.read == set() and hp.enumerated


def test_a_factory_that_copies_its_hparams_cannot_hide_an_unused_one():
  # dict(hp) reads every name through the mapping, so jaxdp cannot tell that
  # `unused` changes nothing: it says so (before, the check passed silently).
  copying = Task(model=LINEAR, loss=bce, name="copying",
                 optimizer=lambda hp: optax.sgd(dict(hp)["learning_rate"]))
  with pytest.warns(UncheckedHparamsWarning, match=r"cannot check that each of \['learning_rate', 'unused'\]"):
    _config(copying, hparams=dict(learning_rate=0.5, unused=1.0))
  # Read by name, the same unused name is refused.
  by_name = Task(model=LINEAR, loss=bce, optimizer=lambda hp: optax.sgd(hp["learning_rate"]), name="named")
  with pytest.raises(ValueError, match=r"hyperparameter\(s\) \['unused'\] are not read"):
    _config(by_name, hparams=dict(learning_rate=0.5, unused=1.0))


def test_preset_is_an_ordinary_task():
  task = presets.classifier(10)
  assert isinstance(task, Task) and task.static == ("momentum",) and task.extrapolate is not None
  hp = dict(model="mlp", activation="relu", optimizer="adam", learning_rate=0.01, weight_decay=0.1)
  assert task.split_hparams(hp) == (dict(model="mlp", activation="relu", optimizer="adam"),
                                    dict(learning_rate=0.01, weight_decay=0.1))
  assert task.model_reads(hp) == {"model", "activation"}
  own = MLP(width=4)
  assert task.model_for(dict(model=own)).apply == own.apply  # any Flax module as `model`
