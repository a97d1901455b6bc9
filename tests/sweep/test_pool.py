"""Durable pool: checksums, quarantine, one writer, resume, refuse mixing, survive SIGKILL."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import jaxdp
from jaxdp.sweep import (LocalTrainer, PoolLockedError, PoolMismatchError, ResultPool, SearchSpace,
                         grid_candidates, run_sweep)
from jaxdp.sweep.pool import SearchMismatchError
from jaxdp.sweep.space import KEY_DERIVATION

FP = {"sweep": "test", "version": 1}
# Subprocesses import the jaxdp this test imported.
_ENV = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(jaxdp.__file__)))


def _lines(path):
  return path.read_bytes().splitlines()


def _pool_of_12(tmp_path):
  with ResultPool(tmp_path, FP) as pool:
    pool.append([{"id": f"c{i:02d}", "score": i / 10, "point": {"lr": i}} for i in range(12)])
  return tmp_path / "results.jsonl"


def test_append_and_reload(tmp_path):
  with ResultPool(tmp_path, FP) as pool:
    pool.append([{"id": "a", "score": 0.5}, {"id": "b", "score": float("nan")}])
  again = ResultPool(tmp_path, FP, read_only=True)
  assert again.done_ids() == {"a", "b"}
  assert again.records[0]["score"] == 0.5 and again.records[1]["score"] != again.records[1]["score"]
  assert all("sha256" not in r for r in again.records)
  assert all("sha256" in json.loads(l) for l in _lines(tmp_path / "results.jsonl"))


def test_refuses_a_directory_of_another_sweep(tmp_path):
  ResultPool(tmp_path, FP).close()
  with pytest.raises(PoolMismatchError, match="differs in: version"):
    ResultPool(tmp_path, {"sweep": "test", "version": 2})


def test_the_mismatch_names_where_a_fingerprint_differs(tmp_path):
  ResultPool(tmp_path, {"configs": [{"sigma": 1.0, "lr": 0.1}]}).close()
  with pytest.raises(SearchMismatchError,
                     match=r"differs in: configs\):\n  - configs\[0\]\.sigma: stored 1.0, now 1.5\n"):
    ResultPool(tmp_path, {"configs": [{"sigma": 1.5, "lr": 0.1}]})


def test_the_mechanism_is_recorded_per_point_and_a_change_is_refused(tmp_path):
  events = {"dp_events": {'{"lr":1}': "Gaussian(1.0)"}, "programs": {'{"lr":1}': "a" * 64}}
  with ResultPool(tmp_path, FP, mechanism=events) as pool:
    pool.append([{"id": "c1", "point": {"lr": 1}, "dp_event": "Gaussian(1.0)"}])
  changed = {"dp_events": {'{"lr":1}': "Gaussian(100.0)"}, "programs": {'{"lr":1}': "b" * 64}}
  with pytest.raises(SearchMismatchError, match=(
      r"differs in: dp_events, programs\):\n  - dp_event: stored Gaussian\(1.0\), now "
      r"Gaussian\(100.0\) \(at grid point \{\"lr\":1\}\)\n  - program: .* differs")) as err:
    ResultPool(tmp_path, FP, mechanism=changed)
  # A program's digest covers what its code reads (issue 42): a message never shows it.
  assert "aaaa" not in str(err.value) and "bbbb" not in str(err.value)
  # Another point is added (a sweep may grow), and is then held to its mechanism too.
  more = {"dp_events": {'{"lr":2}': "Gaussian(2.0)"}}
  ResultPool(tmp_path, FP, mechanism=more).close()
  assert json.loads((tmp_path / "manifest.json").read_text())["jaxdp_mechanism"]["dp_events"] == {
      '{"lr":1}': "Gaussian(1.0)", '{"lr":2}': "Gaussian(2.0)"}
  with pytest.raises(SearchMismatchError, match=r"differs in: dp_events\)"):
    ResultPool(tmp_path, FP, mechanism={"dp_events": {'{"lr":2}': "Gaussian(3.0)"}}, read_only=True)
  # A reader that names no mechanism checks none; the records are checked against the manifest.
  assert ResultPool(tmp_path, FP, read_only=True).done_ids() == {"c1"}


def test_a_record_whose_event_is_not_its_points_is_refused(tmp_path):
  with ResultPool(tmp_path, FP, mechanism={"dp_events": {'{"lr":1}': "Gaussian(1.0)"}}) as pool:
    pool.append([{"id": "c1", "point": {"lr": 1}, "dp_event": "Gaussian(9.0)"}])
  with pytest.raises(SearchMismatchError, match=r"dp_event of a stored candidate; .*stored "
                                                r"Gaussian\(9.0\), now Gaussian\(1.0\)"):
    ResultPool(tmp_path, FP, read_only=True)


def test_a_mismatch_is_a_short_diff_of_every_change_naming_the_way_out(tmp_path):
  # Issue 45: a refusal that cut off before the values that differ. Nested paths flattened, one
  # line per change, under 800 characters however many fields differ, then how many more.
  def fingerprint(lr, width):
    return {"task": {"optimizer": {"learning_rate": lr}, "widths": [width, 8]},
            "variants": {f"field_{i:02d}": width + i for i in range(30)}}
  ResultPool(tmp_path / "a", fingerprint(0.1, 4)).close()
  with pytest.raises(SearchMismatchError) as err:
    ResultPool(tmp_path / "a", fingerprint(0.2, 5))
  message = str(err.value)
  assert len(message) < 800, len(message)
  assert "\n  - task.optimizer.learning_rate: stored 0.1, now 0.2\n" in message
  assert "\n  - task.widths[0]: stored 4, now 5\n" in message
  assert re.search(r"\n  \.\.\. and \d+ more\n", message)
  assert "use a new run_dir, or delete this one" in message.lower()
  # A long run_dir is shortened to its end: the message stays under the limit.
  deep = tmp_path / ("d" * 150) / ("e" * 150)
  ResultPool(deep, fingerprint(0.1, 4)).close()
  with pytest.raises(SearchMismatchError) as err:
    ResultPool(deep, fingerprint(0.2, 5))
  assert len(str(err.value)) < 800 and "eeee'" in str(err.value)


@pytest.mark.parametrize("fingerprint,mechanism,match", [
    ({"jaxdp_mechanism": 1}, None, "reserved key 'jaxdp_mechanism'"),
    (FP, {"events": {}}, "mechanism must be None or a mapping part"),
    (FP, {"dp_events": {"p": 1.0}}, "mechanism must be None or a mapping part"),
])
def test_bad_mechanism_or_reserved_key(tmp_path, fingerprint, mechanism, match):
  with pytest.raises(ValueError, match=match):
    ResultPool(tmp_path, fingerprint, mechanism=mechanism)


def test_refuses_a_pool_of_the_previous_format(tmp_path):
  # Format 3 recorded no mechanism: what its candidates computed cannot be checked.
  (tmp_path / "manifest.json").write_text(json.dumps(dict(FP, jaxdp_pool={
      "format": 3, "candidate_keys": KEY_DERIVATION})))
  with pytest.raises(PoolMismatchError, match="pool format/key derivation"):
    ResultPool(tmp_path, FP)


def test_refuses_a_pool_made_with_the_old_seed_only_keys(tmp_path):
  # Format 1: the manifest was the bare fingerprint and keys were key(seed).
  (tmp_path / "manifest.json").write_text(json.dumps(FP))
  (tmp_path / "results.jsonl").write_text('{"id": "a", "score": 1.0}\n')
  with pytest.raises(PoolMismatchError, match="PRNG key from the seed alone"):
    ResultPool(tmp_path, FP)
  assert (tmp_path / "results.jsonl").read_text() == '{"id": "a", "score": 1.0}\n'


def test_corrupted_last_line_is_dropped_with_a_warning(tmp_path):
  with ResultPool(tmp_path, FP) as pool:
    pool.append([{"id": "a", "score": 1.0}])
  with open(tmp_path / "results.jsonl", "a") as f:
    f.write('{"id": "b", "sco')  # a write cut by a crash
  with pytest.warns(UserWarning, match="corrupted line"):
    again = ResultPool(tmp_path, FP)
  assert again.done_ids() == {"a"}
  again.append([{"id": "b", "score": 2.0}])
  again.close()
  assert [json.loads(l)["id"] for l in open(tmp_path / "results.jsonl")] == ["a", "b"]
  assert (tmp_path / "results.jsonl.quarantine").read_bytes() == b'{"id": "b", "sco\n'


@pytest.mark.parametrize("damage", ["flipped_byte", "valid_json_edit", "torn_half"])
def test_a_damaged_line_in_the_middle_costs_that_line_only(tmp_path, damage):
  path = _pool_of_12(tmp_path)
  lines = _lines(path)
  bad = bytearray(lines[2])
  if damage == "flipped_byte":
    bad[bad.index(b'"score"') + 3] ^= 0x01  # one bit of one byte
  elif damage == "valid_json_edit":
    bad = bytearray(bad.replace(b'"score":0.2', b'"score":0.9'))  # still parses: the checksum catches it
  else:
    bad = bad[:len(bad) // 2]
  path.write_bytes(b"\n".join(lines[:2] + [bytes(bad)] + lines[3:]) + b"\n")
  with pytest.warns(UserWarning, match=r"results.jsonl, line 3: corrupted line .* moved to "
                                      r".*results.jsonl.quarantine and every valid record is kept"):
    pool = ResultPool(tmp_path, FP)
  pool.close()
  assert [r["id"] for r in pool.records] == [f"c{i:02d}" for i in range(12) if i != 2]
  assert _lines(path) == lines[:2] + lines[3:]  # rewritten with the 11 valid records
  assert (tmp_path / "results.jsonl.quarantine").read_bytes() == bytes(bad) + b"\n"
  with ResultPool(tmp_path, FP) as again:  # repaired: opens cleanly, and resumes
    assert len(again.records) == 11
    again.append([{"id": "c02", "score": 0.2, "point": {"lr": 2}}])
  assert len(ResultPool(tmp_path, FP, read_only=True).records) == 12


def test_repeated_candidate_is_kept_once(tmp_path):
  path = _pool_of_12(tmp_path)
  lines = _lines(path)
  path.write_bytes(b"\n".join(lines + [lines[0], lines[5]]) + b"\n")  # e.g. two old writers
  with pytest.warns(UserWarning) as caught:
    pool = ResultPool(tmp_path, FP)
  assert [str(w.message).split("results.jsonl, ")[1].split(";")[0] for w in caught] == [
      "line 13: repeated record: it repeats the candidate first stored at line 1, which is kept",
      "line 14: repeated record: it repeats the candidate first stored at line 6, which is kept"]
  with pytest.raises(ValueError, match="already in the pool"):
    pool.append([{"id": "c03", "score": 0.0}])
  pool.close()
  assert [r["id"] for r in pool.records] == [f"c{i:02d}" for i in range(12)]
  assert _lines(path) == lines
  assert _lines(tmp_path / "results.jsonl.quarantine") == [lines[0], lines[5]]


def test_empty_results_file_is_an_empty_pool(tmp_path):
  ResultPool(tmp_path, FP).close()
  (tmp_path / "results.jsonl").write_bytes(b"")
  with ResultPool(tmp_path, FP) as pool:
    assert pool.records == []
    pool.append([{"id": "a", "score": 1.0}])
  assert ResultPool(tmp_path, FP, read_only=True).done_ids() == {"a"}


@pytest.mark.parametrize("manifest,match", [
    (b"", "manifest.json is empty"), (b"[1, 2]", "manifest.json is not a JSON object"),
    (b'{"sweep": "te', "manifest.json is not a JSON object"), (None, "holds results but no manifest.json"),
])
def test_damaged_or_missing_manifest_is_refused_clearly(tmp_path, manifest, match):
  path = _pool_of_12(tmp_path)
  before = path.read_bytes()
  if manifest is None:
    (tmp_path / "manifest.json").unlink()
  else:
    (tmp_path / "manifest.json").write_bytes(manifest)
  with pytest.raises(PoolMismatchError, match=match):
    ResultPool(tmp_path, FP)
  assert path.read_bytes() == before


def test_a_second_writer_in_the_same_process_is_refused(tmp_path):
  with ResultPool(tmp_path, FP):
    with pytest.raises(PoolLockedError, match="another ResultPool in this process"):
      ResultPool(tmp_path, FP)
    assert isinstance(PoolLockedError("x"), RuntimeError)
    ResultPool(tmp_path, FP, read_only=True)  # readers need no lock
  ResultPool(tmp_path, FP).close()  # released on close


_HOLD = textwrap.dedent("""
    import sys, time
    from jaxdp.sweep import ResultPool
    pool = ResultPool(sys.argv[1], {"sweep": "test", "version": 1})
    print("locked", flush=True)
    time.sleep(120)
