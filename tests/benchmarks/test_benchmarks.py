"""Every benchmark script still runs and prints the JSON it documents.

Each runs with its `--quick` arguments in a subprocess (as a user would run
it: a fresh interpreter, so the scripts' own XLA flags apply), and only the
shape of the output is checked: keys, types, finiteness. Timings are never
asserted; they depend on the machine and on whatever else runs on it.

They are marked slow (about 150 s together, mostly compiling in fresh
interpreters and starting Ray for `scale_out`): `make test-slow`, which CI
runs on every submission, finds a benchmark that no longer runs.
"""

import json
import math
import os
import subprocess
import sys

import pytest


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT_S = 300

pytestmark = pytest.mark.slow


def _run(module: str, *args: str) -> dict:
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
  env.pop("XLA_FLAGS", None)  # the test session's device flags are not the script's business
  proc = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=TIMEOUT_S, check=False)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  return json.loads(proc.stdout)  # the whole of stdout is one JSON object


def _positive_numbers(out: dict, keys):
  for key in keys:
    assert isinstance(out[key], (int, float)) and not isinstance(out[key], bool), key
    assert math.isfinite(out[key]) and out[key] > 0, (key, out[key])


def test_accounting_benchmark():
  out = _run("benchmarks.accounting", "--quick")
  assert out["quick"] is True and "T=200" in out["event"]
  _positive_numbers(out, ["profile_epsilon_seconds", "profile_epsilon_warm_seconds", "profile_epsilon",
                          "rdp_epsilon_seconds", "rdp_epsilon", "max_mean_seconds", "max_mean",
                          "plan_seconds"])
  # Both are valid bounds on the same event; the profile method is the tighter here.
  assert out["profile_epsilon"] <= out["rdp_epsilon"]
  assert {"max_mean_query", "plan_query", "python", "machine"} <= set(out)
  # The plan table: one row per family of K, in plan's order; each found mean
  # (here all are found) is within the budget named in plan_query.
  assert out["plan_query"] == "epsilon=0.5, delta=1e-05, method=best"
  assert [r["family"] for r in out["plan"]] == ["poisson", "geometric", "logarithmic", "tnb-0.5", "fixed"]
  for row in out["plan"]:
    _positive_numbers(row, ["max_mean", "epsilon"])
    assert row["epsilon"] <= 0.5, row
  assert out["plan"][-1]["max_mean"] == int(out["plan"][-1]["max_mean"])  # fixed K: an integer k
  # The calibration row (--quick: geometric K only): both answers meet the target, within
  # the tolerance of each other (rtol 1e-3 each, on the private side).
  (row,) = out["calibration"]
  assert row["law"] == "geometric (mean 3)" and "NoisyMean" in out["calibration_query"]
  _positive_numbers(row, ["seconds", "sigma", "epsilon", "baseline_seconds", "baseline_sigma", "speedup"])
  assert row["epsilon"] <= 2.0 and row["baseline_epsilon"] <= 2.0
  assert abs(row["sigma"] / row["baseline_sigma"] - 1) <= 2.1e-3


def test_calibration_benchmark():
  out = _run("benchmarks.calibration", "--quick")
  assert out["quick"] is True and out["repeats"] == 1 and "baseline" not in out
  _positive_numbers(out, ["calibrate_seconds", "dry_run_seconds", "sigma", "epsilon", "calibrate_epsilon"])
  assert len(out["calibrate_runs"]) == len(out["dry_run_runs"]) == 1
  assert "NoisyMean" in out["search"] and "Poisson(mean=3)" in out["search"]
  # The calibrated sigma meets the target when re-accounted, alone and by the dry run.
  assert out["epsilon"] <= 3.0 and out["calibrate_epsilon"] <= 3.0 and out["same_answers"] is True


def test_dpsgd_throughput_benchmark():
  out = _run("benchmarks.dpsgd_throughput", "--quick")
  assert out["quick"] is True and out["batch"] == 8 and out["input_shape"] == [8, 8, 1]
  _positive_numbers(out, ["nonprivate_examples_per_s", "dp_examples_per_s", "dp_over_nonprivate_time"])
  assert len(out["variants"]) == 1 and out["variants"][0]["conv_impl"] == "im2col"
  _positive_numbers(out["variants"][0], ["nonprivate_step_s", "dp_step_s", "compile_s"])
  # The default is the library's automatic microbatch, which divides the batch.
  assert out["variants"][0]["clipping"] == "auto" and "automatic" in out["variants"][0]["variant"]
  assert out["auto_over_faster_path"] is None  # --quick measures no variant to compare with
  assert out["microbatch_size"] == out["variants"][0]["microbatch_size"]
  assert isinstance(out["microbatch_size"], int) and 8 % out["microbatch_size"] == 0
  assert {"backend", "devices", "cpu_count", "jax_version"} <= set(out)


