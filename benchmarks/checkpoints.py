"""What checkpoints inside a candidate cost, and what a resume after a kill saves; prints JSON.

One candidate of `jaxdp.experiments.fig7`'s paper profile (Papernot–Steinke
CNN, tanh, batch 256, q = 256/60000, the library's default clipping and
microbatch) on MNIST-sized random data (60,000 x 28 x 28 x 1, 10 classes),
trained for T DP steps through `jaxdp.sweep.engine.train_candidates` on one
device (`devices=jax.devices()[:1]`) with `checkpoint_dir` in a temporary
directory (a fresh one per run). Only `ExecutionConfig(checkpoint_every=...)`
changes between runs; it is not part of the mechanism (nor of the compiled
program), so every run trains the same candidate with the same samples and
noise, and one compilation serves all.

  python -m benchmarks.checkpoints [--steps 240] [--every 100] [--repeats 2]
                                   [--default-repeats 1] [--auto-seconds 15]
                                   [--burst-steps 40] [--burst-repeats 3] [--quick]

Warm-up (untimed, `warm_up_seconds`): a run killed at its first checkpoint
compiles the program (`compile_seconds`, the engine's own measurement) and
imports and warms orbax. Each candidate's plan
(`TaskPlan`) is built once, outside the timed runs, as a tuner builds its
search's; so is its first `TaskPlan.identity` (`identity_seconds`: it
traces the program for its digest; a durable search pays it once, when it
opens its run_dir). A timed run is the whole `train_candidates` call (wall
`seconds`, and the process's CPU seconds in `cpu_seconds`, which another job
on the machine disturbs less), so it includes what every call pays once
(copying the data to the device, the final evaluation).

`fixed_cadence`: checkpoint_every=0 (never saves) against checkpoint_every=100,
`repeats` times each, alternating (with the default cadence, below); medians.
  per_save_seconds = (t_100 - t_0) / saves;  overhead_fraction = (t_100 - t_0) / t_0.
A few saves cost far less than the runs' timing noise on a shared machine,
so `burst` measures the per-save cost where it is large: B = 40 steps saving
after every step (checkpoint_every=1) against B steps saving once
(checkpoint_every=B), both killed right after their save at step B,
alternating, `burst_repeats` times; per_save = (t_1 - t_B) / (B - 1), and
`overhead_fraction_from_burst` = saves x that / t_0.
`save_breakdown`: host seconds per save spent in the engine's `ChunkSaver.save`
once the segment's compute is done, by timing wrappers around the library's
methods (which are called unchanged): `device_get` of the loop state, and
`handoff` (`Checkpoints.save`) = `digest` (the arrays' sha256) +
`orbax_save_call` (the synchronous part of orbax's asynchronous save);
`final_wait` per run (the last write's completion when the candidate is
released). The device idles while the host does these, between segments.

`default_cadence` (checkpoint_every=None, `AUTO_SECONDS` = 600 s):
  (a) `short_candidate_fraction` = (t_None - t_0) / t_0 on the same T-step
      candidate, far shorter than AUTO_SECONDS: only the timed probe of
      `PROBE_STEPS` steps (one synchronisation, one more segment), no save;
  (b) `steady_state_fraction` = per_save_seconds / AUTO_SECONDS: one save per
      AUTO_SECONDS of training (per_save_seconds of `fixed_cadence`), and
      `steady_state_fraction_host` = (device_get + handoff) / AUTO_SECONDS from
      the breakdown (not subject to timing noise);
  (c) `auto_seconds_patched`: the same run with
      `jaxdp.sweep.checkpoints.AUTO_SECONDS` monkeypatched here to
      `--auto-seconds` (15 s) for that run only, so the default cadence saves a
      few times within T steps: its saves, fraction (t - t_0) / t_0 and
      per-save cost (t - t_0) / saves.

`resume`: T steps with checkpoint_every = 0.65 T (one checkpoint, at 65%;
T = 240: step 156): uninterrupted; then a run killed right after that
checkpoint is complete (in process: `Checkpoints.save` wrapped to call the
original, `wait()` for the write, and raise); then the rerun on the same
checkpoint directory, which restores it and trains the remaining 35%.
resumed_fraction = resumed_seconds / uninterrupted_seconds (ideally about 0.35
plus the restore and the per-call costs; the rerun is warm, in the same
process: a new process would also import, build its plan and compile);
`same_bits`: the resumed run's final parameters equal the uninterrupted run's
bit for bit (`same_bits_as_no_checkpoints`: and the checkpoint_every=0 run's).

`--quick` (1,024 examples of 8 x 8, 20 steps, checkpoint_every 5, one repeat,
AUTO_SECONDS patched to 0.05 s) only checks that the script runs; its numbers
mean nothing.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import sys
import tempfile
import time


class _Killed(Exception):
  """The simulated kill, raised right after the checkpoint at the kill step is complete."""


def _round(x, digits=4):
  return None if x is None else round(float(x), digits)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--examples", type=int, default=60000, help="training set size N")
  parser.add_argument("--image-size", type=int, default=28)
  parser.add_argument("--steps", type=int, default=240, help="T, DP steps of the candidate")
  parser.add_argument("--every", type=int, default=100, help="the fixed cadence measured")
  parser.add_argument("--repeats", type=int, default=2,
                      help="timed runs of each of checkpoint_every 0 and --every")
  parser.add_argument("--default-repeats", type=int, default=1,
                      help="timed runs of checkpoint_every None (in the first repeats' rotation)")
  parser.add_argument("--burst-steps", type=int, default=40,
                      help="steps of the high-cadence runs (killed after their save at this step)")
  parser.add_argument("--burst-repeats", type=int, default=3)
  parser.add_argument("--auto-seconds", type=float, default=15.0,
                      help="AUTO_SECONDS patched in for the default cadence's direct measurement")
  parser.add_argument("--quick", action="store_true",
                      help="smoke run: 1024 examples of 8x8, 20 steps; numbers mean nothing")
  args = parser.parse_args(argv)
  if args.quick:
    args.examples, args.image_size, args.steps, args.every = 1024, 8, 20, 5
    args.repeats, args.auto_seconds, args.burst_steps, args.burst_repeats = 1, 0.05, 6, 1

  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  from benchmarks._data import mnist_sized  # pylint: disable=g-import-not-at-top
  from jaxdp.experiments import fig7  # pylint: disable=g-import-not-at-top
  from jaxdp.sweep import Candidate, TaskPlan, checkpoints, chunk_saver, engine  # pylint: disable=g-import-not-at-top
  from jaxdp.train import ExecutionConfig  # pylint: disable=g-import-not-at-top

  shape = (args.image_size, args.image_size, 1)
  data = mnist_sized(args.examples, args.image_size)
  profile = fig7.PROFILES["paper"]
  base = fig7.base_config(profile, args.examples).replace(epochs=None, steps=args.steps)
  devices = jax.devices()[:1]
  total = args.steps
  kill_at = max(1, round(0.65 * total))

  # Host seconds in the saving path, by timing wrappers (the library's methods run unchanged).
  timers = {name: [] for name in ("saver_save", "handoff", "digest", "release", "restore")}
  saver_cls, store_cls = chunk_saver.ChunkSaver, checkpoints.Checkpoints
  originals = {"saver_save": saver_cls.save, "handoff": store_cls.save,
               "release": store_cls.release, "restore": store_cls.restore,
               "digest": checkpoints.params_digest,
               "compiled_chunk": engine._compiled_chunk}  # pylint: disable=protected-access

  def timed(name, fn):
    def wrapper(*a, **k):
      began = time.perf_counter()
      try:
        return fn(*a, **k)
      finally:
        timers[name].append(time.perf_counter() - began)
    return wrapper

  def saver_save(self, padded, state, *rest):
    jax.block_until_ready(state)  # the segment's compute (device_get would wait for it too)
    return timed("saver_save", originals["saver_save"])(self, padded, state, *rest)

  kill = {"at": None}  # set: the next save at or after this step is the last one

  def handoff(self, candidate_id, identity, step, state):
    timed("handoff", originals["handoff"])(self, candidate_id, identity, step, state)
    if kill["at"] is not None and step >= kill["at"]:
      self.wait()  # the checkpoint is complete on disk; then the process "dies"
      raise _Killed(step)

  compiled = []  # the compile seconds of every compilation (the engine's own measurement)

  def compiled_chunk(*a, **k):
    executable, seconds = originals["compiled_chunk"](*a, **k)
    if seconds:
      compiled.append(seconds)
    return executable, seconds

  saver_cls.save, store_cls.save = saver_save, handoff
  engine._compiled_chunk = compiled_chunk  # pylint: disable=protected-access
  store_cls.release = timed("release", originals["release"])
  store_cls.restore = timed("restore", originals["restore"])
  checkpoints.params_digest = timed("digest", originals["digest"])

  plans, identity_seconds = {}, []

  def planned(every):
    """(candidate, plan) for a cadence; the plan and its identity are built once, untimed."""
    if every not in plans:
      config = base.replace(execution=ExecutionConfig(checkpoint_every=every))
      candidate = Candidate({"learning_rate": profile.learning_rates[0]}, config, 0)
      plan = TaskPlan.for_candidates([candidate], data)
      began = time.perf_counter()
      plan.identity(candidate)
      identity_seconds.append(time.perf_counter() - began)
      plans[every] = candidate, plan
    return plans[every]

  root = tempfile.mkdtemp(prefix="jaxdp-checkpoints-bench-")
  counter = [0]

  def train(every, directory=None, kill_after=None):
    """One call on a fresh (or the given) checkpoint directory: a dict of its measurements."""
    candidate, plan = planned(every)
    for values in timers.values():
      values.clear()
    if directory is None:
      counter[0] += 1
      directory = os.path.join(root, f"run{counter[0]}")
    kill["at"] = kill_after
    wall, cpu = time.perf_counter(), time.process_time()
    try:
      (result,) = engine.train_candidates([candidate], plan, devices=devices, keep_params=True,
                                          checkpoint_dir=directory)
      jax.block_until_ready(result.params)
      killed = None
    except _Killed as err:
      result, killed = None, int(err.args[0])
    finally:
      kill["at"] = None
    out = {"seconds": time.perf_counter() - wall, "cpu_seconds": time.process_time() - cpu,
           "result": result, "killed_at": killed, "saves": len(timers["handoff"])}
    out.update({name: sum(values) for name, values in timers.items()})
    out["device_get"] = out["saver_save"] - out["handoff"]
    out["orbax_save_call"] = out["handoff"] - out["digest"]
    return out

  def bits(params):
    return [np.asarray(leaf).tobytes() for leaf in jax.tree.leaves(params)]

  try:
    # Warm-up, untimed: compiles the program (the cadence is not part of it), warms orbax.
    warm = train(args.every, kill_after=1)
    assert warm["killed_at"] is not None and len(compiled) == 1, (warm["killed_at"], compiled)

    # 1. and 2(a): checkpoint_every 0, --every and None, alternating.
    runs = {every: [] for every in (0, args.every, None)}
    for repeat in range(max(args.repeats, args.default_repeats)):
      for every in runs:
        if repeat < (args.default_repeats if every is None else args.repeats):
          runs[every].append(train(every))
    reference = bits(runs[0][0]["result"].params)

    # The per-save cost at a high cadence, where it is well above the timing noise: B steps
    # saving after every step against B steps saving once, each killed after its save at B.
    burst = {1: [], args.burst_steps: []}
    for _ in range(args.burst_repeats):
      for every in burst:
        burst[every].append(train(every, kill_after=args.burst_steps))
        assert burst[every][-1]["killed_at"] == args.burst_steps

    # 2(c): the default cadence with AUTO_SECONDS patched down, so that it saves within T steps.
    saved_auto = checkpoints.AUTO_SECONDS
    checkpoints.AUTO_SECONDS = args.auto_seconds
    try:
      auto = train(None)
    finally:
      checkpoints.AUTO_SECONDS = saved_auto

    # 3. Uninterrupted; killed right after the checkpoint at 65%; resumed on its directory.
    whole = train(kill_at)
    directory = os.path.join(root, "killed")
    killed = train(kill_at, directory, kill_after=kill_at)
    assert killed["killed_at"] == kill_at, killed["killed_at"]
    resumed = train(kill_at, directory)
    assert len(compiled) == 1, f"a timed run recompiled: {compiled}"
  finally:
    saver_cls.save, store_cls.save = originals["saver_save"], originals["handoff"]
    store_cls.release, store_cls.restore = originals["release"], originals["restore"]
    checkpoints.params_digest = originals["digest"]
    engine._compiled_chunk = originals["compiled_chunk"]  # pylint: disable=protected-access
    shutil.rmtree(root, ignore_errors=True)

  median = lambda every, key: statistics.median(r[key] for r in runs[every])
  t0, t_fixed, t_none = median(0, "seconds"), median(args.every, "seconds"), median(None, "seconds")
  c0, c_fixed = median(0, "cpu_seconds"), median(args.every, "cpu_seconds")
  saves = runs[args.every][0]["saves"]
  per_save = (t_fixed - t0) / saves if saves else None
  burst_saves = burst[1][0]["saves"] - burst[args.burst_steps][0]["saves"]
  burst_times = {every: statistics.median(r["seconds"] for r in rs) for every, rs in burst.items()}
  burst_per_save = (burst_times[1] - burst_times[args.burst_steps]) / burst_saves
  burst_host = statistics.median(r["saver_save"] for r in burst[1]) / burst[1][0]["saves"]
  per_save_host = {name: median(args.every, name) / max(saves, 1)
                   for name in ("device_get", "handoff", "digest", "orbax_save_call")}
  host_per_save = per_save_host["device_get"] + per_save_host["handoff"]

  device = devices[0]
  per_step = lambda t: _round(t / total, 5)
  seconds = lambda rs: [_round(r["seconds"], 3) for r in rs]
  print(json.dumps({
      "model": profile.model, "batch_size": profile.batch_size, "examples": args.examples,
      "input_shape": list(shape), "steps": total, "repeats": args.repeats,
      "compile_seconds": _round(compiled[0], 3),
      "warm_up_seconds": _round(warm["seconds"], 3),
      "identity_seconds": _round(identity_seconds[0], 3),
      "fixed_cadence": {
          "checkpoint_every": args.every, "saves": saves,
          "seconds_no_checkpoints": _round(t0, 3), "seconds_with_checkpoints": _round(t_fixed, 3),
          "seconds_per_step_no_checkpoints": per_step(t0),
          "seconds_per_step_with_checkpoints": per_step(t_fixed),
          "per_save_seconds": _round(per_save, 4),
          "overhead_fraction": _round((t_fixed - t0) / t0, 5),
          "cpu_seconds_no_checkpoints": _round(c0, 3),
          "cpu_seconds_with_checkpoints": _round(c_fixed, 3),
          "cpu_overhead_fraction": _round((c_fixed - c0) / c0, 5),
          "runs_no_checkpoints": seconds(runs[0]),
          "runs_with_checkpoints": seconds(runs[args.every]),
          "save_breakdown": {**{k: _round(v, 5) for k, v in per_save_host.items()},
                             "final_wait": _round(median(args.every, "release"), 5)},
          "host_seconds_per_save": _round(host_per_save, 5),
          "host_overhead_fraction": _round(saves * host_per_save / t0, 6),
          "formula": "per_save = (t_every - t_0) / saves; overhead = (t_every - t_0) / t_0",
          "overhead_fraction_from_burst": _round(saves * burst_per_save / t0, 6),
      },
      "burst": {
          "steps": args.burst_steps, "repeats": args.burst_repeats,
          "seconds_every_step": [_round(r["seconds"], 3) for r in burst[1]],
          "seconds_once": [_round(r["seconds"], 3) for r in burst[args.burst_steps]],
          "extra_saves": burst_saves, "per_save_seconds": _round(burst_per_save, 4),
          "host_seconds_per_save": _round(burst_host, 5),
          "formula": ("per_save = (median t, checkpoint_every=1 - median t, checkpoint_every=B) / "
                      "(B - 1); both killed after their save at step B"),
      },
      "default_cadence": {
          "auto_seconds": saved_auto, "probe_steps": checkpoints.PROBE_STEPS,
          "seconds": _round(t_none, 3), "runs": seconds(runs[None]), "saves": runs[None][0]["saves"],
          "short_candidate_fraction": _round((t_none - t0) / t0, 5),
          "steady_state_fraction": _round(per_save / saved_auto, 7) if per_save is not None else None,
          "steady_state_fraction_burst": _round(burst_per_save / saved_auto, 8),
          "steady_state_fraction_host": _round(host_per_save / saved_auto, 8),
          "steady_state_formula": ("per_save_seconds / AUTO_SECONDS (one save per AUTO_SECONDS of "
                                   "training), per_save_seconds from fixed_cadence; _burst: from "
                                   "burst; _host: host_seconds_per_save / AUTO_SECONDS"),
          "auto_seconds_patched": {
              "auto_seconds": args.auto_seconds, "saves": auto["saves"],
              "seconds": _round(auto["seconds"], 3),
              "fraction": _round((auto["seconds"] - t0) / t0, 5),
              "per_save_seconds": (_round((auto["seconds"] - t0) / auto["saves"], 4)
                                   if auto["saves"] else None),
              "note": "jaxdp.sweep.checkpoints.AUTO_SECONDS monkeypatched for this run only"},
      },
      "resume": {
          "checkpoint_every": kill_at, "killed_at_step": killed["killed_at"],
          "uninterrupted_saves": whole["saves"],
          "uninterrupted_seconds": _round(whole["seconds"], 3),
          "killed_run_seconds": _round(killed["seconds"], 3),
          "resumed_seconds": _round(resumed["seconds"], 3),
          "resumed_fraction": _round(resumed["seconds"] / whole["seconds"], 4),
          "remaining_fraction_of_steps": _round((total - kill_at) / total, 4),
          "resumed_step": int(resumed["result"].resumed_step),
          "restore_seconds": _round(resumed["restore"], 4),
          "same_bits": bits(resumed["result"].params) == bits(whole["result"].params),
          "same_bits_as_no_checkpoints": bits(resumed["result"].params) == reference,
      },
      "backend": jax.default_backend(), "device_kind": device.device_kind,
      "devices_used": len(devices), "cpu_count": os.cpu_count(), "jax_version": jax.__version__,
      "date": datetime.date.today().isoformat(), "quick": bool(args.quick),
  }, indent=2))
  return 0


if __name__ == "__main__":
  sys.exit(main())
