"""epsilon / delta / report for one-run guarantees and repeat-and-select events.

Each accounting *method* turns an event into a `Guarantee` of the whole
mechanism, or says it does not apply (`NotApplicableError`):

  * ``"rdp"``: Papernot & Steinke RDP bounds (Thm 2, Cor 3, Cor 4, Thm 6,
    numerical Lemma 7 with the K=0 atom), converted to (eps, delta) by
    dp-accounting's conversion (Canonne-Kamath-Steinke, with the KL bound).
  * ``"composition"``: composition of the K runs as if every run were released.
  * ``"profile"``: Koskela-Redberg-Wang privacy-profile bounds (`profile_selection`).
  * ``"profile-refined"``: the same with a tighter, derived c(eps1); used by
    "best" only with ``allow_refined=True``.
  * ``"liu-talwar"``: Liu & Talwar's bounds (threshold / random stopping, pure-DP base).
  * ``"best"``: the smallest epsilon (or delta) over all methods that apply.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Optional, Sequence

import dp_accounting as dpa
import numpy as np

from jaxdp import _validate
from jaxdp.accounting import distributions as dist_lib
from jaxdp.accounting import guarantees as g_lib
from jaxdp.accounting import liu_talwar as lt_lib
from jaxdp.accounting import profile_selection as ps_lib
from jaxdp.accounting import rdp_selection as rs
from jaxdp.accounting import subsampled as ss
from jaxdp.accounting.events import RepeatAndSelect, check_base

_rdp_lib = dpa.rdp.rdp_privacy_accountant


class NotApplicableError(ValueError):
  """The requested method has no theorem covering this event."""


@dataclasses.dataclass(frozen=True, eq=False)
class Guarantee:
  """An RDP curve of a whole mechanism, optionally also a pure-DP epsilon.

  Attributes:
    orders: RDP orders (ascending, all > 1).
    rdp: RDP values at `orders` (may be +inf).
    theorem: which result produced the curve, for reports.
    pure_epsilon: if set, the mechanism is also (pure_epsilon, 0)-DP.
  """

  orders: np.ndarray
  rdp: np.ndarray
  theorem: str
  pure_epsilon: Optional[float] = None

  def epsilon(self, delta: float) -> float:
    eps = float(_rdp_lib.compute_epsilon(self.orders, self.rdp, delta)[0])
    if self.pure_epsilon is not None:
      eps = min(eps, self.pure_epsilon)
    # dp-accounting's two conversions can disagree in the last bits: round eps up
    # until the delta conversion confirms it, so epsilon and delta stay inverses.
    step = max(abs(eps), 1e-12) * 2e-16
    for _ in range(64):
      if not math.isfinite(eps) or self.delta(eps) <= delta:
        break
      eps, step = eps + step, 2 * step
    return eps

  def delta(self, epsilon: float) -> float:
    if self.pure_epsilon is not None and epsilon >= self.pure_epsilon:
      return 0.0
    return float(_rdp_lib.compute_delta(self.orders, self.rdp, epsilon)[0])


def _check_event(event):
  # ThresholdSelect and SubsampledTuning validated their parts when built.
  if not isinstance(event, (lt_lib.ThresholdSelect, ss.SubsampledTuning)):
    check_base(event)
  return event


def _grid(event, orders) -> np.ndarray:
  """The order grid: integers for subset tuning (its bounds expand binomial sums)."""
  if isinstance(event, ss.SubsampledTuning):
    return ss.check_integer_orders(orders)
  return g_lib.check_orders(orders)


def _base_curve(base, orders: np.ndarray) -> tuple[np.ndarray, Optional[float]]:
  """RDP of one run on `orders`, and its pure-DP epsilon if it has one."""
  if isinstance(base, RepeatAndSelect):
    inner = _guarantee(base, orders, "rdp")
    rdp = inner.rdp
    if inner.pure_epsilon is not None:
      rdp = np.minimum(rdp, g_lib.PureDp(inner.pure_epsilon).rdp(orders))
    return rdp, inner.pure_epsilon
  if isinstance(base, ss.UniformCandidates):  # KK Lemma 1: the pointwise worst candidate
    curves = [_base_curve(c, orders) for c in base.candidates]
    pures = [p for _, p in curves]
    return (np.max([c for c, _ in curves], axis=0),
            None if any(p is None for p in pures) else max(pures))
  if isinstance(base, g_lib.PLAIN_GUARANTEES):
    return base.rdp(orders), (base.epsilon if isinstance(base, g_lib.PureDp) else None)
  return g_lib.dp_event_rdp(base, orders), None


def _subset_curves(event: ss.SubsampledTuning, orders: np.ndarray, tune_method: str):
  """Tuning and final-run RDP as functions on every integer order up to max(orders)."""
  ints = np.arange(2, int(orders.max()) + 1, dtype=np.float64)
  tune = _guarantee(event.tune, ints, tune_method).rdp
  final, _ = _base_curve(event.final, ints)
  at = lambda curve: (lambda o: curve[np.asarray(o).astype(int) - 2])
  return at(tune), at(final)


def _subset_rdp(event: ss.SubsampledTuning, orders: np.ndarray) -> Guarantee:
  """Koskela-Kulkarni: Thm 1 (variant 1) or Zhu-Wang + composition (variant 2)."""
  tune, final = _subset_curves(event, orders, "rdp")
  if event.variant == 1:
    return Guarantee(orders, rs.monotone(ss.variant1(tune, final, event.q, orders)),
                     "KK Thm 1 (variant 1) on PS tuning bound")
  return Guarantee(orders, rs.monotone(ss.variant2(tune, final, event.q, orders)),
                   "KK variant 2: Zhu-Wang subsampled tuning + final run")


def _rdp_method(event, orders: np.ndarray) -> Guarantee:
  """Papernot & Steinke bounds, chosen by the distribution of K."""
  if isinstance(event, lt_lib.ThresholdSelect):
    raise NotApplicableError("no RDP theorem for Liu-Talwar's threshold algorithm; "
                             "see methods 'liu-talwar' and 'composition'")
  if isinstance(event, ss.SubsampledTuning):
    return _subset_rdp(event, orders)
  if not isinstance(event, RepeatAndSelect):
    rdp, pure = _base_curve(event, orders)
    return Guarantee(orders, rdp, "single run", pure)
  base, dist = event.base, event.distribution
  rdp, pure = _base_curve(base, orders)
  if isinstance(dist, dist_lib.TruncatedNegativeBinomial):
    curve, theorem = rs.theorem2(orders, rdp, dist), "PS Thm 2"
    if isinstance(base, g_lib.Zcdp):
      curve, theorem = np.minimum(curve, rs.corollary4(orders, base.rho, dist)), "PS Thm 2 + Cor 4"
    pure_out = None
    if pure is not None:  # Cor 3: (2 + eta) eps-DP.
      pure_out, theorem = (2.0 + dist.eta) * pure, theorem + " + Cor 3"
    return Guarantee(orders, curve, theorem, pure_out)
  hockey = g_lib.PureDp(pure).hockey_stick if pure is not None else None
  if isinstance(dist, dist_lib.Poisson):
    if dist.mean >= 1.0:
      return Guarantee(orders, rs.theorem6(orders, rdp, dist.mean, hockey), "PS Thm 6")
    return Guarantee(orders, rs.poisson_any_mean(orders, rdp, dist.mean, hockey),
                     "PS Thm 6, K=0 atom kept (mean < 1)")
  curve = np.minimum(rs.lemma7(orders, rdp, dist, pure), rs.composition(orders, rdp, dist))
  return Guarantee(orders, rs.monotone(curve), "PS Lemma 7 (numerical, K=0 atom) / composition",
                   _composed_pure(pure, dist))


def _threshold_calls(event) -> dist_lib.KDistribution:
  gamma, t = event.stop_prob, event.max_iterations
  if gamma == 1.0:
    return dist_lib.Fixed(1)
  return lt_lib.CappedGeometric(gamma, t) if t is not None else dist_lib.Geometric(gamma=gamma)


def _composed_pure(pure, dist):
  return pure * dist.max_k if (pure is not None and dist.max_k is not None) else None


def _composition_method(event, orders: np.ndarray) -> Guarantee:
  """Composition of all K runs, as if every run were released."""
  if isinstance(event, lt_lib.ThresholdSelect):
    # Its output is a post-processing of the transcript of K ~ min(Geometric(gamma), T) calls.
    event = RepeatAndSelect(event.base, _threshold_calls(event))
  if isinstance(event, ss.SubsampledTuning):
    # The subset only amplifies privacy, so tuning (composed) + final run is valid for both variants.
    tune, final = _subset_curves(event, orders, "composition")
    return Guarantee(orders, tune(orders) + final(orders), "composition of all K runs and the final run")
  if not isinstance(event, RepeatAndSelect):
    return _rdp_method(event, orders)
  rdp, pure = _base_curve(event.base, orders)
  return Guarantee(orders, rs.composition(orders, rdp, event.distribution),
                   "composition of K runs (joint convexity over K)",
                   _composed_pure(pure, event.distribution))


# name -> fn(event, orders) returning an object with .epsilon(delta), .delta(epsilon)
# and .theorem, or raising NotApplicableError. "best" minimises over all of them.
_METHOD_FNS = {
    "rdp": _rdp_method,
    "composition": _composition_method,
    "profile": ps_lib.profile_method,
    "profile-refined": ps_lib.profile_refined_method,
    "liu-talwar": lt_lib.liu_talwar_method,
}
# Derived, not in the paper: "best" uses it only when the caller opts in.
_OPT_IN_METHODS = ("profile-refined",)
METHODS = tuple(_METHOD_FNS)
ALL_METHODS = METHODS + ("best",)


def _guarantee(event, orders: np.ndarray, method: str):
  if method not in _METHOD_FNS:
    raise ValueError(f"method must be one of {ALL_METHODS}, got {method!r}")
  reason = ps_lib.rdp_not_applicable(event) if method in ("rdp", "composition") else None
  if reason:
    raise NotApplicableError(reason)
  return _METHOD_FNS[method](event, orders)


def guarantee(event, method: str = "rdp", orders: Optional[Sequence[float]] = None) -> Guarantee:
  """The `Guarantee` (RDP curve, theorem, pure epsilon) a method gives for `event`."""
  event = _check_event(event)
  return _guarantee(event, _grid(event, orders), method)


def rdp_curve(event, orders: Optional[Sequence[float]] = None, method: str = "rdp") -> g_lib.RdpCurve:
  """The event's RDP curve as an `RdpCurve`, e.g. to plot or to reuse as a base."""
  gu = guarantee(event, method, orders)
  return g_lib.RdpCurve(gu.orders, gu.rdp)


