"""Accounting benchmark: prints one JSON object.

  python -m benchmarks.accounting [--quick] [--steps T] [--mean M]

Default event: DP-SGD with q = 256/60000, sigma = 1.1, T = 14063 steps
(60 epochs: `dpsgd_steps(60, q)`), K ~ Geometric(mean 10), delta = 1e-5
(Papernot-Steinke's MNIST setting).

profile_epsilon_seconds: the first `epsilon(..., method="profile")` of this
  process, so the event's privacy loss distribution is built inside the timed
  call (cold). Target at the default size: <= 0.3 s.
profile_epsilon_warm_seconds: the same call again (whatever the accounting
  package caches is now warm).
max_mean_seconds: `max_mean` for the same base, geometric family,
  epsilon = 6, method "profile", measured cold in a fresh subprocess.
  Target at the default size: < 2 s.
plan_seconds: `plan` for the same base (the table of `jaxdp account --plan`:
  per family of K, the largest E[K] within the budget), epsilon = 8 (0.5 with
  `--quick`), method "best", measured cold in a fresh subprocess; `plan` is
  the table it found. Target at the default size: <= 2 s (the whole
  `jaxdp account --base dpsgd:q=0.004267,sigma=1.1,epochs=60 --plan 8`
  adds ~1 s of Python and JAX imports).

Before -> after the accounting speed-ups (issue 15, item 4), medians of 3 on
a 2-core machine shared with other jobs: profile_epsilon_seconds 0.317 ->
0.143, max_mean_seconds 1.05 -> 0.20, plan 11.0 -> 1.32 s (the CLI command
above: 12.0 -> 2.2 s wall), with the same numbers (see that commit).

Only the public names of `jaxdp.accounting` are used (`dpsgd_event`,
`RepeatAndSelect`, `Geometric`, `epsilon`, `max_mean`, `plan`): clearing a
private cache would tie the benchmark to internals that change, so "cold"
means "first call in a fresh process" instead. `--quick` (T = 200) finishes
in seconds; the tests run it to keep the script from rotting.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

DEFAULT_STEPS = 14063
QUICK_STEPS = 200
DEFAULT_PLAN_EPSILON = 8.0
# A small budget keeps the quick plan's fixed-K search short (k = 3, not ~600).
QUICK_PLAN_EPSILON = 0.5


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=None, help=f"DP-SGD steps T (default {DEFAULT_STEPS})")
  parser.add_argument("--quick", action="store_true", help=f"tiny run: T = {QUICK_STEPS} unless --steps is given")
  parser.add_argument("--sampling-prob", type=float, default=256 / 60000)
  parser.add_argument("--noise-multiplier", type=float, default=1.1)
  parser.add_argument("--mean", type=float, default=10.0, help="mean of the geometric K")
  parser.add_argument("--target-epsilon", type=float, default=6.0, help="epsilon of the max_mean query")
  parser.add_argument("--plan-epsilon", type=float, default=None,
                      help=f"epsilon of the plan query (default {DEFAULT_PLAN_EPSILON:g}, "
                           f"{QUICK_PLAN_EPSILON:g} with --quick)")
  parser.add_argument("--delta", type=float, default=1e-5)
  parser.add_argument("--part", choices=("all", "max_mean", "plan"), default="all",
                      help=argparse.SUPPRESS)  # internal: the cold subprocesses
  return parser


def _timed(fn):
  t0 = time.perf_counter()
  value = fn()
  return value, time.perf_counter() - t0


def _max_mean(args) -> dict:
  from jaxdp import accounting as acc  # pylint: disable=g-import-not-at-top
  base = acc.dpsgd_event(args.sampling_prob, args.noise_multiplier, args.steps)
  mean, seconds = _timed(lambda: acc.max_mean(base, "geometric", args.target_epsilon, args.delta,
                                              method="profile"))
  return {"max_mean_seconds": round(seconds, 4), "max_mean": round(float(mean), 4)}


def _plan(args) -> dict:
  from jaxdp import accounting as acc  # pylint: disable=g-import-not-at-top
  base = acc.dpsgd_event(args.sampling_prob, args.noise_multiplier, args.steps)
  table, seconds = _timed(lambda: acc.plan(base, args.plan_epsilon, args.delta, method="best"))
  rows = [{"family": r.family, "max_mean": r.max_mean, "epsilon": r.epsilon} for r in table.rows]
  return {"plan_seconds": round(seconds, 4), "plan": rows}


def _cold(part: str, args) -> dict:
  """`_max_mean` or `_plan` in a fresh interpreter, so nothing is cached from this one."""
  cmd = [sys.executable, os.path.abspath(__file__), "--part", part, "--steps", str(args.steps),
         "--sampling-prob", repr(args.sampling_prob), "--noise-multiplier", repr(args.noise_multiplier),
         "--target-epsilon", repr(args.target_epsilon), "--plan-epsilon", repr(args.plan_epsilon),
         "--delta", repr(args.delta)]
  import jaxdp  # pylint: disable=g-import-not-at-top
  # The child must import the same jaxdp as this process (a checkout may
  # shadow an installed copy), so put this one's root first on its path.
  root = os.path.dirname(os.path.dirname(os.path.abspath(jaxdp.__file__)))
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
  proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
  if proc.returncode != 0:
    raise RuntimeError(f"cold {part} subprocess failed ({proc.returncode}):\n{proc.stderr}")
  return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
  args = _parser().parse_args(argv)
  if args.steps is None:
    args.steps = QUICK_STEPS if args.quick else DEFAULT_STEPS
  if args.plan_epsilon is None:
    args.plan_epsilon = QUICK_PLAN_EPSILON if args.quick else DEFAULT_PLAN_EPSILON
  if args.part != "all":
    print(json.dumps(_max_mean(args) if args.part == "max_mean" else _plan(args)))
    return 0

  from jaxdp import accounting as acc  # pylint: disable=g-import-not-at-top
  base = acc.dpsgd_event(args.sampling_prob, args.noise_multiplier, args.steps)
  event = acc.RepeatAndSelect(base, acc.Geometric(mean=args.mean))
  eps, cold = _timed(lambda: acc.epsilon(event, args.delta, method="profile"))
  _, warm = _timed(lambda: acc.epsilon(event, args.delta, method="profile"))
  eps_rdp, rdp_seconds = _timed(lambda: acc.epsilon(event, args.delta, method="rdp"))
  max_mean = _cold("max_mean", args)
  plan = _cold("plan", args)

  print(json.dumps({
      "profile_epsilon_seconds": round(cold, 4),
      "profile_epsilon_warm_seconds": round(warm, 4),
      "profile_epsilon": round(float(eps), 6),
      "rdp_epsilon_seconds": round(rdp_seconds, 4),
      "rdp_epsilon": round(float(eps_rdp), 6),
      "max_mean_seconds": max_mean["max_mean_seconds"],
      "max_mean": max_mean["max_mean"],
      "plan_seconds": plan["plan_seconds"],
      "plan": plan["plan"],
      "event": (f"DP-SGD q={args.sampling_prob:.6g} sigma={args.noise_multiplier:g} T={args.steps}, "
                f"K~Geometric(mean={args.mean:g}), delta={args.delta:g}"),
      "max_mean_query": f"geometric, epsilon={args.target_epsilon:g}, delta={args.delta:g}, method=profile",
      "plan_query": f"epsilon={args.plan_epsilon:g}, delta={args.delta:g}, method=best",
      "quick": bool(args.quick),
      "python": platform.python_version(),
      "machine": platform.machine(),
  }))
  return 0


if __name__ == "__main__":
  sys.exit(main())
