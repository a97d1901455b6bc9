"""Data parallelism (issue 22, item 4): one candidate's batch shared over devices.

The mechanism must be the one of a single device: the same Poisson sample,
every sampled example clipped and summed exactly once, the clipped shares
added before the noise, one noise draw per step. Only the order of float
additions may differ, so sums and trained parameters are compared with
tolerances derived from float32 summation, stated next to each.

The suite runs with two host devices (tests/conftest.py); the four-device
checks run in one subprocess with `--xla_force_host_platform_device_count=4`,
in the slow set (`make test-slow`, which CI runs).
"""

import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

import jaxdp
from jaxdp.sweep import Candidate, engine
from jaxdp.train import ExecutionConfig, LoopSpec, sampling
from jaxdp.train import plan as plan_module
from jaxdp.train import train_candidate

# float32 unit roundoff.
U32 = 2.0**-24
# Trained parameters, D devices vs one, after 30 DP-SGD steps of the digits
# logistic regression: each step's clipped sum differs by a few ulps (the
# order of its additions), and the difference is carried through 30 SGD
# steps. The suite's batched-vs-lone tolerance; measured 6e-8 abs on |w| <= 0.6.
PARAMS_RTOL, PARAMS_ATOL = 2e-5, 2e-6


def _summation_bound(count: int, shards: int, l2_clip_norm: float) -> float:
  """How far two orders of one float32 sum of clipped gradients may differ, per coordinate.

  Recursive summation of n terms errs by at most (n - 1) u sum|x_i| (Higham,
  Accuracy and Stability of Numerical Algorithms, 2nd ed., eq. 4.4). The sum
  has `count` per-example terms of norm <= C (so sum|x_i| <= count * C per
  coordinate) plus the `shards` partial sums the psum adds; two orders differ
  by at most twice the bound.
  """
  n = count + shards
  return 2 * (n - 1) * U32 * count * l2_clip_norm


@pytest.mark.parametrize("requested,candidates,devices,want", [
    (None, 1, 4, 4),   # one candidate: every device on its batch
    (None, 2, 4, 2),
    (None, 3, 4, 1),   # 4 // 3 = 1: no degree > 1 leaves a slot for each candidate
    (None, 3, 8, 2),   # 8 // 3 = 2 divides 8: 4 slots for 3 candidates
    (None, 1, 6, 6),
    (None, 2, 6, 3),
    (None, 4, 6, 1),   # 6 // 4 = 1
    (None, 1, 12, 12),
    (None, 5, 12, 2),  # 12 // 5 = 2
    (None, 4, 4, 1),   # as many candidates as devices: all busy already
    (None, 9, 4, 1),
    (2, 9, 4, 2),      # an explicit degree is kept
    (1, 1, 4, 1),
    (4, 1, 4, 4),
], ids=lambda v: repr(v))
def test_data_parallel_degree(requested, candidates, devices, want):
  assert engine.data_parallel_degree(requested, candidates, devices) == want


@pytest.mark.parametrize("requested,devices,match", [
    (3, 4, r"data_parallel must be an integer in \[1, 4\] that divides the 4 devices the engine "
           r"uses \(one of \[1, 2, 4\]\), got 3"),
    (8, 4, r"in \[1, 4\] .*got 8"),
    (2, 1, r"in \[1, 1\] .*one of \[1\]\), got 2"),
    (0, 4, r"in \[1, 4\] .*got 0"),
], ids=["not-a-divisor", "more-than-devices", "one-device", "zero"])
def test_data_parallel_degree_rejects_bad_values(requested, devices, match):
  with pytest.raises(ValueError, match=match):
    engine.data_parallel_degree(requested, 1, devices)


@pytest.mark.parametrize("value", [0, -2, 1.5, True, "2"], ids=repr)
def test_execution_config_rejects_bad_data_parallel(value):
  with pytest.raises(ValueError, match="data_parallel must be an integer"):
    ExecutionConfig(data_parallel=value)


def test_execution_config_keeps_an_integral_data_parallel_as_int():
  assert ExecutionConfig(data_parallel=2.0).data_parallel == 2
  assert isinstance(ExecutionConfig(data_parallel=2.0).data_parallel, int)
  assert ExecutionConfig().data_parallel is None


