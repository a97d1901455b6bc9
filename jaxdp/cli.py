"""The `jaxdp` command line.

  jaxdp account --base dpsgd:q=256/60000,sigma=1.1,epochs=60 \
                --repeat poisson:mean=10 --delta 1e-5 [--method rdp] [--json]
  jaxdp account --base dpsgd:q=256/60000,sigma=1.1,epochs=60 --plan 8
  jaxdp account --base dpsgd:q=256/60000,sigma=1.1,epochs=30 --repeat geometric:mean=10 --cross-check
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import sys
from typing import Optional, Sequence

import dp_accounting as dpa

from jaxdp import _validate as acc_validate
from jaxdp import accounting as acc

_BASE_HELP = """\
base mechanism (one candidate run), NAME:key=value,...
  dpsgd:q=Q,sigma=S,steps=T     DP-SGD: T steps of the Poisson-subsampled
                                Gaussian (sampling rate Q, noise multiplier S);
                                Q in (0, 1], or b/N: expected batch b of N
                                examples, 0 < b <= N (q=256/60000 is exactly
                                256 / 60000, as in Python); epochs=E may
                                replace steps (steps = ceil(E/Q), the
                                trainer's rule, jaxdp.accounting.dpsgd_steps)
  gaussian:sigma=S              Gaussian mechanism, noise multiplier S
  pure:eps=E                    pure E-DP
  zcdp:rho=R                    R-zero-concentrated DP"""

_REPEAT_HELP = """\
distribution of the number of runs K, NAME:key=value,... (omit for one run)
  poisson:mean=M                Poisson, M > 0
  tnb:eta=H,mean=M              truncated negative binomial, H > -1, M > 1
  tnb:eta=H,gamma=G             ... given by its gamma in (0, 1)
  geometric:mean=M              geometric (tnb with eta=1), M > 1
  logarithmic:mean=M            logarithmic (tnb with eta=0), M > 1
  binomial:n=N,p=P              binomial, N >= 1, P in (0, 1]
  fixed:k=K                     exactly K runs (naive repetition)"""


def _parse_spec(spec: str, what: str) -> tuple[str, dict]:
  name, _, rest = spec.partition(":")
  params = {}
  for item in filter(None, rest.split(",")):
    key, sep, value = item.partition("=")
    if not sep:
      raise ValueError(f"--{what}: expected key=value in {spec!r}, got {item!r}")
    key = key.strip()
    if "/" in value and key == "q":
      params[key] = _fraction(f"{what} {name.strip().lower()}", key, value)
      continue
    try:
      params[key] = float(value)
    except ValueError:
      raise ValueError(f"--{what}: {key}={value!r} is not a number") from None
  return name.strip().lower(), params


def _fraction(what: str, key: str, value: str) -> float:
  """q=b/N as the Python float b / N: the rate a Python user writes as 256 / 60000.

  A rounded decimal (0.004267) is a different rate, hence a different step
  count and epsilon from the Python example's.
  """
  num, _, den = value.partition("/")
  valid = "a rate in (0, 1] or a fraction b/N of an expected batch b and a data set size N, 0 < b <= N"
  try:
    b, n = float(num), float(den)
  except ValueError:
    raise ValueError(f"--{what}: {key}={value!r} is not a number; {key} must be {valid}") from None
  if not (math.isfinite(b) and math.isfinite(n) and 0 < b <= n):
    raise ValueError(f"--{what}: {key}={value!r} (b={b:g}, N={n:g}) is out of range; {key} must be {valid}")
  return b / n


def _build(spec: str, what: str, builders: dict) -> object:
  name, params = _parse_spec(spec, what)
  if name not in builders:
    raise ValueError(f"--{what}: unknown name {name!r}; valid: {', '.join(builders)}")
  fn, required, optional = builders[name]
  allowed = set(required) | set(optional)
  unknown = set(params) - allowed
  missing = set(required) - set(params)
  if unknown or missing:
    raise ValueError(f"--{what} {name}: takes {', '.join(sorted(allowed))}"
                     + (f"; unknown {sorted(unknown)}" if unknown else "")
                     + (f"; missing {sorted(missing)}" if missing else ""))
  return fn(**params)


def _dpsgd(q, sigma, steps=None, epochs=None):
  q = acc_validate.probability("q", q, one_ok=True)
  if (steps is None) == (epochs is None):
    raise ValueError("--base dpsgd: give exactly one of steps or epochs")
  steps = acc.dpsgd_steps(epochs, q) if steps is None else acc_validate.integer("steps", steps, low=1)
  return acc.dpsgd_event(q, acc_validate.real("sigma", sigma, low=0.0, low_open=True), steps)


def _gaussian(sigma):
  return dpa.GaussianDpEvent(acc_validate.real("sigma", sigma, low=0.0, low_open=True))


_BASES: dict = {
    "dpsgd": (_dpsgd, ("q", "sigma"), ("steps", "epochs")),
    "gaussian": (_gaussian, ("sigma",), ()),
    "pure": (lambda eps: acc.PureDp(eps), ("eps",), ()),
    "zcdp": (lambda rho: acc.Zcdp(rho), ("rho",), ()),
}

_REPEATS: dict = {
    "poisson": (lambda mean: acc.Poisson(mean), ("mean",), ()),
    "tnb": (lambda eta, mean=None, gamma=None: acc.TruncatedNegativeBinomial(eta, mean=mean, gamma=gamma),
            ("eta",), ("mean", "gamma")),
    "geometric": (lambda mean=None, gamma=None: acc.Geometric(mean, gamma=gamma), (), ("mean", "gamma")),
    "logarithmic": (lambda mean=None, gamma=None: acc.Logarithmic(mean, gamma=gamma), (), ("mean", "gamma")),
    "binomial": (lambda n, p: acc.Binomial(acc_validate.integer("n", n, low=1), p), ("n", "p"), ()),
    "fixed": (lambda k: acc.Fixed(acc_validate.integer("k", k, low=1)), ("k",), ()),
}


def _parse_orders(text: Optional[str]):
  if text is None:
    return None
  try:
    return [float(x) for x in text.split(",") if x.strip()]
  except ValueError:
    raise ValueError(f"--orders must be comma-separated numbers, got {text!r}") from None


def _account(args) -> int:
  base = _build(args.base, "base", _BASES)
  orders = _parse_orders(args.orders)
  refined = args.allow_refined
  if args.plan is not None:
    if args.repeat or args.epsilon is not None or args.cross_check:
      raise ValueError("--plan chooses the distribution of K for a budget itself; drop --repeat/--epsilon/--cross-check")
    delta = 1e-5 if args.delta is None else args.delta
    acc_validate.real("--plan", args.plan, low=0.0, low_open=True)
    result = acc.plan(base, epsilon=args.plan, delta=delta, method=args.method or "best",
                      allow_refined=refined)
    print(result.to_json() if args.json else str(result))
    return 0
  event = acc.RepeatAndSelect(base, _build(args.repeat, "repeat", _REPEATS)) if args.repeat else base
  header = {"base": args.base, "repeat": args.repeat, "orders": "custom" if orders else "default"}
  if args.cross_check:
    if args.method is not None or args.epsilon is not None:
      raise ValueError("--cross-check shows every method's epsilon at --delta: drop --method/--epsilon")
    check = acc.cross_check(event, 1e-5 if args.delta is None else args.delta, orders,
                            allow_refined=refined)
    print(json.dumps(dict(header, **check.to_dict()), indent=2) if args.json else str(check))
    return 0
  if args.epsilon is not None:
    method = args.method or "best"
    value = acc.delta(event, args.epsilon, method=method, orders=orders, allow_refined=refined)
    out = dict(header, epsilon=args.epsilon, method=method, delta=value)
    print(json.dumps(out, indent=2) if args.json else f"delta = {acc.format_delta(value, '.6g')}  ({method})")
    return 0
  delta = 1e-5 if args.delta is None else args.delta
  if args.method is None:
    rep = acc.report(event, delta, orders=orders, allow_refined=refined)
    print(json.dumps(dict(header, **rep.to_dict()), indent=2, default=str) if args.json else str(rep))
    return 0
  value = acc.epsilon(event, delta, method=args.method, orders=orders, allow_refined=refined)
  out = dict(header, delta=delta, method=args.method, epsilon=value)
  print(json.dumps(out, indent=2) if args.json else (f"epsilon = {acc.format_epsilon(value, '.6g')}  "
                                                     f"({args.method}, delta={acc.format_delta(delta)})"))
  return 0


_FIGURES = {
    "fig7": ("jaxdp.experiments.fig7", "Papernot-Steinke Fig. 7: DP-SGD learning-rate search, accuracy vs epsilon"),
    "kk-fig7": ("jaxdp.experiments.kk_fig7", "Koskela-Kulkarni Fig. 7: tuning on a subset vs Papernot-Steinke"),
    "kk-fig1": ("jaxdp.experiments.kk_fig1", "Koskela-Kulkarni Fig. 1: epsilon vs subset rate q"),
    "fig1": ("jaxdp.experiments.fig1", "Papernot-Steinke Fig. 1: a tuned SVM hyperparameter reveals outliers"),
    "analytic": ("jaxdp.experiments.analytic_figures", "Papernot-Steinke Figs. 2-6 (pure accounting)"),
    "profiles": ("jaxdp.experiments.profile_figures", "Koskela-Redberg-Wang figures (pure accounting)"),
}


def _reproduce(args) -> int:
  import importlib  # pylint: disable=g-import-not-at-top
  module = importlib.import_module(_FIGURES[args.figure][0])
  return module.main(args.rest)


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="jaxdp", description="Differentially private hyperparameter tuning in JAX.")
  parser.add_argument("--version", action="version", version=f"jaxdp {importlib.metadata.version('jaxdp')}")
  sub = parser.add_subparsers(dest="command", required=True)
  p = sub.add_parser(
      "account", formatter_class=argparse.RawTextHelpFormatter,
      help="(epsilon, delta) of repeat-and-select tuning",
      description="Privacy of running a DP training K times and releasing only the best run.\n"
                  "Without --method, prints every method and marks the one 'best' uses.\n"
                  "With --plan EPS, prints for each family of K the most candidates EPS affords.\n"
                  "With --cross-check, prints every method beside dp_accounting's own RDP and PLD.",
      epilog="examples (60 epochs of MNIST, expected batch 256 of 60000):\n"
             "  jaxdp account --base dpsgd:q=256/60000,sigma=1.1,epochs=60 "
             "--repeat poisson:mean=10 --delta 1e-5\n"
             "  jaxdp account --base dpsgd:q=256/60000,sigma=1.1,epochs=60 --plan 8")
  p.add_argument("--base", required=True, metavar="SPEC", help=_BASE_HELP)
  p.add_argument("--repeat", metavar="SPEC", help=_REPEAT_HELP)
  target = p.add_mutually_exclusive_group()
  target.add_argument("--delta", type=float, help="target delta in (0, 1) (default 1e-5); prints epsilon")
  target.add_argument("--epsilon", type=float, help="target epsilon >= 0; prints delta instead")
  p.add_argument("--plan", type=float, metavar="EPS",
                 help="budget epsilon > 0: per family of K (Poisson, geometric, logarithmic,\n"
                      "TNB eta=0.5, fixed), at --delta (default 1e-5):\n"
                      "  max E[K]: the largest expected number of candidates for which the\n"
                      "    whole search still meets the budget (fixed: the largest k); an\n"
                      "    upper limit, not advice (check your own mean with --repeat)\n"
                      "  P(K=0): the chance that the search draws no candidate, releasing nothing\n"
                      "  E[quantile]: the released run's expected quantile among the candidates'\n"
                      "    scores (higher is better)\n"
                      "  epsilon: the whole search's epsilon at max E[K] (at most the budget)")
  p.add_argument("--method", choices=acc.ALL_METHODS,
                 help="accounting method; 'best' takes the minimum over all that apply")
  p.add_argument("--cross-check", action="store_true",
                 help="every jaxdp method's epsilon beside dp_accounting's own RDP and PLD\n"
                      "accountants (where they accept the event), with the theorem each is\n"
                      "and the tests that hold it to exact computations")
  p.add_argument("--allow-refined", action="store_true",
                 help="let 'best' use 'profile-refined' (opt-in: its c(eps1) is derived in\n"
                      "jaxdp, not taken from the paper)")
  p.add_argument("--orders", metavar="LIST", help="comma-separated RDP orders > 1 (default: dp-accounting's grid)")
  p.add_argument("--json", action="store_true", help="print a JSON object")
  p.set_defaults(func=_account)
  r = sub.add_parser(
      "reproduce", formatter_class=argparse.RawTextHelpFormatter,
      help="reproduce a figure of the papers (PNG, PDF, CSV, JSON)",
      description="Reproduce a figure; options after the figure name go to its script\n"
                  "(e.g. --profile quick|paper, --out DIR; see `jaxdp reproduce FIGURE --help`).\n\n"
                  + "\n".join(f"  {k:<9} {v[1]}" for k, v in _FIGURES.items()))
  r.add_argument("figure", choices=list(_FIGURES))
  r.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for the figure's script")
  r.set_defaults(func=_reproduce)
  a = sub.add_parser(
      "audit", add_help=False, formatter_class=argparse.RawTextHelpFormatter,
      help="empirical epsilon lower bound vs accounted epsilon of whole private searches",
      description="Options go to jaxdp.experiments.audit; see `jaxdp audit --help`.")
  a.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for the audit (--profile, --out)")
  return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  if argv[:1] == ["audit"]:
    # argparse's REMAINDER drops a leading --option, so the audit parses its own.
    from jaxdp.experiments import audit  # pylint: disable=g-import-not-at-top
    return audit.main(argv[1:])
  parser = build_parser()
  args = parser.parse_args(argv)
  try:
    return args.func(args)
  except ValueError as err:
    print(f"jaxdp {args.command}: error: {err}", file=sys.stderr)
    return 2


if __name__ == "__main__":
  sys.exit(main())
