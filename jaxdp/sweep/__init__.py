"""Many DP-SGD candidates at once: search spaces, the plan of a search, batched training,
the durable store of trained candidates and their checkpoints, a simulator of private
random searches over its pool, and any training function as a search's candidates
(`functions`, `artifacts`)."""

from jaxdp.sweep.engine import auto_candidates_per_device, host_device_flag, train_candidates
from jaxdp.sweep.functions import FunctionPlan, TrainFunctionError, train_functions
from jaxdp.sweep.plan import SearchPlan
from jaxdp.sweep.pool import PoolLockedError, PoolMismatchError, ResultPool, SearchMismatchError
from jaxdp.sweep.store import CandidateStore, record_of, run_sweep
from jaxdp.sweep.simulate import PoolTable, SimulationResult, simulate, table_from_records
from jaxdp.sweep.space import (Candidate, SearchSpace, candidate_id, candidate_key,
                               grid_candidates)

__all__ = [
    "Candidate", "CandidateStore", "FunctionPlan", "PoolLockedError", "PoolMismatchError", "PoolTable", "ResultPool",
    "SearchMismatchError", "SearchPlan", "SearchSpace", "SimulationResult", "auto_candidates_per_device", "candidate_id", "candidate_key",
    "grid_candidates",
    "host_device_flag", "record_of", "run_sweep", "simulate", "table_from_records",
    "train_candidates", "train_functions", "TrainFunctionError",
]