""")


def test_a_second_writer_process_is_refused_with_a_clear_error(tmp_path):
  run_dir = tmp_path / "run"
  holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(run_dir)], env=_ENV,
                            stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == "locked"
    with pytest.raises(PoolLockedError) as err:
      run_sweep([], None, run_dir, FP)
    assert str(err.value) == (
        f"run directory {str(run_dir)!r} is locked: another process (pid {holder.pid}) is writing "
        "it. Two writers would train the same candidates twice; wait for it to finish or use "
        "another directory")
  finally:
    holder.kill()
    holder.wait()
  # The kernel drops the lock of a killed writer: the directory is usable again.
  ResultPool(run_dir, FP).close()


_READ_ONLY = textwrap.dedent("""
    import json, sys, warnings
    from jaxdp.sweep import ResultPool
    fp = {"sweep": "test", "version": 1}
    out = {}
    try:
      ResultPool(sys.argv[1], fp)
    except ValueError as err:
      out["error"] = str(err)
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always")
      out["ids"] = sorted(ResultPool(sys.argv[1], fp, read_only=True).done_ids())
    out["warnings"] = [str(w.message) for w in caught]
    print(json.dumps(out))
""")


def test_read_only_run_directory_gives_a_clear_error_and_loses_nothing(tmp_path):
  command = [sys.executable, "-c", _READ_ONLY, str(tmp_path)]
  if os.geteuid() == 0:
    # Root ignores permission bits; drop the capabilities that let it.
    if shutil.which("setpriv") is None:
      pytest.skip("running as root without setpriv: cannot make a directory read-only")
    command = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search,-fowner"] + command
  path = _pool_of_12(tmp_path)
  lines = _lines(path)
  path.write_bytes(b"\n".join(lines[:4] + [b'{"id": "torn'] + lines[4:]) + b"\n")
  before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
  for p in tmp_path.iterdir():
    p.chmod(0o444)
  tmp_path.chmod(0o555)
  try:
    done = subprocess.run(command, env=_ENV, capture_output=True, text=True, timeout=120)
  finally:
    tmp_path.chmod(0o755)
    for p in tmp_path.iterdir():
      p.chmod(0o644)
  assert done.returncode == 0, done.stderr
  out = json.loads(done.stdout)
  assert out["error"].startswith(f"run_dir={str(tmp_path)!r} is not writable (Permission denied)")
  assert "read_only=True" in out["error"]
  assert out["ids"] == [f"c{i:02d}" for i in range(12)]
  assert len(out["warnings"]) == 1 and "line 5: corrupted line" in out["warnings"][0]
  assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_unwritable_run_dir(tmp_path):
  target = tmp_path / "file"
  target.write_text("not a directory")
  with pytest.raises(ValueError, match="cannot be created"):
    ResultPool(target / "sub", FP)


def test_run_sweep_resumes_and_skips_finished(tmp_path, digits, base_config, two_devices):
  space = SearchSpace(base_config, {"learning_rate": [0.5, 2.0]})
  cands = grid_candidates(space, seeds=[0, 1])
  calls = []

  local = LocalTrainer(devices=two_devices)

  def counting_trainer(todo, plan, **kw):  # a callable is a trainer too
    calls.append(len(todo))
    return local(todo, plan, **kw)

  run_sweep(cands[:3], digits, tmp_path, FP, trainer=counting_trainer)
  pool = run_sweep(cands, digits, tmp_path, FP, trainer=counting_trainer)
  assert calls == [3, 1]
  assert pool.done_ids() == {c.id for c in cands}
  rec = pool.records[0]
  for field in ("point", "seed", "score", "test_score", "score_source", "steps", "epsilon", "delta", "wall_time_s", "dp_event"):
    assert field in rec
  assert "PoissonSampledDpEvent" in rec["dp_event"]


_SCRIPT = textwrap.dedent("""
    import sys
    from jaxdp.data import load_dataset
    from jaxdp.sweep import LocalTrainer, SearchSpace, grid_candidates, run_sweep
    from jaxdp.train import TrainConfig, presets
    base = TrainConfig(task=presets.classifier(10), l2_clip_norm=1.0, noise_multiplier=1.0,
                       sampling_prob=0.05, steps=400, hparams=dict(learning_rate=1.0, model="mlp"))
    cands = grid_candidates(SearchSpace(base, {"learning_rate": [0.1, 0.2, 0.4, 0.8, 1.6, 3.2]}), seeds=[0])
    run_sweep(cands, load_dataset("digits"), sys.argv[1], {"kill": 1},
              trainer=LocalTrainer(max_candidates_per_device=1))
