"""A private search on a real two-node Ray cluster survives a lost node and a killed driver.

The module starts its own cluster on this machine: `ray start --head` and a
second `ray start --address=...`, two raylets with one CPU and a custom
resource each (`head_node`, `second_node`). Each node is started in a session
of its own, so that it can be SIGKILLed alone and the teardown stops exactly
the processes this module started (`ray stop` would stop every Ray instance of
the user on the machine, the other tests' included). Workers see one host
device (XLA_FLAGS); the cluster has an auth token of its own
(RAY_AUTH_TOKEN_PATH), so it shares nothing with `~/.ray`.

The search runs in a driver subprocess (`ray_cluster_driver.py`): a durable
`random_search` with a `run_dir` and `RayTrainer(address=...,
chunk_size=1)`, one candidate per Ray task. Four runs:

  1. uninterrupted: both nodes train candidates;
  2. the driver SIGKILLed once the pool holds a candidate, then rerun: the
     rerun trains exactly the candidates the pool did not hold;
  3. the second node SIGKILLed while it trains a candidate: Ray retries that
     task on the head and the search finishes;
  4. long candidates with checkpoints (`<run_dir>/checkpoints`, which both
     nodes reach: they share this machine's disk), the second node SIGKILLed
     once its candidate in flight has a complete checkpoint: the retried task
     resumes that candidate from it on the head, so the lost node costs only
     the rest of that candidate; the driver says so on stderr in two lines.

The head's GCS declares a SIGKILLed node dead in about 1.5 s (HEALTH_CHECKS)
rather than Ray's default 15 s: the driver reports a lost node only once Ray
does, and run 4 finishes about 12 s after its kill.

Each release is compared with a local, uninterrupted `random_search` with the
same arguments and key and no run_dir, in this process with the local engine:

  * the same hyperparameters and number of candidates K, and the same epsilon
    exactly (float64 accounting of the same event, on the same machine);
  * the same score within one test example of accuracy, and the same
    parameters within PARAMS_RTOL / PARAMS_ATOL. The local engine here runs
    each candidate in a program compiled for this process's two host devices
    (shard_map over a 2-device mesh), a Ray worker in one compiled for its
    single device. Both train the same float32 program with the same keys, so
    the only possible difference is how XLA rounds what it compiles
    differently. On this machine (2-core AMD EPYC, jax 0.10.2, Ray 2.60) the
    releases were bit-identical; the test does not require it.

Marked slow (about 100 s alone, mostly starting Ray and JAX in fresh
processes): `make test-slow`, which CI runs, runs it.
"""

import dataclasses
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import jax
import numpy as np
import pytest

from jaxdp import accounting as acc
from jaxdp.sweep import SearchSpace
from jaxdp.tuning import random_search
from jaxdp.tuning.draws import draw_search

ray = pytest.importorskip("ray", reason="the Ray backend is optional: pip install 'jaxdp[ray]'")

pytestmark = pytest.mark.slow

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DRIVER = os.path.join(HERE, "ray_cluster_driver.py")
RAY = [sys.executable, "-m", "ray.scripts.scripts"]  # the `ray` command of this interpreter
NODE_ENV = "JAXDP_RAY_TEST_NODE"  # the driver's task log reads it on the workers

GRID = {"learning_rate": [0.3, 1.0, 3.0]}
REPETITIONS = acc.Poisson(mean=5)
KEY = 0  # draws K = 6 from REPETITIONS (checked in `drawn_ids`)
PARAMS_RTOL, PARAMS_ATOL = 1e-5, 1e-6
# Long candidates (run 4): about 0.3 ms a step and 70 ms a checkpoint on this machine, so a
# candidate trains for 2 to 3 s once its worker has compiled, a checkpoint every 0.1 s or so.
LONG_STEPS, LONG_EVERY = 3000, 100
# The head's GCS declares a node dead after this many failed health checks this far apart
# (Ray's defaults: 5 every 3 s, 15 s), its timeout of a check left at 10 s: a SIGKILLed
# raylet refuses the checks at once, a live one would have to hang for 30 s.
HEALTH_CHECKS = {"RAY_health_check_period_ms": "500", "RAY_health_check_failure_threshold": "3"}
START_TIMEOUT_S = 60
DRIVER_TIMEOUT_S = 150


_GIVEN_PORTS: set = set()