def _methods_for(method: str, allow_refined: bool = False) -> tuple:
  if method == "best":
    return METHODS if allow_refined else tuple(m for m in METHODS if m not in _OPT_IN_METHODS)
  if method not in METHODS:
    raise ValueError(f"method must be one of {ALL_METHODS}, got {method!r}")
  return (method,)


def epsilon(event, delta: float, method: str = "best",
            orders: Optional[Sequence[float]] = None, *, allow_refined: bool = False) -> float:
  """Smallest epsilon such that `event` is (epsilon, delta)-DP by `method`.

  Args:
    event: a `RepeatAndSelect`, or a single run's guarantee (DpEvent, PureDp,
      Zcdp, RdpCurve).
    delta: target delta, in (0, 1).
    method: one of `METHODS` or "best" (minimum over the methods that apply).
    orders: RDP orders (all > 1); default: dp-accounting's grid.
    allow_refined: let "best" also use "profile-refined".

  Returns:
    epsilon >= 0 (natural-log units); inf if no finite bound exists.

  Raises:
    ValueError: invalid delta, method or orders; `UnsupportedBaseError` for a
      base that cannot be accounted; `NotApplicableError` if `method` (or, for
      "best", every method) does not apply.

  Example:
    >>> import dp_accounting as dpa
    >>> from jaxdp import accounting as acc
    >>> base = dpa.SelfComposedDpEvent(
    ...     dpa.PoissonSampledDpEvent(256 / 60000, dpa.GaussianDpEvent(1.1)), 14063)
    >>> round(acc.epsilon(acc.RepeatAndSelect(base, acc.Poisson(mean=10)), 1e-5, "rdp"), 4)
    5.7489
  """
  delta = _validate.probability("delta", delta)
  methods = _methods_for(method, allow_refined)
  event = _check_event(event)
  grid = _grid(event, orders)
  return min(gu.epsilon(delta) for gu in _applicable(event, grid, methods))