@pytest.mark.parametrize("padded,micro,degree,want", [
    (127, 127, 2, (128, 64)),    # 1 microbatch -> 2 of ceil(127 / 2) = 64
    (127, 127, 4, (128, 32)),    # -> 4 of 32
    (120, 40, 2, (120, 30)),     # 3 microbatches -> 4 of 30
    (120, 40, 3, (120, 40)),     # 3 already shares out evenly: unchanged
    (8, 4, 4, (8, 2)),           # 2 -> 4 of 2
    (5, 1, 4, (8, 1)),           # 5 -> 8 of 1: the microbatch never grows
    (64, 64, 1, (64, 64)),
], ids=lambda v: repr(v))
def test_spec_for_data_parallel_cuts_the_common_path_into_equal_shares(digits, base_config, padded,
                                                                       micro, degree, want):
  spec = dataclasses.replace(LoopSpec.from_config(base_config, digits), padded_batch_size=padded,
                             microbatch_size=micro)
  got = spec.for_data_parallel(degree)
  assert (got.padded_batch_size, got.microbatch_size) == want
  assert got.microbatch_size <= micro and got.padded_batch_size >= padded
  assert (got.padded_batch_size // got.microbatch_size) % degree == 0
  assert dataclasses.replace(got, padded_batch_size=padded, microbatch_size=micro) == spec


def _replicas(fun, mesh):
  """`fun(key)` on every device of `mesh`'s "data" axis: outputs stacked, one row per device."""
  return jax.jit(jax.shard_map(lambda k: jax.tree.map(lambda x: x[None], fun(k)), mesh=mesh,
                               in_specs=P(), out_specs=P("data"), check_vma=False))


@pytest.mark.parametrize("padded,micro", [(4, 2), (6, 3), (8, 8), (60, 20), (2, 1)])
def test_two_devices_process_every_sampled_example_exactly_once(two_devices, padded, micro):
  n, q = 50, 0.5   # ~25 sampled per step: far beyond the small paddings
  key = jax.random.key(7)
  mask = np.asarray(sampling.poisson_mask(key, n, q))
  assert mask.sum() > 8  # the overflow loop runs on both devices

  def fn(idx, valid):
    return jnp.zeros(n).at[idx].add(valid.astype(jnp.float32))

  counts, size = _replicas(lambda k: sampling.poisson_batch_sum(
      k, fn, num_examples=n, sampling_prob=q, padded_batch_size=padded, microbatch_size=micro,
      axis_name="data"), Mesh(np.array(two_devices), ("data",)))(key)
  # Integer counts are exact in float32: every sampled row once, nothing else,
  # and the same total and batch size on both devices.
  for row in np.asarray(counts):
    np.testing.assert_array_equal(row, mask.astype(np.float32))
  np.testing.assert_array_equal(np.asarray(size), [mask.sum()] * 2)


def data_axis_spy(sizes: list, inner):
  """`inner` (the batch sum) that appends the data-parallel axis size to `sizes` when traced."""
  def spy(*args, axis_name=None, **kwargs):
    if axis_name is not None:
      sizes.append(jax.lax.axis_size(axis_name))
    return inner(*args, axis_name=axis_name, **kwargs)
  return spy


def _spy_on_data_axis(monkeypatch) -> list:
  """Records the data-parallel axis size each time a training step is traced."""
  sizes = []
  monkeypatch.setattr(plan_module, "poisson_batch_sum", data_axis_spy(sizes, plan_module.poisson_batch_sum))
  return sizes


def _assert_close_params(got, want):
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(a, b, rtol=PARAMS_RTOL, atol=PARAMS_ATOL)


@pytest.mark.slow  # five programs compiled on purpose (one per degree and spec): about 17 s
def test_engine_shares_a_lone_candidate_over_both_devices(digits, base_config, two_devices,
                                                          monkeypatch):
  sizes = _spy_on_data_axis(monkeypatch)
  cfg = base_config.replace(steps=11)  # a spec no other test compiles: its programs are traced here
  cand = Candidate({"i": 0}, cfg, 3)
  shared = engine.train_candidates([cand], digits, devices=two_devices, keep_params=True)[0]
  assert sizes == [2]  # automatic: one candidate, two devices
  alone = train_candidate(cfg, digits, cand.key())
  assert shared.steps == alone.steps == 11 and shared.epsilon == alone.epsilon
  assert shared.test_score == pytest.approx(alone.test_score, abs=1 / 360)  # one test example
  _assert_close_params(shared.params, alone.params)
  # The override wins over the automatic choice (each traces a program of its own).
  sizes.clear()
  pinned = dataclasses.replace(cand, config=cfg.replace(execution=ExecutionConfig(data_parallel=1)))
  engine.train_candidates([pinned], digits, devices=two_devices)
  assert sizes == []
  # A lone candidate of a larger search (a resume, a Ray task) gets the layout of the
  # whole search: two candidates on two devices train side by side, one per device.
  fresh = Candidate({"i": 0}, base_config.replace(steps=12), 3)
  engine.train_candidates([fresh], digits, devices=two_devices, search_size=2)
  assert sizes == []
  # A config's own degree wins over the automatic choice.
  both = dataclasses.replace(fresh, config=fresh.config.replace(
      execution=ExecutionConfig(data_parallel=2)))
  engine.train_candidates([both], digits, devices=two_devices, search_size=2)
  assert sizes == [2]


def test_a_candidate_gets_the_same_bits_alone_as_within_its_search(digits, base_config, two_devices):
  # The resume guarantee: trained alone with the whole search's size, a candidate runs
  # in the program it runs within the search (padded with a copy): bit for bit.
  cfg = base_config.replace(steps=14)
  cands = [Candidate({"i": i}, cfg.replace(learning_rate=lr), i) for i, lr in enumerate([0.5, 2.0])]
  whole = engine.train_candidates(cands, digits, devices=two_devices, keep_params=True)
  for cand, want in zip(cands, whole):
    alone = engine.train_candidates([cand], digits, devices=two_devices, keep_params=True,
                                    search_size=len(cands))[0]
    for a, b in zip(jax.tree.leaves(alone.params), jax.tree.leaves(want.params)):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow  # two candidates vmapped on two devices: about 8 s
def test_vmapped_candidates_share_devices_too(digits, base_config, two_devices):
  # Accelerators vmap several candidates per device; with data parallelism the
  # psum then runs under vmap. Two candidates, both on both devices.
  pinned = base_config.replace(steps=9, execution=ExecutionConfig(data_parallel=2))
  cands = [Candidate({"i": i}, pinned.replace(learning_rate=lr), i) for i, lr in enumerate([0.5, 2.0])]
  shared = engine.train_candidates(cands, digits, devices=two_devices, max_candidates_per_device=2,
                                   keep_params=True)
  for cand, res in zip(cands, shared):
    alone = train_candidate(cand.config, digits, cand.key())
    assert res.steps == alone.steps == 9 and res.epsilon == alone.epsilon
    _assert_close_params(res.params, alone.params)


def test_bad_data_parallel_raises_before_any_training(digits, base_config, two_devices):
  good = Candidate({"i": 0}, base_config, 0)
  bad = Candidate({"i": 1}, base_config.replace(execution=ExecutionConfig(data_parallel=4)), 0)
  finished = []
  with pytest.raises(ValueError, match=r"data_parallel must be an integer in \[1, 2\] .*got 4"):
    engine.train_candidates([good, bad], digits, devices=two_devices,
                            on_chunk=finished.append)
  assert finished == []  # the valid group, first in order, did not train either
  with pytest.raises(ValueError, match=r"in \[1, 1\] .*got 2"):
    engine.train_candidates([Candidate({"i": 1}, base_config.replace(
        execution=ExecutionConfig(data_parallel=2)), 0)], digits, devices=two_devices[:1],
                            on_chunk=finished.append)
  with pytest.raises(ValueError, match=r"search_size must be an integer in \[1, inf\), got 0"):
    engine.train_candidates([good], digits, devices=two_devices, search_size=0,
                            on_chunk=finished.append)
  assert finished == []


# --- Four devices, one candidate (the check), in one subprocess. ---

_FOUR_DEVICES = textwrap.dedent("""
    import json, os
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, PartitionSpec as P
    from jaxdp.data import load_dataset
    from jaxdp.sweep import Candidate, engine
    from jaxdp.train import ExecutionConfig, LoopSpec, TrainConfig, presets, program, sampling
    from jaxdp.train import plan as plan_module

    assert len(jax.devices()) == 4, jax.devices()
    out = {}
    digits = load_dataset("digits")
    base = TrainConfig(task=presets.classifier(10), l2_clip_norm=1.0, noise_multiplier=1.0,
                       sampling_prob=0.05, steps=30, hparams=dict(learning_rate=1.0, model="logreg"))
    mesh = Mesh(np.array(jax.devices()), ("data",))

    def replicas(fun, mesh):
      return jax.jit(jax.shard_map(lambda k: jax.tree.map(lambda x: x[None], fun(k)), mesh=mesh,
                                   in_specs=P(), out_specs=P("data"), check_vma=False))

    # 1. One step's clipped sum (the noise comes after it), on 1 and on 4 devices.
    spec = LoopSpec.from_config(base, digits)
    plan = base.plan(digits.num_examples).for_device()
    clipped = plan.clipped_grad(spec.task.per_example_loss(spec.model()), method=spec.task.clipping)
    train = jax.tree.map(jnp.asarray, digits.train)
    params = program.init_params(spec, jax.random.key(1), train)
    rows = digits.num_train_rows

    def fn(idx, valid):
      return clipped(params, jax.tree.map(lambda leaf: leaf[idx], train), valid)

    def step(k, padded, micro, axis_name=None):
      return plan.batch_sum(k, fn, num_rows=rows, padded_batch_size=padded, microbatch_size=micro,
                            axis_name=axis_name)

    key = jax.random.key(11)
    # The reference: one device, the spec's own layout.
    one, count = jax.jit(lambda k: step(k, spec.padded_batch_size, spec.microbatch_size))(key)
    spread = spec.for_data_parallel(4)
    sums = []
    # The engine's layout for 4 devices, and one where the sample overflows the padding.
    for padded, micro in [(spread.padded_batch_size, spread.microbatch_size), (8, 4)]:
      four, counts = replicas(lambda k, padded=padded, micro=micro: step(k, padded, micro, "data"),
                              mesh)(key)
      four = [np.asarray(leaf) for leaf in jax.tree.leaves(four)]
      sums.append(dict(
          padded=padded, micro=micro, count=int(count), counts=np.asarray(counts).tolist(),
          max_diff=max(float(np.max(np.abs(f[0] - np.asarray(o))))
                       for f, o in zip(four, jax.tree.leaves(one))),
          max_abs=max(float(np.max(np.abs(np.asarray(o)))) for o in jax.tree.leaves(one)),
          replicas_equal=all(bool((f == f[:1]).all()) for f in four)))
    out["sums"] = sums

    # 2. Exactly once, past the padding, on 4 and on 3 devices: integer counts are exact.
    n, q, key = 50, 0.5, jax.random.key(7)
    mask = np.asarray(sampling.poisson_mask(key, n, q)).astype(np.float32)
    def count_fn(idx, valid):
      return jnp.zeros(n).at[idx].add(valid.astype(jnp.float32))
    once = []
    for devices, padded, micro in [(4, 4, 2), (4, 12, 4), (3, 6, 3), (3, 2, 1)]:
      got, _ = replicas(lambda k: sampling.poisson_batch_sum(
          k, count_fn, num_examples=n, sampling_prob=q, padded_batch_size=padded,
          microbatch_size=micro, axis_name="data"), Mesh(np.array(jax.devices()[:devices]), ("data",)))(key)
      once.append(bool(all((row == mask).all() for row in np.asarray(got))))
    out["once"], out["sampled"] = once, int(mask.sum())

    # 3. The engine: which degree each call traced, and the trained parameters.
    from tests.train.test_data_parallel import data_axis_spy
    sizes = []
    plan_module.poisson_batch_sum = data_axis_spy(sizes, plan_module.poisson_batch_sum)

    def train(config, devices, seed=5):
      sizes.clear()
      res = engine.train_candidates([Candidate({"i": 0}, config, seed)], digits,
                                    devices=jax.devices()[:devices], keep_params=True)[0]
      return res, max(sizes, default=1)

    def leaves(res):
      return [np.asarray(x) for x in jax.tree.leaves(res.params)]

    one, _ = train(base, 1)
    runs = {"auto": train(base, 4),
            "pinned-2": train(base.replace(execution=ExecutionConfig(data_parallel=2)), 4)}
    out["engine"] = {name: dict(
        degree=degree, steps=res.steps, epsilon_equal=res.epsilon == one.epsilon,
        diffs=[float(np.max(np.abs(a - b))) for a, b in zip(leaves(res), leaves(one))],
        scales=[float(np.max(np.abs(b))) for b in leaves(one)],
        close=all(np.allclose(a, b, rtol=float(os.environ["RTOL"]), atol=float(os.environ["ATOL"]))
                  for a, b in zip(leaves(res), leaves(one))))
        for name, (res, degree) in runs.items()}

    # 4. One noise draw: q = 1e-9 samples nobody from these 1,437 rows (threshold 4 / 2**32),
    # so the clipped sum is exactly 0 and one step moves the parameters by
    # -lr * noise / (qN): noise / sigma*C must be N(0, 1), not N(0, D) or N(0, D**2).
    lr = 1e-8
    zero = base.replace(sampling_prob=1e-9, steps=1, noise_multiplier=2.0, learning_rate=lr)
    init_key, _ = jax.random.split(Candidate({"i": 0}, zero, 5).key())
    start = [np.asarray(x) for x in jax.tree.leaves(
        program.init_params(LoopSpec.from_config(zero, digits), init_key, digits.train))]
    qn = zero.sampling_prob * digits.num_examples
    draws = {}
    for devices in (1, 4):
      res, degree = train(zero, devices)
      draws[devices] = (np.concatenate([((s - a) * qn / lr).ravel() for a, s in zip(leaves(res), start)])
                        / (zero.noise_multiplier * zero.l2_clip_norm))
      out[f"zero_degree_{devices}"] = degree
    out["noise_std"] = {d: float(np.std(v)) for d, v in draws.items()}
    out["noise_coords"] = int(draws[1].size)
    out["noise_max_diff"] = float(np.max(np.abs(draws[4] - draws[1])))
    print("RESULT " + json.dumps(out))
""")


@pytest.fixture(scope="module")
def four_devices():
  """The subprocess's measurements (about 15 s on 2 busy cores: JAX start-up, 5 trainings and
  7 small programs, each compiled once)."""
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
             PYTHONPATH=os.path.dirname(os.path.dirname(jaxdp.__file__)),
             RTOL=repr(PARAMS_RTOL), ATOL=repr(PARAMS_ATOL))
  proc = subprocess.run([sys.executable, "-c", _FOUR_DEVICES], capture_output=True, text=True,
                        env=env, timeout=300, check=False)
  assert proc.returncode == 0, proc.stderr[-4000:]
  line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")][-1]
  return json.loads(line[len("RESULT "):])