def _free_port() -> int:
  """A port free now and not given before in this process: the OS may hand the same free port
  to two successive binds, and two Ray components on one port fail `ray start`."""
  while True:
    with socket.socket() as s:
      s.bind(("127.0.0.1", 0))
      port = s.getsockname()[1]
    if port not in _GIVEN_PORTS:
      _GIVEN_PORTS.add(port)
      return port


def _session_pids(sid: int) -> list:
  """Live processes in session `sid` (a node's `ray start` and everything it started)."""
  pids = []
  for entry in os.listdir("/proc"):
    if not entry.isdigit():
      continue
    try:
      with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    except OSError:  # it exited meanwhile
      continue
    if int(fields[3]) == sid and fields[0] != "Z":  # fields: state ppid pgrp session ...
      pids.append(int(entry))
  return pids


def _kill_session(proc: subprocess.Popen) -> None:
  """SIGKILLs every process in the session that `proc` leads, until none is left."""
  deadline = time.monotonic() + 30
  while True:
    pids = _session_pids(proc.pid)
    for pid in pids:
      try:
        os.kill(pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
    proc.poll()  # reaps `proc` (our child); init reaps the others
    if not pids:
      return
    if time.monotonic() > deadline:
      raise RuntimeError(f"processes {pids} of session {proc.pid} survived SIGKILL")
    time.sleep(0.1)


class LocalCluster:
  """A Ray cluster of separate nodes on this machine, started with `ray start --block`.

  Each node is the session of its `ray start` process (start_new_session): its
  raylet, agents and workers stay in that session, so killing the session
  kills exactly that node, and nothing of another Ray instance.
  """

  def __init__(self):
    # Short: Ray's Unix socket paths live under it (at most 107 bytes).
    self.root = tempfile.mkdtemp(prefix="jxr", dir="/tmp")
    token = os.path.join(self.root, "token")
    with open(os.open(token, os.O_WRONLY | os.O_CREAT, 0o600), "w", encoding="utf-8") as f:
      f.write(secrets.token_hex(32))
    self.env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1",
                    RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=token, RAY_USAGE_STATS_ENABLED="0")
    self.env.pop("RAY_ADDRESS", None)
    self.port = _free_port()
    self.address = f"127.0.0.1:{self.port}"
    self.nodes: dict = {}

  def start_node(self, name: str) -> None:
    """Starts node `name` ("head" first) with one CPU and the resource `<name>_node`."""
    ports = {flag: _free_port() for flag in (
        "node-manager-port", "object-manager-port", "dashboard-agent-listen-port",
        "dashboard-agent-grpc-port", "metrics-export-port", "runtime-env-agent-port")}
    cmd = [*RAY, "start", "--block", "--num-cpus=1", "--disable-usage-stats",
           "--object-store-memory=100000000", f"--temp-dir={self.root}/{name}",
           f"--resources={json.dumps({name + '_node': 1})}",
           *[f"--{flag}={port}" for flag, port in ports.items()]]
    if name == "head":
      cmd += ["--head", f"--port={self.port}", "--node-ip-address=127.0.0.1",
              "--include-dashboard=false", f"--dashboard-port={_free_port()}"]
    else:
      cmd += [f"--address={self.address}", "--node-ip-address=127.0.0.1"]
    env = dict(self.env, **{NODE_ENV: name}, **(HEALTH_CHECKS if name == "head" else {}))
    log = os.path.join(self.root, f"{name}.log")
    with open(log, "w", encoding="utf-8") as out:
      proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                              start_new_session=True)
    self.nodes[name] = proc
    deadline = time.monotonic() + START_TIMEOUT_S
    while "Ray runtime started" not in _read(log):
      if proc.poll() is not None or time.monotonic() > deadline:
        self.kill_node(name)
        raise RuntimeError(f"`ray start` of node {name} failed:\n{_read(log)[-3000:]}")
      time.sleep(0.2)

  def kill_node(self, name: str) -> None:
    """SIGKILLs every process of node `name` (its session) and waits until they are gone."""
    proc = self.nodes.pop(name)
    _kill_session(proc)
    proc.wait(timeout=10)

  def stop(self) -> None:
    for name in list(self.nodes)[::-1]:
      self.kill_node(name)
    shutil.rmtree(self.root, ignore_errors=True)


