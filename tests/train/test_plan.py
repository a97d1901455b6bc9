"""DpSgdPlan: what is accounted is what runs (clip sensitivity, noise std, q, T, N)."""

import dataclasses

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxdp import accounting as acc
from jaxdp.data import Dataset
from jaxdp.train import LoopSpec, Model, Task, TrainConfig, program


def _init(key, x):
  del key
  return {"w": jnp.zeros(x.shape[1:], jnp.float32), "b": jnp.zeros((), jnp.float32)}


def _apply(params, x):
  return x @ params["w"] + params["b"]


def _squared(out, batch):
  return 0.5 * (out - batch["y"]) ** 2


LINEAR = Model(_init, _apply)
TASK = Task(model=LINEAR, loss=_squared, optimizer=lambda hp: optax.sgd(hp["learning_rate"]),
            name="linear-squared")


def _config(**kw):
  fields = dict(task=TASK, l2_clip_norm=1.0, noise_multiplier=1.3, sampling_prob=0.05, steps=200,
                hparams=dict(learning_rate=1.0))
  fields.update(kw)
  return TrainConfig(**fields)


# -------------------------------------------------------------------- accounting


def test_dp_event_is_dpsgd_event_of_the_plan():
  cfg = _config()
  want = acc.dpsgd_event(0.05, 1.3, 200)
  assert cfg.dp_event() == cfg.dp_event(1000) == want
  plan = cfg.plan(1000)
  assert (plan.l2_clip_norm, plan.noise_multiplier, plan.sampling_prob, plan.num_steps,
          plan.num_examples) == (1.0, 1.3, 0.05, 200, 1000)
  assert plan.dp_event() == want and plan.expected_batch_size == pytest.approx(50.0)
  by_epochs = _config(steps=None, epochs=3.0)
  assert by_epochs.dp_event() == acc.dpsgd_event(0.05, 1.3, 60) == by_epochs.plan(7).dp_event()


def test_batch_size_means_q_is_b_over_n():
  cfg = _config(sampling_prob=None, batch_size=25.0)
  assert cfg.dp_event(1000) == acc.dpsgd_event(25 / 1000, 1.3, 200)
  assert cfg.dp_event(500) == acc.dpsgd_event(25 / 500, 1.3, 200)
  assert cfg.epsilon(1000) == pytest.approx(_config(sampling_prob=0.025).epsilon(), rel=1e-12)
  plan = cfg.plan(1000)
  assert plan.sampling_prob == 0.025 and plan.expected_batch_size == pytest.approx(25.0)
  # Epochs with batch_size: T = ceil(epochs / (b / N)) needs N too.
  by_epochs = _config(sampling_prob=None, batch_size=25.0, steps=None, epochs=2.0)
  assert by_epochs.num_steps_for(1000) == 80 and by_epochs.dp_event(1000).count == 80
  with pytest.raises(ValueError, match="batch_size=25.0 sets q = batch_size / N: pass num_examples"):
    cfg.dp_event()
  with pytest.raises(ValueError, match=r"batch_size must be in \(0, N\] with N=10"):
    cfg.dp_event(10)
  # replace() swaps one for the other.
  assert cfg.replace(sampling_prob=0.1).batch_size is None
  assert _config().replace(batch_size=5.0).sampling_prob is None


def test_plan_is_a_pytree_of_c_and_sigma_with_static_q_t_n():
  plan = _config().plan(1000)
  leaves, treedef = jax.tree.flatten(plan)
  assert leaves == [1.0, 1.3]
  other = _config(sampling_prob=0.1).plan(1000)
  assert jax.tree.structure(other) != treedef  # q is static: another program
  assert jax.tree.structure(_config(l2_clip_norm=3.0, noise_multiplier=0.5).plan(1000)) == treedef


# ----------------------------------------------------------------- sensitivity