def delta(event, epsilon: float, method: str = "best",  # pylint: disable=redefined-outer-name
          orders: Optional[Sequence[float]] = None, *, allow_refined: bool = False) -> float:
  """Smallest delta such that `event` is (epsilon, delta)-DP by `method` (see `epsilon`)."""
  epsilon = _validate.real("epsilon", epsilon, low=0.0)
  methods = _methods_for(method, allow_refined)
  event = _check_event(event)
  grid = _grid(event, orders)
  return min(gu.delta(epsilon) for gu in _applicable(event, grid, methods))


def _applicable(event, grid, methods):
  """Guarantees of `methods`; for several ("best"), those that do not apply are skipped."""
  if len(methods) == 1:
    return [_guarantee(event, grid, methods[0])]
  out, reasons = [], []
  for m in methods:
    try:
      out.append(_guarantee(event, grid, m))
    except NotApplicableError as err:
      reasons.append(f"{m}: {err}")
  if not out:
    raise NotApplicableError("no method applies: " + "; ".join(reasons))
  return out


@dataclasses.dataclass(frozen=True)
class MethodResult:
  method: str
  epsilon: Optional[float]
  theorem: str


@dataclasses.dataclass(frozen=True)
class Report:
  """Every applicable method's epsilon at one delta, and the tightest."""

  event: str
  delta: float
  results: tuple
  best_method: str
  best_epsilon: float

  def to_dict(self) -> dict:
    return {
        "event": self.event,
        "delta": self.delta,
        "methods": [dataclasses.asdict(r) for r in self.results],
        "best": {"method": self.best_method, "epsilon": self.best_epsilon},
    }

  def to_json(self) -> str:
    return json.dumps(self.to_dict(), indent=2, default=str)

  def __str__(self) -> str:
    width = max(len("method"), *(len(r.method) for r in self.results))
    lines = [f"{self.event}", f"delta = {self.delta:g}",
             f"{'method':<{width}} {'epsilon':>10}  theorem"]
    for r in self.results:
      eps = "n/a" if r.epsilon is None else f"{r.epsilon:10.4f}"
      mark = "  <- tightest" if r.method == self.best_method else ""
      lines.append(f"{r.method:<{width}} {eps:>10}  {r.theorem}{mark}")
    return "\n".join(lines)


