"""Accounting benchmark: prints one JSON object.

  python -m benchmarks.accounting

profile_epsilon_seconds: one `epsilon(..., method="profile")` on the DP-SGD
event (q = 256/60000, sigma = 1.1, T = 14063, geometric K with mean 10,
delta = 1e-5), cold: the PLD of the event is built inside the timed call.
profile_epsilon_warm_seconds: the same call again (PLD cached).
max_mean_seconds: `max_mean` for that base, geometric family, epsilon = 6,
method "profile" (cold PLD cache). Targets: < 2 s and < 20 s.
"""

from __future__ import annotations

import json
import platform
import time

from jaxdp import accounting as acc
from jaxdp.accounting import profiles


def _clear_caches():
  profiles._pld.cache_clear()  # pylint: disable=protected-access


def main() -> None:
  base = acc.dpsgd_event(256 / 60000, 1.1, 14063)
  event = acc.RepeatAndSelect(base, acc.Geometric(mean=10))

  _clear_caches()
  t0 = time.perf_counter()
  eps = acc.epsilon(event, 1e-5, method="profile")
  cold = time.perf_counter() - t0
  t0 = time.perf_counter()
  acc.epsilon(event, 1e-5, method="profile")
  warm = time.perf_counter() - t0

  t0 = time.perf_counter()
  eps_rdp = acc.epsilon(event, 1e-5, method="rdp")
  rdp_seconds = time.perf_counter() - t0

  _clear_caches()
  t0 = time.perf_counter()
  mean = acc.max_mean(base, "geometric", 6.0, 1e-5, method="profile")
  max_mean_seconds = time.perf_counter() - t0

  print(json.dumps({
      "profile_epsilon_seconds": round(cold, 4),
      "profile_epsilon_warm_seconds": round(warm, 4),
      "profile_epsilon": round(eps, 6),
      "rdp_epsilon_seconds": round(rdp_seconds, 4),
      "rdp_epsilon": round(eps_rdp, 6),
      "max_mean_seconds": round(max_mean_seconds, 4),
      "max_mean": round(mean, 4),
      "event": "DP-SGD q=256/60000 sigma=1.1 T=14063, K~Geometric(mean=10), delta=1e-5",
      "max_mean_query": "geometric, epsilon=6, delta=1e-5, method=profile",
      "python": platform.python_version(),
      "machine": platform.machine(),
  }))


if __name__ == "__main__":
  main()