def _read(path: str) -> str:
  try:
    with open(path, encoding="utf-8") as f:
      return f.read()
  except FileNotFoundError:
    return ""


@pytest.fixture(scope="module")
def cluster():
  cluster = LocalCluster()
  try:
    cluster.start_node("head")
    cluster.start_node("second")
    yield cluster
  finally:
    cluster.stop()


@pytest.fixture(scope="module")
def search_file(tmp_path_factory, base_config, digits):
  """The search's arguments, pickled for the driver: it runs exactly the local search."""
  path = tmp_path_factory.mktemp("ray_cluster") / "search.pkl"
  path.write_bytes(ray.cloudpickle.dumps(dict(config=base_config, grid=GRID, data=digits,
                                              distribution=REPETITIONS, key=KEY)))
  return str(path)


@pytest.fixture(scope="module")
def local(base_config, digits):
  """The local, uninterrupted release (this process's engine, both host devices, no run_dir)."""
  return random_search(base_config, GRID, digits, distribution=REPETITIONS, key=jax.random.key(KEY))


def long_config(base_config):
  """The search config with long candidates that save a checkpoint every LONG_EVERY steps (the
  driver's `--steps LONG_STEPS --checkpoint-every LONG_EVERY`)."""
  return dataclasses.replace(base_config, steps=LONG_STEPS, execution=dataclasses.replace(
      base_config.execution, checkpoint_every=LONG_EVERY))


@pytest.fixture(scope="module")
def local_long(base_config, digits):
  """The local, uninterrupted release of the long search (no run_dir: no checkpoints)."""
  return random_search(long_config(base_config), GRID, digits, distribution=REPETITIONS,
                       key=jax.random.key(KEY))


@pytest.fixture(scope="module")
def long_ids(base_config):
  return {c.id for c in draw_search(SearchSpace(long_config(base_config), GRID), REPETITIONS,
                                    jax.random.key(KEY))}


@pytest.fixture(scope="module")
def drawn_ids(base_config):
  ids = [c.id for c in draw_search(SearchSpace(base_config, GRID), REPETITIONS, jax.random.key(KEY))]
  assert len(set(ids)) == len(ids) == 6, "KEY should draw 6 distinct candidates"
  return set(ids)


@dataclasses.dataclass
class Run:
  """One driver run: its process and files."""
  proc: subprocess.Popen
  run_dir: str
  task_log: str
  params_out: str
  label: str
  stderr: str = ""  # what the driver wrote there, once it exited (`wait`)

  def wait(self) -> dict:
    out, err = self.proc.communicate(timeout=DRIVER_TIMEOUT_S)
    self.stderr = err
    assert self.proc.returncode == 0, f"driver {self.label} failed:\n{out}\n{err[-5000:]}"
    return json.loads(out.strip().splitlines()[-1])

  def kill(self) -> None:
    """SIGKILLs the driver (its session: the driver and anything it started)."""
    _kill_session(self.proc)
    self.proc.communicate(timeout=30)

  def stored_ids(self) -> list:
    lines = _read(os.path.join(self.run_dir, "results.jsonl")).splitlines()
    return [json.loads(line)["id"] for line in lines if line.endswith("}")]

  def tasks(self, event: str, label: str = None) -> list:
    entries = [json.loads(line) for line in _read(self.task_log).splitlines()]
    return [e for e in entries if e["event"] == event and e["label"] == (label or self.label)]


@pytest.fixture
def start_driver(cluster, search_file, tmp_path):
  """`start_driver(label, delay=0.0, *args)`: a driver on this test's run_dir (`args`: more of
  its options); any left running is killed."""
  runs = []

  def start(label: str, delay: float = 0.0, *args: str) -> Run:
    run_dir, task_log = str(tmp_path / "run_dir"), str(tmp_path / "tasks.jsonl")
    params_out = str(tmp_path / f"params_{label}.npz")
    env = {k: v for k, v in cluster.env.items() if k != NODE_ENV}
    cmd = [sys.executable, DRIVER, search_file, "--address", cluster.address, "--run-dir", run_dir,
           "--task-log", task_log, "--label", label, "--task-delay", str(delay),
           "--params-out", params_out, *args]
    # Its own session: a SIGKILL of the driver reaches it and nothing else.
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    runs.append(Run(proc, run_dir, task_log, params_out, label))
    return runs[-1]

  yield start
  for run in runs:
    if run.proc.poll() is None:  # a failed test left it running
      run.kill()


