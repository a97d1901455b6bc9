"""What a durable pool stores of a task's trained candidate, and the digests that fingerprint its
inputs: the record format, kept apart from the plan that says what runs."""

from __future__ import annotations

import hashlib
from typing import Any, Mapping

import jax
import numpy as np

from jaxdp.data import Dataset
from jaxdp.sweep.space import Candidate
from jaxdp.train import digest as digest_lib
from jaxdp.train.run_plan import RunPlan
from jaxdp.train.trainer import CandidateResult


def event_record(run: RunPlan) -> str:
  """A run's DpEvent as pools store it: its repr, object addresses scrubbed (deterministic
  across processes: the events are attrs classes of numbers)."""
  return digest_lib.scrub(repr(run.dp_event))


def result_fields(result: CandidateResult) -> dict:
  """What a pool record keeps of a `CandidateResult` (not its parameters)."""
  return {"score": result.score, "test_score": result.test_score, "test_loss": result.test_loss,
          "score_source": result.score_source, "steps": result.steps,
          "planned_steps": result.planned_steps, "diverged": result.diverged,
          "epsilon": result.epsilon, "delta": result.delta, "wall_time_s": result.wall_time_s,
          "resumed_step": result.resumed_step}


def record_of(candidate: Candidate, result: CandidateResult, run: RunPlan) -> dict:
  """The pool record of a task's trained candidate that ran `run` (no parameters)."""
  return {"id": candidate.id, "point": dict(candidate.point), "seed": candidate.seed,
          **result_fields(result), "dp_event": event_record(run)}


def result_from_record(record: Mapping[str, Any], params: Any) -> CandidateResult:
  """The `CandidateResult` a pool record stands for (compile time is not stored: 0.0)."""
  return CandidateResult(
      score=float(record["score"]), test_score=float(record["test_score"]),
      test_loss=float(record["test_loss"]), steps=int(record["steps"]),
      planned_steps=int(record["planned_steps"]), epsilon=float(record["epsilon"]),
      delta=float(record["delta"]), diverged=bool(record["diverged"]),
      wall_time_s=float(record["wall_time_s"]), score_source=record["score_source"],
      resumed_step=int(record.get("resumed_step", 0)), params=params)


def data_fingerprint(data: Dataset) -> dict:
  """sha256 of every split's arrays (structure, shapes, dtypes, bytes) and the declared size."""
  digest = hashlib.sha256()
  for name in ("train", "test", "private_validation"):
    split = getattr(data, name)
    digest.update(name.encode())
    if split is None:
      continue
    leaves, treedef = jax.tree_util.tree_flatten(split)
    digest.update(str(treedef).encode())
    for leaf in leaves:
      leaf = np.ascontiguousarray(np.asarray(leaf))
      digest.update(f"{leaf.dtype}{leaf.shape}".encode())
      digest.update(leaf.tobytes())
  return {"sha256": digest.hexdigest(), "num_examples": data.num_examples}


def params_digest(tree: Any) -> str:
  """sha256 of a parameter tree: its paths, dtypes, shapes and bytes."""
  digest = hashlib.sha256()
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    leaf = np.ascontiguousarray(np.asarray(leaf))
    digest.update(f"{jax.tree_util.keystr(path)}{leaf.dtype}{leaf.shape}".encode())
    digest.update(leaf.tobytes())
  return digest.hexdigest()