@pytest.mark.slow  # a fresh interpreter with 4 host devices: about 18 s
def test_four_devices_give_the_one_device_clipped_sum(four_devices):
  for case in four_devices["sums"]:
    # The same sample on every device and the same batch size.
    assert case["counts"] == [case["count"]] * 4
    # Every device holds bitwise the same sum: the replicated update is one update.
    assert case["replicas_equal"]
    # Only the order of the additions differs (see _summation_bound: 8e-4 for
    # the 82 sampled examples, C = 1; measured 6e-7, on values up to 2.6).
    assert case["max_diff"] <= _summation_bound(case["count"], 4, 1.0), case
    assert case["max_abs"] > 1.0  # a real sum, not zeros
  assert four_devices["sums"][1]["count"] > 8  # the (8, 4) case overflows the padding


@pytest.mark.slow  # a fresh interpreter with 4 host devices: about 18 s
def test_four_and_three_devices_process_every_sampled_example_exactly_once(four_devices):
  assert four_devices["sampled"] > 12  # beyond every padding tried: overflow on each device
  assert four_devices["once"] == [True] * 4


@pytest.mark.slow  # a fresh interpreter with 4 host devices: about 18 s
@pytest.mark.parametrize("name,degree", [("auto", 4), ("pinned-2", 2)])
def test_four_devices_train_the_one_device_parameters(four_devices, name, degree):
  run = four_devices["engine"][name]
  assert run["degree"] == degree  # automatic for one candidate: all 4; the override wins
  assert run["steps"] == 30 and run["epsilon_equal"]
  # Within PARAMS_RTOL / PARAMS_ATOL (stated at the top), checked in the subprocess.
  assert run["close"], run


@pytest.mark.slow  # a fresh interpreter with 4 host devices: about 18 s
def test_four_devices_draw_the_noise_once_per_step(four_devices):
  assert four_devices["zero_degree_1"] == 1 and four_devices["zero_degree_4"] == 4
  std, n = four_devices["noise_std"], four_devices["noise_coords"]
  assert n == 650  # the 64 x 10 weights and 10 biases
  # The std of 650 N(0, 1) draws is 1 +- 0.028 (1 / sqrt(2n)): 0.15 is over 5 standard
  # errors, and rejects the sqrt(D) = 2 of independent per-device draws and the
  # D = 4 of one draw added on every device.
  for d in ("1", "4"):
    assert abs(std[d] - 1.0) < 0.15, std
  # The very draw of one device (the sum is exactly 0; the division by qN and
  # the learning rate are the only roundings): relative 1e-5 of values ~3.
  assert four_devices["noise_max_diff"] < 3e-5