def test_sweep_throughput_benchmark():
  out = _run("benchmarks.sweep_throughput", "--quick")
  assert out["quick"] is True and out["candidates"] == 2 and out["steps"] == 2 and out["model"] == "logreg"
  _positive_numbers(out, ["batched_candidates_per_hour", "vmap_one_device_candidates_per_hour",
                          "sequential_candidates_per_hour", "speedup", "vmap_speedup", "simulator_seconds"])
  assert out["simulator_trials"] == 5 and out["simulator_means"] == 2
  assert out["batch"] == 64 and isinstance(out["microbatch_size"], int) and out["microbatch_size"] >= 1
  _positive_numbers(out, ["batched_examples_per_s"])
  paths = {"batched", "vmap_one_device", "sequential"}
  assert set(out["compile_seconds_per_group"]) == set(out["cores_busy"]) == paths
  _positive_numbers(out["compile_seconds_per_group"], paths)  # each path compiled its group once
  _positive_numbers(out["cores_busy"], paths)
  assert len(out["devices"]) == os.cpu_count()  # the script exposes every core as a device


@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_dpsgd_memory_benchmark(model):
  out = _run("benchmarks.dpsgd_memory", "--quick", "--model", model)
  assert out["quick"] is True and out["batches"] == [8]
  if model == "mlp":
    assert out["num_params"] == (784 + 1) * 64 + (64 + 1) * 64 + (64 + 1) * 10  # 784-64-64-10 MLP
  else:
    assert out["model"].startswith("papernot_steinke_cnn (8x8x1")
  assert [(r["path"], r["clipping"], r["batch"]) for r in out["results"]] == [
      ("vmap", None, 8), ("vmap_microbatched", "vmap", 8), ("ghost", "ghost", 8), ("auto", "auto", 8)]
  for r in out["results"]:  # the tiny model fits any budget, so every configuration ran
    assert r["skipped"] is None
    _positive_numbers(r, ["compiled_peak_bytes", "temp_bytes", "argument_bytes", "output_bytes",
                          "step_s", "examples_per_s", "compile_s", "microbatch_size"])
    assert 8 % r["microbatch_size"] == 0
  assert len(out["ratios"]) == 1
  _positive_numbers(out["ratios"][0], ["memory_ghost_over_vmap", "speed_ghost_over_vmap",
                                       "memory_ghost_over_vmap_microbatched",
                                       "speed_ghost_over_vmap_microbatched",
                                       "memory_auto_over_smaller", "speed_auto_over_faster"])
  # Compiled sizes, not timings: deterministic.
  by_path = {r["path"]: r for r in out["results"]}
  if model == "mlp":  # Dense layers only: auto takes every ghost norm, the same program as 'ghost'
    assert out["ratios"][0]["memory_ghost_over_vmap"] < 1
    assert by_path["auto"]["compiled_peak_bytes"] == by_path["ghost"]["compiled_peak_bytes"]
  _positive_numbers(out, ["budget_bytes", "devices"])
  assert {"backend", "device_kind", "cpu_count", "jax_version"} <= set(out)


def test_scale_out_benchmark():
  out = _run("benchmarks.scale_out", "--quick")
  assert out["quick"] is True and out["candidates"] == 2 and out["chunk_size"] == 1
  for path in ("local", "ray_one_node", "ray_two_nodes"):
    _positive_numbers(out[path], ["cold_seconds", "cold_candidates_per_hour", "warm_seconds",
                                  "warm_candidates_per_hour"])
  assert out["ray_one_node"]["nodes"] == 1 and out["ray_two_nodes"]["nodes"] == 2
  assert out["same_release"] is True  # every backend releases the same candidate
  _positive_numbers(out, ["ray_one_node_over_local_warm", "ray_two_nodes_over_local_warm"])
  resume = out["resume"]
  # Whatever the kill left, the rerun trains the rest and a third run trains nothing.
  assert 1 <= resume["stored_at_kill"] <= 2 and resume["rerun_trained"] == 2 - resume["stored_at_kill"]
  assert resume["all_stored_rerun_trained"] == 0 and resume["same_release"] is True
  _positive_numbers(resume, ["uninterrupted_process_seconds", "rerun_process_seconds",
                             "all_stored_rerun_process_seconds"])
  _positive_numbers(out["one_candidate"], ["devices_1_examples_per_s", "devices_2_examples_per_s",
                                           "speedup_2_over_1"])