def _wait_for(condition, what: str, run: Run, timeout_s: float = DRIVER_TIMEOUT_S):
  deadline = time.monotonic() + timeout_s
  while not condition():
    assert run.proc.poll() is None, f"the driver exited before {what}: {run.proc.communicate()}"
    assert time.monotonic() < deadline, f"timed out waiting for {what}"
    time.sleep(0.05)


def _complete_steps(run_dir: str, candidate_id: str) -> list:
  """The steps of the candidate's complete checkpoints: orbax renames a step's directory into
  `<step>` once it is written (until then it has the `.orbax-checkpoint-tmp` suffix)."""
  directory = os.path.join(run_dir, "checkpoints", candidate_id)
  try:
    return sorted(int(name) for name in os.listdir(directory) if name.isdigit())
  except FileNotFoundError:
    return []


def assert_same_release(release: dict, params_file: str, local, digits) -> None:
  """What the cluster released is what the local, uninterrupted search releases."""
  assert release["hyperparameters"] == local.hyperparameters
  assert release["num_candidates"] == local.unreleased.num_candidates
  assert release["epsilon"] == local.epsilon  # the same float64 accounting, on this machine
  # Test accuracy: at most one test image may flip (see the module docstring).
  one_image = 1 / digits.test.labels.shape[0]
  assert release["score"] == pytest.approx(local.score, abs=1.01 * one_image)
  local_leaves = [np.asarray(x) for x in jax.tree.leaves(local.params)]
  with np.load(params_file) as saved:
    leaves = [saved[f"arr_{i}"] for i in range(len(saved.files))]
  assert [(str(x.dtype), list(x.shape)) for x in local_leaves] == [tuple(x) for x in
                                                                   release["params_layout"]]
  for x, y in zip(leaves, local_leaves):
    np.testing.assert_allclose(x, y, rtol=PARAMS_RTOL, atol=PARAMS_ATOL)


@pytest.mark.timeout(240)
def test_a_search_on_two_nodes_releases_the_local_release(start_driver, local, drawn_ids, digits):
  run = start_driver("both-nodes")
  release = run.wait()
  assert_same_release(release, run.params_out, local, digits)
  ends = run.tasks("end")
  # Both nodes trained candidates: the worker's node id and the name of the
  # `ray start` it descends from agree, and so do the node's own resources.
  by_node = {}
  for e in ends:
    by_node.setdefault(e["node"], set()).add(e["node_id"])
  assert set(by_node) == {"head", "second"} and all(len(ids) == 1 for ids in by_node.values())
  for name, (node_id,) in by_node.items():
    assert release["nodes"][node_id] == [f"{name}_node"]
  # One task per candidate, each trained once and stored once.
  assert sorted(i for e in ends for i in e["ids"]) == sorted(drawn_ids)
  assert sorted(run.stored_ids()) == sorted(drawn_ids)


@pytest.mark.timeout(180)
def test_a_killed_driver_reruns_only_what_is_missing(start_driver, local, drawn_ids, digits):
  first = start_driver("killed", delay=1.0)
  _wait_for(lambda: first.stored_ids(), "the first stored candidate", first)
  first.kill()
  stored = first.stored_ids()  # read after the driver is dead: nothing is appended any more
  assert 1 <= len(stored) < len(drawn_ids), stored
  rerun = start_driver("rerun")
  release = rerun.wait()
  assert_same_release(release, rerun.params_out, local, digits)
  # The rerun trained exactly the candidates the pool did not hold, each once.
  trained = [i for e in rerun.tasks("start") for i in e["ids"]]
  assert sorted(trained) == sorted(drawn_ids - set(stored))
  assert sorted(rerun.stored_ids()) == sorted(drawn_ids)
  assert not os.path.exists(os.path.join(rerun.run_dir, "results.jsonl.quarantine"))