""")


@pytest.mark.slow  # two JAX processes training 400-step MLPs: about a minute on 2 cores
def test_sigkill_loses_at_most_the_chunk_in_flight(tmp_path):
  script = tmp_path / "sweep.py"
  script.write_text(_SCRIPT)
  run_dir = tmp_path / "run"
  env = dict(_ENV, XLA_FLAGS="--xla_force_host_platform_device_count=1")
  proc = subprocess.Popen([sys.executable, str(script), str(run_dir)], env=env)
  results = run_dir / "results.jsonl"
  deadline = time.time() + 240
  while time.time() < deadline and (not results.exists() or results.read_text().count("\n") < 2):
    time.sleep(0.2)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert proc.returncode == -signal.SIGKILL
  kept = [json.loads(l)["id"] for l in results.read_text().splitlines()]
  assert 2 <= len(kept) < 6, "the kill should land mid-sweep"
  done = subprocess.run([sys.executable, str(script), str(run_dir)], env=env, timeout=600)
  assert done.returncode == 0
  ids = [json.loads(l)["id"] for l in results.read_text().splitlines()]
  assert len(ids) == len(set(ids)) == 6
  assert ids[:len(kept)] == kept  # finished candidates were kept, not retrained


# ---------------------------------------------------------------------------- parameters


def _trees():
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  return {"a": {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.float32(-0.5)},
          "b": {"w": np.asarray(jnp.array([1.5, -2.25], jnp.bfloat16)), "b": np.int32(7)}}


def test_parameters_round_trip_bit_for_bit_in_any_dtype(tmp_path):
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  trees = _trees()
  with ResultPool(tmp_path, FP) as pool:
    pool.append([{"id": "a", "score": 1.0}, {"id": "b", "score": 2.0}], params=trees)
  with ResultPool(tmp_path, FP, read_only=True) as again:
    leaves = again.load_params(again.records)
  for rid, tree in trees.items():
    for got, want in zip(leaves[rid], jax.tree.leaves(tree)):
      want = np.asarray(want)
      assert got.dtype == want.dtype and got.shape == want.shape
      assert got.tobytes() == want.tobytes()


def test_a_damaged_parameter_file_costs_its_records_which_drop_quarantines(tmp_path):
  from jaxdp.sweep.pool import ParamsDamagedError  # pylint: disable=g-import-not-at-top
  with ResultPool(tmp_path, FP) as pool:
    pool.append([{"id": "a", "score": 1.0}], params={"a": _trees()["a"]})
    pool.append([{"id": "b", "score": 2.0}], params={"b": _trees()["b"]})
    pool.append([{"id": "c", "score": 3.0}])  # no parameters kept
    files = sorted((tmp_path / "params").iterdir())
    assert len(files) == 2
    of_a = next(r for r in pool.records if r["id"] == "a")["params"]["file"]
    (tmp_path / of_a).write_bytes((tmp_path / of_a).read_bytes()[:-3])  # truncated
    with pytest.raises(ParamsDamagedError, match="fails its checksum") as info:
      pool.load_params(pool.records)
    assert info.value.ids == ["a", "c"]  # c never had any
    with pytest.warns(UserWarning, match="moved to"):
      pool.drop(info.value.ids, str(info.value))
    assert pool.done_ids() == {"b"}
    pool.append([{"id": "a", "score": 1.0}], params={"a": _trees()["a"]})  # trained again
  with ResultPool(tmp_path, FP) as reopened:
    assert reopened.done_ids() == {"a", "b"}
    assert set(reopened.load_params(reopened.records)) == {"a", "b"}
  quarantined = [json.loads(line)["id"] for line in (tmp_path / "results.jsonl.quarantine").read_text().splitlines()]
  assert sorted(quarantined) == ["a", "c"]
