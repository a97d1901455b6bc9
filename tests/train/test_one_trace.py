"""A plan traces each program's loss once per analysis (issue 44): the clipping analysis, the
memory estimate and the checks share one `ProgramTraces`, and the DP loop analyses its layers
once per trace, not once per call of its clipped gradient.

Counted on a small transformer (Embed, Dense and DenseGeneral layers: ghost norms and
per-example gradients both) and on a linear model whose loss cannot be differentiated.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxdp.data import DataSplit, Dataset
from jaxdp.models import TransformerClassifier
from jaxdp.train import DpSgdPlan, LoopSpec, Model, Task, TrainConfig, checks, ghost, loop_spec, program
from jaxdp.train.run_plan import plan_runs

VOCAB, LENGTH, N = 64, 8, 64


def _data():
  rng = np.random.default_rng(0)
  tokens = rng.integers(1, VOCAB, size=(N, LENGTH)).astype(np.int32)
  labels = (rng.random(N) < 0.5).astype(np.int32)
  return Dataset(name="tokens", train=DataSplit(tokens, labels), test=DataSplit(tokens[:16], labels[:16]),
                 num_examples=N, num_classes=2)


DATA = _data()


def _counted_task(calls: list, **fields) -> Task:
  def cross_entropy(out, batch):
    calls.append(1)  # once per trace: the loss only ever runs traced here
    return optax.softmax_cross_entropy_with_integer_labels(out, batch[1])
  model = TransformerClassifier(vocab_size=VOCAB, max_length=LENGTH, width=16, depth=1, num_heads=2)
  return Task(model=model, loss=cross_entropy, optimizer=lambda hp: optax.adam(hp["learning_rate"]),
              name="tiny-transformer", **fields)


def _config(task: Task, learning_rate: float = 1e-3) -> TrainConfig:
  return TrainConfig(task=task, l2_clip_norm=1.0, noise_multiplier=1.0, sampling_prob=8 / N, steps=3,
                     hparams=dict(learning_rate=learning_rate))


@pytest.mark.parametrize("clipping", ["auto", "ghost", "vmap"])
def test_a_plan_never_traces_the_dp_loop_and_traces_the_loss_once_per_program(monkeypatch, clipping):
  def no_loop(*args, **kwargs):
    raise AssertionError("check_program traced the whole DP loop of a task that fits its data")
  monkeypatch.setattr(checks, "build_train_loop", no_loop)
  calls: list = []
  task = _counted_task(calls, clipping=clipping)
  runs = plan_runs([_config(task)], DATA)
  one = len(calls)
  # The clipping analysis (two forward traces), the working set that `auto` weighs (one
  # gradient), the memory estimate (one gradient), and the checks' loss and score.
  assert one <= {"auto": 7, "ghost": 6, "vmap": 4}[clipping], one
  del calls[:]
  # Two learning rates (traced): one program, whose traces the second configuration reuses.
  plan_runs([_config(task, 1e-3), _config(task, 3e-3)], DATA)
  assert len(calls) == one
  del calls[:]
  assert runs[0].clipping and not calls  # the dry run's clipping paths: from the plan's traces


@pytest.mark.parametrize("clipping", ["auto", "ghost", "vmap"])
def test_the_traces_agree_with_tracing_each_thing_alone(clipping):
  task = _counted_task([], clipping=clipping)
  (run,) = plan_runs([_config(task)], DATA)
  assert run.traces is not None
  assert run.params == program.param_shapes(run.spec, DATA.train)
  fresh = loop_spec.LoopSpec.from_config(_config(task), DATA)  # its own traces: nothing shared
  assert fresh == run.spec and fresh.microbatch_size == run.spec.microbatch_size
  assert run.clipping == loop_spec.clipping_paths(run.spec, DATA.train)
  assert run.traces.per_example_bytes == loop_spec.per_example_bytes(run.spec, DATA.train)
  paths = {kind for _, kind, _ in run.clipping}
  # `auto` keeps no ghost norm on a model this small (none would save 10% of an example's bytes).
  assert paths == ({"ghost", "per-example"} if clipping == "ghost" else {"per-example"})


def test_the_dp_loop_analyses_its_layers_once_per_trace(monkeypatch):
  analysed = []
  real = ghost.analyse
  monkeypatch.setattr(ghost, "analyse", lambda *a, **k: analysed.append(1) or real(*a, **k))
  task = _counted_task([], clipping="ghost")
  (run,) = plan_runs([_config(task)], DATA)
  scalar = jax.ShapeDtypeStruct((), jnp.float32)
  plan = DpSgdPlan(l2_clip_norm=scalar, noise_multiplier=scalar, sampling_prob=run.spec.sampling_prob,
                   num_steps=run.spec.num_steps, num_examples=N)
  jax.eval_shape(program.build_train_loop(run.spec), run.params, plan, {"learning_rate": scalar},
                 jax.random.key(0), loop_spec.abstract(DATA.train))
  # The loop calls its clipped gradient twice (for the sum's shapes, then in its loop).
  assert len(analysed) == 1


class _Mlp(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(2)(jax.nn.relu(nn.Dense(8)(x)))


def test_ghost_sum_for_is_ghost_clipped_grad_sum_analysed_once_per_shape(monkeypatch):
  analysed = []
  real = ghost.analyse
  monkeypatch.setattr(ghost, "analyse", lambda *a, **k: analysed.append(1) or real(*a, **k))
  model = _Mlp()
  rng = np.random.default_rng(1)
  x, y = jnp.asarray(rng.normal(size=(6, 5)), jnp.float32), jnp.asarray(rng.integers(0, 2, 6), jnp.int32)
  params = model.init(jax.random.key(0), x[:1])

  def loss(p, batch):
    return optax.softmax_cross_entropy_with_integer_labels(model.apply(p, batch[0]), batch[1])

  summed = jax.jit(ghost.ghost_sum_for(loss))
  direct = jax.jit(functools.partial(ghost.ghost_clipped_grad_sum, loss))
  clip = jnp.float32(0.5)
  for rows in (4, 6):  # two traces of each; the number of rows is not part of the analysis
    mask = jnp.arange(rows) < rows - 1
    batch = (x[:rows], y[:rows])
    got, want = summed(params, batch, mask, clip), direct(params, batch, mask, clip)
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), got, want))
  assert len(analysed) == 1 + 2  # summed: once; ghost_clipped_grad_sum: once per trace
  narrower = jax.tree.map(lambda leaf: leaf.astype(jnp.float16), params)  # other dtypes: analysed again
  jax.eval_shape(summed, narrower, (x[:4], y[:4]), jnp.ones(4, bool), clip)
  assert len(analysed) == 4
  with pytest.raises(ValueError, match="l2_clip_norm"):
    ghost.ghost_sum_for(loss)(params, (x[:4], y[:4]), jnp.ones(4, bool), jnp.float32(-1.0))


def _linear(key, x):
  del key
  return {"w": jnp.zeros(x.shape[1:], jnp.float32)}


def _looped_loss(out, batch):
  # Forward only: reverse-mode differentiation of a while_loop fails, so one DP step does.
  def body(carry):
    i, acc = carry
    return i + 1, acc + out
  return jax.lax.while_loop(lambda c: c[0] < 3, body, (0, jnp.zeros_like(out)))[1] - batch["y"]


def test_a_gradient_that_fails_is_named_by_the_dp_step_it_breaks():
  task = Task(model=Model(_linear, lambda p, x: x @ p["w"]), loss=_looped_loss,
              optimizer=lambda hp: optax.sgd(hp["learning_rate"]), inputs="x", name="looped")
  rng = np.random.default_rng(0)
  split = lambda n: {"x": rng.normal(size=(n, 3)).astype(np.float32), "y": np.zeros(n, np.float32)}
  data = Dataset(name="linear", train=split(32), test=split(8), num_examples=32)
  config = TrainConfig(task=task, l2_clip_norm=1.0, noise_multiplier=1.0, sampling_prob=0.25, steps=2,
                       hparams={"learning_rate": 0.1})
  spec = LoopSpec.from_config(config, data)
  assert loop_spec.program_traces(task, spec.static_hparams, data.train).per_example_bytes is None
  with pytest.raises(ValueError, match=r"task 'looped': one DP step fails .*while_loop") as info:
    plan_runs([config], data)
  assert isinstance(info.value.__cause__, Exception)