def test_clipped_grad_sensitivity_is_c_add_or_remove_one():
  clip = 0.7
  plan = _config(l2_clip_norm=clip).plan(8)
  loss = TASK.per_example_loss(LINEAR)
  clipped = plan.clipped_grad(loss)
  assert clipped.sensitivity == clip
  rng = np.random.default_rng(1)
  x = rng.normal(size=(8, 6)).astype(np.float32) * 10.0
  params = {"w": jnp.asarray(rng.normal(size=6), jnp.float32), "b": jnp.float32(0.5)}
  y = rng.normal(size=8).astype(np.float32)
  y[3] = float(_apply(params, x[3])) + 1e-3  # one example with a gradient far below C
  batch = {"x": x, "y": y}
  fn = jax.jit(clipped.fn)
  full = fn(params, batch, jnp.ones(8, bool))
  grads = jax.vmap(jax.grad(lambda p, xi, yi: loss(p, {"x": xi[None], "y": yi[None]})[0]),
                   in_axes=(None, 0, 0))(params, batch["x"], batch["y"])
  raw_norms = np.sqrt(np.asarray(grads["w"] ** 2).sum(1) + np.asarray(grads["b"]) ** 2)
  for i in range(8):
    without = fn(params, batch, jnp.arange(8) != i)
    diff = np.sqrt(sum(float(jnp.sum((a - b) ** 2)) for a, b in
                       zip(jax.tree.leaves(full), jax.tree.leaves(without))))
    if i == 3:
      assert raw_norms[i] < clip / 10
      np.testing.assert_allclose(diff, raw_norms[i], rtol=1e-4)  # untouched
    else:
      assert raw_norms[i] > clip
      np.testing.assert_allclose(diff, clip, rtol=1e-5)  # exactly C: the sensitivity


# ------------------------------------------------------------ noise, and vmap


D, N = 10_000, 16


def _noise_setup():
  rng = np.random.default_rng(0)
  data = Dataset(train={"x": rng.normal(size=(N, D)).astype(np.float32),
                        "y": rng.normal(size=N).astype(np.float32)}, num_examples=N)
  cfg = _config(sampling_prob=0.5, steps=1, l2_clip_norm=0.5, noise_multiplier=1e4)
  spec = LoopSpec.from_config(cfg, data)
  params = program.init_params(spec, jax.random.key(0), data.train)
  return data, cfg, spec, params


def test_noise_std_is_sigma_c_and_vmapped_plans_equal_separate_runs():
  data, cfg, spec, params = _noise_setup()
  plan = cfg.plan(N)
  assert plan.expected_batch_size == 8.0
  clips, sigmas = np.array([0.5, 2.0]), np.array([1e4, 3e4])
  plans = dataclasses.replace(plan, l2_clip_norm=jnp.asarray(clips, jnp.float32),
                              noise_multiplier=jnp.asarray(sigmas, jnp.float32))
  traced = {"learning_rate": jnp.ones(2, jnp.float32)}
  keys = jax.random.split(jax.random.key(7), 2)
  loop = program.build_train_loop(spec)
  batched = jax.jit(jax.vmap(loop, in_axes=(None, 0, 0, 0, None)))(params, plans, traced, keys,
                                                                   data.train)
  single = jax.jit(loop)
  for i in range(2):
    one = single(params, jax.tree.map(lambda v: v[i], plans), {"learning_rate": jnp.float32(1.0)},
                 keys[i], data.train)
    assert int(one.steps) == 1 and bool(one.finite)
    for a, b in zip(jax.tree.leaves(batched.params), jax.tree.leaves(one.params)):
      np.testing.assert_allclose(a[i], b, rtol=1e-5, atol=1e-3)
    # One SGD step (lr 1) from zeros: w = -(clipped sum + noise) / (q N). The
    # clipped sum has norm <= 8 C in expectation over 10,000 coordinates,
    # negligible next to a noise std of sigma C >= 5,000 per coordinate.
    w = np.asarray(batched.params["w"][i], np.float64) * -plan.expected_batch_size
    ratio = w.std() / clips[i] / sigmas[i]
    # 10,000 coordinates: the std estimate's relative standard error is
    # 1/sqrt(2 * 10,000) = 0.7%, so 4% is more than 5 standard errors.
    assert abs(ratio - 1.0) < 0.04, ratio
    assert abs(w.mean()) < 5 * clips[i] * sigmas[i] / np.sqrt(D)


def test_plan_static_fields_must_match_the_spec():
  # The loop takes q, T and N from the plan it is given; the trainer builds
  # that plan from the same config as the spec, so they agree.
  data, cfg, spec, _ = _noise_setup()
  plan = cfg.plan(data.num_examples)
  assert (plan.sampling_prob, plan.num_steps, plan.num_examples) == (
      spec.sampling_prob, spec.num_steps, spec.num_examples)
  assert cfg.dp_event(data.num_examples) == plan.dp_event() == dp_accounting.SelfComposedDpEvent(
      dp_accounting.PoissonSampledDpEvent(0.5, dp_accounting.GaussianDpEvent(1e4)), 1)
