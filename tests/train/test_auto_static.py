"""Any optax factory works (issue 24, item 4): a float the optimizer needs concrete becomes static."""

import jax
import jax.numpy as jnp
import optax
import pytest

from jaxdp import accounting as acc
from jaxdp.train import LoopSpec, Task, TrainConfig, train_candidate
from jaxdp.tuning import dry_run, LocalTrainer, random_search, RunConfig
from jaxdp.sweep import SearchSpace, TaskPlan


def _loss(logits, batch):
  return optax.softmax_cross_entropy_with_integer_labels(logits, batch.labels)


def _task(optimizer, name):
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  return Task(model=nn.Dense(10), inputs=lambda b: b.inputs.reshape(b.inputs.shape[0], -1), loss=_loss,
              optimizer=optimizer, name=name)


OPTIMIZERS = {
    # optax checks the schedule's values in Python: they must be concrete.
    "warmup_cosine": (lambda hp: optax.sgd(optax.warmup_cosine_decay_schedule(0.0, hp["lr"], 5, 60)),
                      {"lr": 0.5}, {"lr"}),
    "exponential_decay": (lambda hp: optax.sgd(optax.exponential_decay(hp["lr"], 10, hp["decay"])),
                          {"lr": 0.5, "decay": 0.9}, {"decay"}),
    # inject_hyperparams takes arrays: nothing needs to be static.
    "inject_hyperparams": (lambda hp: optax.inject_hyperparams(optax.adam)(learning_rate=hp["lr"]),
                           {"lr": 0.05}, set()),
}


# warmup_cosine (4 s) in the slow set (the suite's 5-minute budget): exponential_decay is the same path.
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "warmup_cosine" else n
                                  for n in sorted(OPTIMIZERS)])
def test_a_float_the_optimizer_needs_concrete_becomes_static(name, digits):
  factory, hparams, concrete = OPTIMIZERS[name]
  config = TrainConfig(task=_task(factory, name), l2_clip_norm=1.0, noise_multiplier=1.0,
                       sampling_prob=0.05, steps=6, hparams=hparams)
  spec = LoopSpec.from_config(config, digits)
  assert {n for n, _ in spec.auto_static} == concrete
  assert set(spec.traced_names) == set(hparams) - concrete
  for _, why in spec.auto_static:
    # Plain words: where the value was needed and what needed it, not an exception's text.
    assert why.startswith("the optimizer factory needs a concrete value: optax.") and "Error" not in why
  result = train_candidate(config, digits, jax.random.key(0))  # trains where it used to raise
  assert result.steps == 6 and jnp.isfinite(result.test_loss)


@pytest.mark.slow  # a search compiling one program per value: about 5 s
def test_the_search_and_its_dry_run_say_what_became_static_and_compile_once_per_value(
    digits, two_devices):
  factory, hparams, _ = OPTIMIZERS["warmup_cosine"]
  config = TrainConfig(task=_task(factory, "warmup_cosine-search"), l2_clip_norm=1.0,
                       noise_multiplier=1.0, sampling_prob=0.05, steps=6, hparams=hparams)
  grid = {"lr": [0.2, 0.5]}
  groups = TaskPlan.build(SearchSpace(config, grid), digits).summary()["groups"]
  assert len(groups) == 2  # one compilation per value
  plan = dry_run(config, grid, digits, distribution=acc.Poisson(mean=3))
  assert set(plan.auto_static) == {"lr"}
  assert "static automatically: 'lr' (the optimizer factory needs a concrete value" in str(plan)
  result = random_search(config, grid, digits, distribution=acc.Fixed(2), key=jax.random.key(0),
                         run_config=RunConfig(trainer=LocalTrainer(devices=two_devices)))
  assert set(result.unreleased.auto_static) == {"lr"} and result.hyperparameters["lr"] in grid["lr"]


def test_a_declared_static_name_and_other_failures_are_left_alone(digits):
  factory, hparams, _ = OPTIMIZERS["warmup_cosine"]
  declared = Task(model=_task(factory, "x").model, inputs=_task(factory, "x").inputs, loss=_loss,
                  optimizer=factory, static=("lr",), name="declared")
  config = TrainConfig(task=declared, l2_clip_norm=1.0, noise_multiplier=1.0, sampling_prob=0.05,
                       steps=6, hparams=hparams)
  spec = LoopSpec.from_config(config, digits)
  assert spec.auto_static == () and spec.static_hparams == (("lr", 0.5),)
  # A factory that fails for another reason is not made static: the task check names the error.
  def only_floats(hp):  # builds for a Python float, fails (not for want of a value) when traced
    return optax.sgd(hp["lr"]) if isinstance(hp["lr"], float) else 1 / 0
  broken = TrainConfig(task=_task(only_floats, "broken"), l2_clip_norm=1.0,
                       noise_multiplier=1.0, sampling_prob=0.05, steps=6, hparams=hparams)
  assert LoopSpec.from_config(broken, digits).auto_static == ()
  with pytest.raises(ValueError, match=r"task 'broken': one DP step fails .*ZeroDivisionError"):
    train_candidate(broken, digits, jax.random.key(0))
