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

calibration: for each law of K in `--calibration-laws` (default Poisson,
  geometric and TNB(0.5), all with mean 3), the noise multiplier sigma that
  brings a whole search to epsilon = 2 at delta = 1e-5 by method "best":
  DP-SGD at q = 64/350 for 55 steps (10 epochs of the search in docs/guides/tune_your_own_model.md)
  composed with a NoisyMean DP score (a Gaussian, noise multiplier 5), best
  of K (`noise_for`, what `target_epsilon=` runs before a search trains).
  `seconds` is cold (a fresh subprocess); `sigma` is the answer and
  `epsilon` its re-accounting by a fresh "best" accountant. `baseline_*` is
  dp-accounting's `calibrate_dp_mechanism` (Brent's method) run on jaxdp's
  "best" accountant over the bracket [sigma_rdp / 2, sigma_rdp] that the RDP
  answer gives: every step accounts every method, as jaxdp did before issue
  25 (also cold). Target: `seconds` <= 2.

Before -> after the accounting speed-ups (issue 15, item 4), medians of 3 on
a 2-core machine shared with other jobs: profile_epsilon_seconds 0.317 ->
0.143, max_mean_seconds 1.05 -> 0.20, plan 11.0 -> 1.32 s (the CLI command
above: 12.0 -> 2.2 s wall), with the same numbers (see that commit).

Only the public names of `jaxdp.accounting` are used (`dpsgd_event`,
`RepeatAndSelect`, `Geometric`, `epsilon`, `max_mean`, `plan`, `noise_for`,
`make_accountant`): clearing a
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
  parser.add_argument("--calibration-laws", default=None,
                      help="laws of K (mean 3) for the calibration rows, comma-separated, from poisson, "
                           "geometric, tnb-0.5 (default all three; geometric with --quick)")
  parser.add_argument("--part", default="all", help=argparse.SUPPRESS)  # internal: the cold subprocesses
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


CALIBRATION_TARGET, CALIBRATION_MEAN = 2.0, 3.0


def _search_event(law: str):
  """sigma -> the README-sized search's event under K ~ `law` (see the module docstring)."""
  import dp_accounting as dpa  # pylint: disable=g-import-not-at-top
  from jaxdp import accounting as acc  # pylint: disable=g-import-not-at-top
  dist = {"poisson": lambda: acc.Poisson(mean=CALIBRATION_MEAN),
          "geometric": lambda: acc.Geometric(mean=CALIBRATION_MEAN),
          "tnb-0.5": lambda: acc.TruncatedNegativeBinomial(0.5, mean=CALIBRATION_MEAN)}[law]()
  score = dpa.GaussianDpEvent(5.0)  # NoisyMean(..., noise_multiplier=5.0).event
  return lambda sigma: acc.RepeatAndSelect(dpa.ComposedDpEvent([acc.dpsgd_event(64 / 350, sigma, 55), score]),
                                           dist)


def _calibration(law: str, args, baseline: bool) -> dict:
  import dp_accounting as dpa  # pylint: disable=g-import-not-at-top
  from jaxdp import accounting as acc  # pylint: disable=g-import-not-at-top
  make = _search_event(law)
  if baseline:
    def find():
      rough = acc.noise_for(make, CALIBRATION_TARGET, args.delta, method="rdp")
      calibration = dpa.mechanism_calibration
      return calibration.calibrate_dp_mechanism(
          lambda: acc.make_accountant("best"), make, CALIBRATION_TARGET, args.delta,
          calibration.ExplicitBracketInterval(rough / 2, rough), tol=1e-3 * rough)
  else:
    find = lambda: acc.noise_for(make, CALIBRATION_TARGET, args.delta)
  sigma, seconds = _timed(find)
  return {"seconds": round(seconds, 4), "sigma": sigma, "epsilon": acc.epsilon(make(sigma), args.delta)}


def _cold(part: str, args) -> dict:
  """`_max_mean` or `_plan` in a fresh interpreter, so nothing is cached from this one."""
  cmd = [sys.executable, os.path.abspath(__file__), "--part", part, "--steps", str(args.steps),
         "--calibration-laws", args.calibration_laws,
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
  if args.calibration_laws is None:
    args.calibration_laws = "geometric" if args.quick else "poisson,geometric,tnb-0.5"
  if args.part != "all":
    if args.part.startswith("calibration:"):  # calibration:<law>:<ours|baseline>
      _, law, which = args.part.split(":")
      print(json.dumps(_calibration(law, args, which == "baseline")))
    else:
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
  calibration = []
  for law in args.calibration_laws.split(","):
    ours, base = _cold(f"calibration:{law}:ours", args), _cold(f"calibration:{law}:baseline", args)
    calibration.append({"law": f"{law} (mean {CALIBRATION_MEAN:g})", **ours,
                        **{f"baseline_{k}": v for k, v in base.items()},
                        "speedup": round(base["seconds"] / ours["seconds"], 2)})

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
      "calibration": calibration,
      "calibration_query": (f"DP-SGD q=64/350 T=55 composed with Gaussian(5) (NoisyMean), best of K, "
                            f"epsilon={CALIBRATION_TARGET:g}, delta={args.delta:g}, method=best"),
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