def test_finetune_benchmark():
  out = _run("benchmarks.finetune", "--quick")
  assert out["quick"] is True and out["width"] == 32 and out["clipping"] == "vmap"
  full, head = out["results"]["full"], out["results"]["head_only"]
  assert full["params"] == head["params"] == (784 + 1) * 32 + (32 + 1) * 32 + (32 + 1) * 10
  assert full["trainable_params"] == full["params"] and head["trainable_params"] == (32 + 1) * 10
  for r in (full, head):
    _positive_numbers(r, ["examples_per_s", "compiled_peak_bytes", "compile_s", "microbatch_size"])
  # Compiled sizes, not timings (deterministic): no per-example backbone gradient is held.
  assert head["temp_bytes"] < full["temp_bytes"]
  _positive_numbers(out, ["speed_head_only_over_full", "memory_full_over_head_only"])


def test_transformer_benchmark():
  out = _run("benchmarks.transformer", "--quick")
  assert out["quick"] is True and out["width"] == 32 and out["length"] == 16 and out["batch"] == 32
  assert out["depth"] == 1
  assert [(r["vocab"], r["way"]) for r in out["results"]] == [(512, "full"), (512, "lora")]
  full, adapted = out["results"]
  assert full["trainable_params"] == full["params"] and adapted["trainable_params"] < adapted["params"]
  for r in out["results"]:
    _positive_numbers(r, ["dp_step_s", "non_private_step_s", "ratio", "per_example_bytes", "microbatch_size",
                          "dp_compiled_peak_bytes", "non_private_compiled_peak_bytes"])
    _positive_numbers(r["breakdown"], ["clipped_grad_32_s", "grad_32_s", "noise_s", "expected_rows_per_step",
                                       "clip_ratio_at_32_rows"])
    assert r["microbatch_size"] <= r["breakdown"]["expected_rows_per_step"] <= r["padded_batch_size"] * 2
  # Every parameter is named once; LoRA freezes all but the head (the adapters add 8 leaves).
  assert full["clipping"]["frozen"] == 0 and adapted["clipping"]["frozen"] == sum(full["clipping"].values()) - 2
  assert sum(adapted["clipping"].values()) == sum(full["clipping"].values()) + 8


def test_paper_epoch_benchmark():
  out = _run("benchmarks.paper_epoch", "--quick")
  assert out["quick"] is True and out["steps"] == 2 and out["input_shape"] == [8, 8, 1]
  assert out["model"] == "papernot_steinke_cnn" and out["batch_size"] == 256 and out["clipping"] == "auto"
  _positive_numbers(out, ["compile_seconds", "epoch_seconds", "examples_per_s", "paper_profile_hours",
                          "microbatch_size"])
  # 50 candidates x 60 epochs of the measured epoch, in hours.
  assert out["paper_profile_hours"] == pytest.approx(3000 * out["epoch_seconds"] / 3600, abs=0.01)


def test_config_walk_benchmark():
  out = _run("benchmarks.config_walk")
  # One durable search on a 2 x 2 grid (one task, 2 programs, 4 configurations): the data is
  # checked once and one spec is derived per configuration (issue 32: 11 and 23 before).
  assert out["per_call_checks"] == {"check_data": 1, "check_initial_params": 0,
                                    "LoopSpec.from_config": 4}
  assert out["walk"][0] == "jaxdp/tuning/search.py" and out["stays"] == len(out["walk"])
  assert 0 <= out["down"]["returns"] < out["down"]["stays"] <= out["stays"]