@pytest.mark.timeout(180)
def test_a_lost_node_costs_only_a_retry(cluster, start_driver, local, drawn_ids, digits):
  run = start_driver("lost-node", delay=1.5)

  def in_flight_on_second():
    done = {i for e in run.tasks("end") for i in e["ids"]}
    return [i for e in run.tasks("start") if e["node"] == "second" for i in e["ids"] if i not in done]

  # Mid-search: a candidate is stored and the second node is training another.
  _wait_for(lambda: run.stored_ids() and in_flight_on_second(), "a task in flight on the second node",
            run)
  cluster.kill_node("second")
  lost = in_flight_on_second()
  stored = run.stored_ids()
  assert lost and 1 <= len(stored) < len(drawn_ids)
  try:
    release = run.wait()
  finally:
    cluster.start_node("second")  # the module's cluster has two nodes again
  assert_same_release(release, run.params_out, local, digits)
  # Ray retried what the dead node was training, on the head, and every
  # candidate is stored once.
  retried = {i for e in run.tasks("end") if e["node"] == "head" for i in e["ids"]}
  assert set(lost) <= retried
  assert not {i for e in run.tasks("end") if e["node"] == "second" for i in e["ids"]} & set(lost)
  assert sorted(run.stored_ids()) == sorted(drawn_ids)


@pytest.mark.timeout(240)
def test_a_node_killed_mid_candidate_costs_only_the_rest_of_that_candidate(
    cluster, start_driver, local_long, long_ids, digits):
  run = start_driver("mid-candidate", 0.0, "--steps", str(LONG_STEPS), "--checkpoint-every",
                     str(LONG_EVERY))
  seen = {}  # the second node's candidate in flight -> the step of its newest complete checkpoint

  def checkpointed_on_second() -> bool:
    done = {i for e in run.tasks("end") for i in e["ids"]}
    for e in run.tasks("start"):
      for cid in e["ids"]:
        steps = _complete_steps(run.run_dir, cid)
        if e["node"] == "second" and cid not in done and steps:
          seen[cid] = max(steps)
    return bool(seen)

  _wait_for(checkpointed_on_second, "a checkpoint of a candidate in flight on the second node", run)
  cluster.kill_node("second")  # mid-candidate: it has a checkpoint, and the rest of its steps to go
  (cid, step), = seen.items()
  assert 0 < step < LONG_STEPS and cid not in run.stored_ids()
  try:
    release = run.wait()
  finally:
    cluster.start_node("second")  # the module's cluster has two nodes again
  assert_same_release(release, run.params_out, local_long, digits)
  # The second node never finished the candidate; Ray retried its task on the head, which
  # resumed it from the checkpoint seen at the kill (or a later one), not from step 0. Every
  # other candidate trained once, from the start, and every candidate is stored once.
  assert not [e for e in run.tasks("end") if e["node"] == "second" and cid in e["ids"]]
  assert release["resumed_steps"] == {cid: release["resumed_steps"][cid]}
  assert step <= release["resumed_steps"][cid] < LONG_STEPS
  resumed_at = {i: (e["node"], r) for e in run.tasks("end") for i, r in zip(e["ids"], e["resumed"])}
  assert resumed_at.pop(cid) == ("head", release["resumed_steps"][cid])
  assert sorted(resumed_at) == sorted(long_ids - {cid})
  assert all(r == 0 for _, r in resumed_at.values())
  starts = sorted(i for e in run.tasks("start") for i in e["ids"])
  assert starts == sorted([*long_ids, cid])
  assert sorted(run.stored_ids()) == sorted(long_ids)
  # Stored candidates keep no checkpoint (an unreleased state is as secret as the data).
  assert not [d for d in os.listdir(os.path.join(run.run_dir, "checkpoints")) if
              os.path.isdir(os.path.join(run.run_dir, "checkpoints", d))]
  # The driver's stderr: the backend's two lines, and no Ray output of the dead node's
  # workers or raylet (log_to_driver=False): only Ray's two lines of connecting to the cluster.
  lines = run.stderr.splitlines()
  lost = [line for line in lines if line.startswith("jaxdp: Ray node ")]
  assert len(lost) == 1 and "was lost; Ray retries the tasks it ran" in lost[0], run.stderr
  assert "from their candidates' checkpoints" in lost[0]
  # The resumed chunk's line says that it resumed, naming no candidate (an id hashes its key).
  assert any(line.startswith("jaxdp: a chunk's candidates resumed from their checkpoints")
             for line in lines), run.stderr
  assert cid not in run.stderr
  others = [line for line in lines if line.strip() and not line.startswith("jaxdp: ")]
  assert len(others) <= 4 and "Traceback" not in run.stderr, run.stderr
  assert not [line for line in others if "(raylet" in line or "pid=" in line], run.stderr
