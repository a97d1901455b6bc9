"""Many DP-SGD candidates at once: search spaces, the plan of a search (a task's or any training
function's), batched training and trainers, the durable store of trained candidates and their
checkpoints, and a simulator of private random searches over its pool."""

from jaxdp.sweep.build import build_plan
from jaxdp.sweep.engine import auto_candidates_per_device, host_device_flag, train_candidates
from jaxdp.sweep.functions import FunctionPlan, TrainFunction, TrainFunctionError
from jaxdp.sweep.plan import SearchPlan
from jaxdp.sweep.pool import PoolLockedError, PoolMismatchError, ResultPool, SearchMismatchError
from jaxdp.sweep.records import record_of
from jaxdp.sweep.simulate import PoolTable, SimulationResult, simulate, table_from_records
from jaxdp.sweep.space import (Candidate, SearchSpace, candidate_id, candidate_key,
                               grid_candidates)
from jaxdp.sweep.store import CandidateStore, run_sweep
from jaxdp.sweep.task_plan import TaskPlan
from jaxdp.sweep.trainers import LocalTrainer, RayTrainer, Trainer

__all__ = [
    "Candidate", "CandidateStore", "FunctionPlan", "LocalTrainer", "PoolLockedError",
    "PoolMismatchError", "PoolTable", "RayTrainer", "ResultPool", "SearchMismatchError",
    "SearchPlan", "SearchSpace", "SimulationResult", "TaskPlan", "TrainFunction",
    "TrainFunctionError", "Trainer", "auto_candidates_per_device", "build_plan", "candidate_id",
    "candidate_key", "grid_candidates", "host_device_flag", "record_of", "run_sweep", "simulate",
    "table_from_records", "train_candidates",
]