def test_checkpoints_benchmark():
  out = _run("benchmarks.checkpoints", "--quick")
  assert out["quick"] is True and out["steps"] == 20 and out["input_shape"] == [8, 8, 1]
  assert out["model"] == "papernot_steinke_cnn" and out["devices_used"] == 1
  _positive_numbers(out, ["compile_seconds", "warm_up_seconds", "identity_seconds"])
  fixed = out["fixed_cadence"]
  assert fixed["checkpoint_every"] == 5 and fixed["saves"] == 3  # after steps 5, 10 and 15
  _positive_numbers(fixed, ["seconds_no_checkpoints", "seconds_with_checkpoints",
                            "seconds_per_step_no_checkpoints", "seconds_per_step_with_checkpoints",
                            "host_seconds_per_save"])
  for key in ("per_save_seconds", "overhead_fraction", "cpu_overhead_fraction"):  # a difference
    assert math.isfinite(fixed[key]), key
  _positive_numbers(fixed["save_breakdown"], ["device_get", "handoff", "orbax_save_call"])
  assert math.isfinite(fixed["overhead_fraction_from_burst"])
  burst = out["burst"]  # 6 steps saving after each against saving once, both killed at step 6
  assert burst["steps"] == 6 and burst["extra_saves"] == 5 and math.isfinite(burst["per_save_seconds"])
  _positive_numbers(burst, ["host_seconds_per_save"])
  default = out["default_cadence"]
  assert default["auto_seconds"] == 600.0 and default["probe_steps"] == 8 and default["saves"] == 0
  assert math.isfinite(default["short_candidate_fraction"])
  assert math.isfinite(default["steady_state_fraction"])
  assert math.isfinite(default["steady_state_fraction_burst"])
  _positive_numbers(default, ["seconds", "steady_state_fraction_host"])
  assert default["auto_seconds_patched"]["saves"] >= 1
  resume = out["resume"]
  assert resume["killed_at_step"] == resume["resumed_step"] == resume["checkpoint_every"] == 13
  assert resume["uninterrupted_saves"] == 1
  _positive_numbers(resume, ["uninterrupted_seconds", "killed_run_seconds", "resumed_seconds",
                             "resumed_fraction", "restore_seconds"])
  # The resumed run computes the uninterrupted run's bits, with or without checkpoints.
  assert resume["same_bits"] is True and resume["same_bits_as_no_checkpoints"] is True
  assert {"backend", "device_kind", "cpu_count", "jax_version", "date"} <= set(out)


def test_second_process_benchmark():
  out = _run("benchmarks.second_process", "--quick")
  assert out["quick"] is True and out["command"] == "python -m benchmarks.second_process --quick"
  _positive_numbers(out, ["first_process_s", "second_process_s", "first_search_s", "second_search_s",
                          "second_over_first"])
  # The second process reads its programs from the cache (default settings): it writes none,
  # and releases the same, bit for bit.
  assert out["same_release"] is True and out["second_new_entries"] == 0


def test_noise_throughput_benchmark():
  out = _run("benchmarks.noise_throughput", "--quick")
  assert out["quick"] is True and out["coordinates"] == 65_536 and out["leaves"] == 4
  assert [r["impl"] for r in out["results"]] == ["threefry2x32", "rbg", "unsafe_rbg"]
  _positive_numbers(out, ["add_s"])
  for row in out["results"]:
    _positive_numbers(row, ["one_draw_s", "per_leaf_s", "one_draw_msamples_per_s",
                            "per_leaf_msamples_per_s"])


def test_plan_overhead_benchmark():
  out = _run("benchmarks.plan_overhead", "--quick")
  assert out["quick"] is True and out["command"] == "python -m benchmarks.plan_overhead --quick"
  assert (out["vocab"], out["width"], out["depth"], out["length"], out["repeats"]) == (512, 32, 1, 16, 1)
  _positive_numbers(out, ["plan_runs_s", "plan_runs_cpu_s", "dry_run_s", "dry_run_cpu_s", "loss_traces"])
  stages = out["plan_runs_cpu_breakdown_s"]
  assert set(stages) == {"analysis_forward_traces", "gradient_traces", "model_init", "optimizer_concreteness",
                         "check_model_on_two_rows", "check_score", "check_dp_step"}
  _positive_numbers(stages, list(stages))
  # One block: 2 embeddings, 4 attention projections, 2 MLP layers and the head (2 leaves each
  # but the embeddings), 3 layer norms (2 each): every parameter has its clipping path.
  assert out["dry_run_clipping_paths"] == 2 + 4 * 2 + 2 * 2 + 2 + 3 * 2


def test_compile_groups_benchmark():
  out = _run("benchmarks.compile_groups", "--quick")
  assert out["quick"] is True and out["command"] == "python -m benchmarks.compile_groups --quick"
  assert out["groups"] == 2  # one compiled group per activation
  _positive_numbers(out, ["engine_first_run_s", "engine_compile_s", "speedup_threads", "loadavg"])
  for way in ("sequential", "threads", "lower_then_threads"):
    _positive_numbers(out[way], ["wall_s", "cores_busy"])
  _positive_numbers(out["lower_then_threads"], ["compile_s"])


def test_microbatch_overhead_benchmark():
  out = _run("benchmarks.microbatch_overhead", "--quick")
  assert out["quick"] is True and out["command"] == "python -m benchmarks.microbatch_overhead --quick"
  assert out["model"] == "cnn" and out["rows"] == 48 and set(out["seconds"]) == {"8", "48"}
  _positive_numbers(out, ["row_s", "per_example_bytes"])
  _positive_numbers(out["seconds"], ["8", "48"])
  # The overhead is fitted and may come out negative (larger microbatches cost more per row).
  assert all(math.isfinite(out[k]) for k in ("microbatch_s", "overhead_rows", "overhead_bytes"))
