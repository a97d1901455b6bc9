"""Hyperparameters read where optax reads them (issue 32, item 4).

A learning rate read inside a schedule closure, at update time, counts as
read and stays traced (one compiled group for many rates); a float optax
needs concrete is made static with a reason in plain words;
`jaxdp.train.schedules` keeps a schedule's peak traced; the optimizer factory
gets the run's number of steps as `hp.num_steps`; a name read nowhere is
still refused.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxdp.data import Dataset
from jaxdp.train import (HParams, LoopSpec, Model, Task, TrainConfig, UncheckedHparamsWarning,
                         program, schedules, train_candidate)
from jaxdp.train import loop_spec

D, N_TRAIN, STEPS = 5, 64, 12
RATES = [0.05, 0.1, 0.2, 0.4]


def _split(rng, w, n):
  x = rng.normal(size=(n, D)).astype(np.float32)
  return {"x": x, "y": (x @ w > 0).astype(np.float32)}


def _make_data():
  rng = np.random.default_rng(1)
  w = rng.normal(size=D)
  return Dataset(name="halfspace", train=_split(rng, w, N_TRAIN), test=_split(rng, w, 16),
                 num_examples=N_TRAIN)


DATA = _make_data()


def _init(key, x):
  return {"w": 0.1 * jax.random.normal(key, x.shape[1:]), "b": jnp.zeros((), jnp.float32)}


LINEAR = Model(init=_init, apply=lambda params, x: x @ params["w"] + params["b"])


def bce(logits, batch):
  return optax.sigmoid_binary_cross_entropy(logits, batch["y"])


UNIT = optax.cosine_decay_schedule(1.0, STEPS, alpha=0.1)


def _closure(hp):
  # The rate is read when update runs, not when the factory does.
  return optax.scale_by_schedule(lambda t: -hp["learning_rate"] * UNIT(t))


def _constant(hp):
  del hp
  return optax.scale_by_schedule(lambda t: -0.2 * UNIT(t))


def _optax_peak(hp):  # optax compares the peak with 0.0 in Python: it must be concrete
  return optax.sgd(optax.warmup_cosine_decay_schedule(0.0, hp["learning_rate"], 3, hp.num_steps))


def _traced_peak(hp):
  return optax.sgd(schedules.warmup_cosine(hp["learning_rate"], 3, hp.num_steps))


# Tasks are compared by identity: module-level objects share compiled programs.
CLOSURE = Task(model=LINEAR, loss=bce, optimizer=_closure, name="closure")
CONSTANT = Task(model=LINEAR, loss=bce, optimizer=_constant, name="constant")
OPTAX_PEAK = Task(model=LINEAR, loss=bce, optimizer=_optax_peak, name="optax-peak")
TRACED_PEAK = Task(model=LINEAR, loss=bce, optimizer=_traced_peak, name="traced-peak")


def _config(task, hparams=None, **fields):
  fields = {**dict(l2_clip_norm=1.0, noise_multiplier=0.5, sampling_prob=0.25, steps=STEPS), **fields}
  return TrainConfig(task=task, hparams=dict(learning_rate=0.2) if hparams is None else hparams,
                     **fields)


def _specs(task):
  """The distinct LoopSpecs (compiled programs) of a grid over RATES, as a tuning run groups them."""
  return set(LoopSpec.from_config(_config(task).replace(learning_rate=rate), DATA) for rate in RATES)


def _same_params(a, b, tol):
  for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=tol, atol=tol)


# ------------------------------------------------- (a) a rate read inside a schedule closure


@pytest.mark.slow  # two runs compiled and trained: about 4 s
def test_a_rate_read_in_a_schedule_closure_is_accepted_traced_and_trains_as_a_constant():
  config = _config(CLOSURE)  # used to be refused: "not read by task"
  spec = LoopSpec.from_config(config, DATA)
  assert spec.traced_names == ("learning_rate",) and spec.auto_static == ()
  assert _specs(CLOSURE) == {spec}  # 4 rates, 1 compilation
  key = jax.random.key(3)
  traced = train_candidate(config, DATA, key)
  constant = train_candidate(_config(CONSTANT, hparams={}), DATA, key)
  assert traced.steps == constant.steps == STEPS and not traced.diverged
  _same_params(traced, constant, 1e-6)
  assert traced.test_loss == pytest.approx(constant.test_loss, rel=1e-6)


# --------------------------------- (b) a peak optax needs concrete: static, said in plain words


def test_a_peak_optax_needs_concrete_is_static_with_a_reason_in_plain_words():
  spec = LoopSpec.from_config(_config(OPTAX_PEAK), DATA)
  assert spec.traced_names == () and spec.static_hparams == (("learning_rate", 0.2),)
  [(name, why)] = spec.auto_static
  assert name == "learning_rate"
  assert why.startswith("the optimizer factory needs a concrete value: "
                        "optax.warmup_cosine_decay_schedule uses it in Python control flow")
  assert "jaxdp.train.schedules" in why  # the way to keep it traced
  assert "Error" not in why and "Tracer" not in why
  assert len(_specs(OPTAX_PEAK)) == len(RATES)  # one compilation per value
  # (tests/train/test_auto_static.py trains such a task.)


def test_a_value_needed_concrete_at_update_time_names_the_update():
  def needs_int(hp):
    def update(updates, state, params=None):
      del params
      repeats = int(hp["learning_rate"] * 10)  # Python int of the value: concrete
      return jax.tree.map(lambda g: -g * repeats, updates), state
    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)
  task = Task(model=LINEAR, loss=bce, optimizer=needs_int, name="needs-int")
  [(name, why)] = LoopSpec.from_config(_config(task), DATA).auto_static
  assert name == "learning_rate"
  assert why.startswith("the optimizer's update needs a concrete value: the code at line ")
  assert why.endswith("of test_hparams_reads.py needs it as a Python number")


# ----------------------------------------------------------- (c) schedules with a traced peak


def test_a_traced_peak_schedule_compiles_once_for_four_rates():
  spec = LoopSpec.from_config(_config(TRACED_PEAK), DATA)
  assert spec.traced_names == ("learning_rate",) and spec.auto_static == ()
  assert _specs(TRACED_PEAK) == {spec}  # 4 rates, 1 compilation
  # Its values are optax's (below), for a peak traced as in the loop.


CASES = {
    "warmup_cosine": (lambda p: schedules.warmup_cosine(p, 5, 40, init_fraction=0.1, end_fraction=0.05,
                                                        exponent=2.0),
                      lambda p: optax.warmup_cosine_decay_schedule(0.1 * p, p, 5, 40, 0.05 * p, 2.0)),
    "cosine_decay": (lambda p: schedules.cosine_decay(p, 40, end_fraction=0.2),
                     lambda p: optax.cosine_decay_schedule(p, 40, 0.2)),
    "linear": (lambda p: schedules.linear(p, 30, init_fraction=0.5, end_fraction=1.0, transition_begin=4),
               lambda p: optax.linear_schedule(0.5 * p, p, 30, 4)),
    "exponential_decay": (lambda p: schedules.exponential_decay(p, 7, 0.8, staircase=True),
                          lambda p: optax.exponential_decay(p, 7, 0.8, staircase=True)),
    "scaled": (lambda p: schedules.scaled(p, optax.piecewise_constant_schedule(1.0, {10: 0.5, 20: 0.1})),
               lambda p: optax.piecewise_constant_schedule(p, {10: 0.5, 20: 0.1})),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_traced_peak_schedules_equal_optax_schedules(name):
  ours, theirs = CASES[name]
  counts = jnp.array([0, 1, 3, 5, 6, 10, 20, 27, 39, 40, 55])
  for peak in (0.3, 2.5e-3):
    got = jax.jit(lambda p: jax.vmap(ours(p))(counts))(jnp.float32(peak))  # the peak traced
    want = jax.vmap(theirs(peak))(counts)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-9)


def test_schedules_scaled_refuses_a_non_schedule():
  with pytest.raises(ValueError, match="unit_schedule must be a schedule"):
    schedules.scaled(0.1, 1.0)


# -------------------------------------------------------- (d) the run's number of steps


def test_the_optimizer_factory_gets_the_runs_number_of_steps():
  seen = []

  def factory(hp):
    seen.append((hp.num_steps, isinstance(hp["learning_rate"], jax.core.Tracer)))
    return optax.sgd(schedules.cosine_decay(hp["learning_rate"], hp.num_steps))
  task = Task(model=LINEAR, loss=bce, optimizer=factory, name="num-steps")
  # Given by batch size and epochs: T = ceil(epochs / (b / N)) needs the data's N.
  config = _config(task, sampling_prob=None, steps=None, batch_size=10.0, epochs=2.0)
  expected = config.num_steps_for(N_TRAIN)
  assert expected == 13
  spec = LoopSpec.from_config(config, DATA)
  assert spec.num_steps == expected and spec.hparams({}).num_steps == expected
  seen.clear()
  loop = program.build_train_loop(spec)  # traced as train_candidate compiles it, shapes only
  params = program.param_shapes(spec, DATA.train)
  jax.eval_shape(loop, params, config.plan(N_TRAIN), loop_spec.traced_hparams(spec, config),
                 jax.random.key(0), DATA.train)
  # Two calls inside the loop, each with T and the rate traced: the optimizer built for its init
  # (`begin`) and for its steps (`advance`, which a checkpointed run calls once per segment).
  assert seen == [(expected, True)] * 2
  # A config that knows T gets it at construction too.
  seen.clear()
  _config(task, steps=7)
  assert seen == [(7, False)]


def test_num_steps_is_not_a_hyperparameter():
  hp = HParams({"learning_rate": 0.1}, num_steps=5)
  assert hp.num_steps == 5 and hp.read == set() and "num_steps" not in list(hp)
  task = Task(model=LINEAR, loss=bce, name="steps-only",
              optimizer=lambda hp: optax.sgd(schedules.linear(0.1, hp.num_steps)))
  _config(task, hparams={})  # reads no hyperparameter: fine
  with pytest.raises(ValueError, match=r"\['num_steps'\] are not read by task 'steps-only'"):
    _config(task, hparams={"num_steps": 10})  # a grid cannot vary it: set steps or epochs
  with pytest.raises(ValueError, match=r"the model factory rejects .*hp.num_steps .* optimizer factory "
                                       r"only"):
    _config(Task(model=lambda hp: LINEAR if hp.num_steps else None, loss=bce,
                 optimizer=lambda hp: optax.sgd(hp["learning_rate"]), name="model-steps"))


# ----------------------------------------------------- (e) a name read nowhere is refused


def test_a_hyperparameter_read_nowhere_is_refused_in_plain_words():
  with pytest.raises(ValueError) as err:
    _config(CLOSURE, hparams=dict(learning_rate=0.1, momentum=0.9))
  message = str(err.value)
  assert message.startswith("hyperparameter(s) ['momentum'] are not read by task 'closure': neither "
                            "its model factory, its optimizer factory nor the optimizer's init and "
                            "update (schedules included) read them (they read ['learning_rate'])")
  assert "Remove them or use them in the task" in message


def test_an_optimizer_that_does_not_fit_stand_in_parameters_is_checked_with_a_warning():
  # Labels shaped like the model's parameters: init/update cannot run before the model is known.
  model = Model(init=lambda key, x: {"kernel": jnp.zeros(x.shape[1:]), "bias": jnp.zeros(())},
                apply=lambda params, x: x @ params["kernel"] + params["bias"])

  def labelled(hp):
    rate = optax.scale_by_schedule(lambda t: -hp["learning_rate"] * UNIT(t))
    return optax.multi_transform({"rate": rate, "zero": optax.set_to_zero()},
                                 {"kernel": "rate", "bias": "zero"})
  task = Task(model=model, loss=bce, optimizer=labelled, name="labelled")
  with pytest.warns(UncheckedHparamsWarning, match=r"no factory reads hyperparameter\(s\) "
                                                   r"\['learning_rate'\].*lr = hp\['learning_rate'\]"):
    config = _config(task)
  spec = LoopSpec.from_config(config, DATA)
  assert spec.traced_names == ("learning_rate",)


def test_a_rate_read_in_the_factory_needs_no_trace(monkeypatch):
  from jaxdp.train import config as config_lib  # pylint: disable=g-import-not-at-top

  def refuse(opt, params=None):
    raise AssertionError("traced init/update although the factory read every name")
  monkeypatch.setattr(config_lib, "trace_optimizer", refuse)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    _config(Task(model=LINEAR, loss=bce, optimizer=lambda hp: optax.sgd(hp["learning_rate"]),
                 name="plain"))