def describe(event) -> str:
  if isinstance(event, ss.SubsampledTuning):
    return (f"SubsampledTuning(tune={describe(event.tune)}, final={describe(event.final)}, "
            f"q={event.q!r}, variant={event.variant})")
  if isinstance(event, RepeatAndSelect):
    return f"RepeatAndSelect(base={describe(event.base)}, K ~ {event.distribution!r})"
  return repr(event)


def report(event, delta: float, orders: Optional[Sequence[float]] = None,  # pylint: disable=redefined-outer-name
           *, allow_refined: bool = False) -> Report:
  """Epsilon at `delta` by every method, marking the tightest (what "best" returns).

  Opt-in methods ("profile-refined") are always shown, but count as tightest
  only with `allow_refined=True`.
  """
  delta = _validate.probability("delta", delta)
  event = _check_event(event)
  grid = _grid(event, orders)
  results = []
  for m in METHODS:
    try:
      gu = _guarantee(event, grid, m)
    except NotApplicableError as err:
      results.append(MethodResult(m, None, f"not applicable: {err}"))
      continue
    results.append(MethodResult(m, gu.epsilon(delta), gu.theorem))
  valid = [r for r in results if r.epsilon is not None
           and (allow_refined or r.method not in _OPT_IN_METHODS)]
  if not valid:
    raise NotApplicableError("no method applies: " + "; ".join(
        f"{r.method}: {r.theorem}" for r in results))
  best = min(valid, key=lambda r: r.epsilon)
  return Report(describe(event), delta, tuple(results), best.method, best.epsilon)
