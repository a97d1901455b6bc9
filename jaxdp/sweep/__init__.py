"""Many DP-SGD candidates at once: search spaces, batched training, a durable
result pool, and a simulator of private random searches over that pool."""

from jaxdp.sweep.engine import auto_candidates_per_device, host_device_flag, train_candidates
from jaxdp.sweep.pool import PoolLockedError, PoolMismatchError, ResultPool, record_of, run_sweep
from jaxdp.sweep.simulate import PoolTable, SimulationResult, simulate, table_from_records
from jaxdp.sweep.space import (Candidate, SearchSpace, candidate_id, candidate_key,
                               grid_candidates)

__all__ = [
    "Candidate", "PoolLockedError", "PoolMismatchError", "PoolTable", "ResultPool",
    "SearchSpace", "SimulationResult", "auto_candidates_per_device", "candidate_id", "candidate_key",
    "grid_candidates",
    "host_device_flag", "record_of", "run_sweep", "simulate", "table_from_records",
    "train_candidates",
]
