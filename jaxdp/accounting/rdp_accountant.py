"""RDP accountants: Papernot-Steinke selection (method "rdp") and plain
composition of every run (method "composition").

Both are `dp_accounting.PrivacyAccountant`s over jaxdp's events and
dp-accounting's own, nested in `ComposedDpEvent` / `SelfComposedDpEvent` in
any order: RDP curves of composed parts add, so a tuning step composes with
the final training run and anything else released. Curves are converted to
(eps, delta) with dp-accounting's conversion (Canonne-Kamath-Steinke + KL).

Per distribution of K, method "rdp" uses (REFERENCE section 3):
  * truncated negative binomial: PS Thm 2 (+ Cor 4 for a zCDP base, Cor 3 for
    a pure base: (2 + eta) eps);
  * Poisson, mean >= 1: PS Thm 6; mean < 1: Thm 6 with the K = 0 atom kept
    (the printed theorem is false there);
  * any other law (binomial, fixed, capped geometric): PS Lemma 7 with the
    K = 0 atom, maximised numerically as a rigorous bound, order-wise min with
    composition;
  * tuning on a subset: Koskela-Kulkarni Thm 1 (variant 1) or Zhu-Wang +
    composition (variant 2), on integer orders.
Method "composition" pays for every run as if all were released: e^{(l-1)eps'}
<= f(e^{(l-1) eps(l)}) (joint convexity over K of k-fold composition).
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import dp_accounting as dpa
import numpy as np

from jaxdp import _validate
from jaxdp.accounting import _dpa
from jaxdp.accounting import base
from jaxdp.accounting import distributions as dist_lib
from jaxdp.accounting import events as ev
from jaxdp.accounting import rdp_selection as rs
from jaxdp.accounting import subsampled as ss

_Details = base.CompositionErrorDetails


def check_orders(orders: Optional[Sequence[float]]) -> np.ndarray:
  """Validated, sorted, de-duplicated order grid (every order > 1); default dp-accounting's."""
  if orders is None:
    return np.asarray(_dpa.DEFAULT_ORDERS, dtype=np.float64)
  return np.unique(_validate.real_array("orders", orders, low=1.0, low_open=True))


def as_repeat_and_select(event) -> ev.RepeatAndSelect:
  """Liu-Talwar random stopping is repeat-and-select with a (capped) geometric K
  (a `RepeatAndSelect` is returned as it is)."""
  if isinstance(event, ev.RepeatAndSelect):
    return event
  if event.max_iterations is None:
    return ev.RepeatAndSelect(event.base, dist_lib.Geometric(gamma=event.stop_prob))
  return ev.RepeatAndSelect(event.base, dist_lib.CappedGeometric(event.stop_prob, event.max_iterations))


def threshold_calls(event: ev.ThresholdSelect) -> dist_lib.KDistribution:
  """Law of the number of calls of Liu-Talwar's threshold algorithm in the worst case."""
  gamma, t = event.stop_prob, event.max_iterations
  if gamma == 1.0:
    return dist_lib.Fixed(1)
  return dist_lib.CappedGeometric(gamma, t) if t is not None else dist_lib.Geometric(gamma=gamma)


class RdpSelectionAccountant(base.Accountant):
  """Method "rdp": Papernot-Steinke (and Koskela-Kulkarni) RDP bounds.

  Args:
    orders: RDP orders (all > 1); default dp-accounting's grid.

  Attributes (after `compose`):
    orders, rdp: the composed RDP curve (made non-decreasing in the order).
    pure_epsilon: a pure-DP epsilon of the composition, or None.
    theorem: the results used, for reports.

  Example:
    >>> import dp_accounting as dpa
    >>> from jaxdp import accounting as acc
    >>> tune = acc.RepeatAndSelect(dpa.GaussianDpEvent(4.0), acc.Geometric(mean=10))
    >>> acct = acc.RdpSelectionAccountant().compose(dpa.ComposedDpEvent([tune, dpa.GaussianDpEvent(4.0)]))
    >>> round(acct.get_epsilon(1e-5), 4) > round(acc.epsilon(tune, 1e-5, "rdp"), 4)
    True
  """

  method = "rdp"

  def __init__(self, orders: Optional[Sequence[float]] = None):
    super().__init__()
    self._orders_arg = orders
    self._orders = check_orders(orders)
    self._rdp = np.zeros_like(self._orders)
    self._pure: Optional[float] = 0.0
    self._theorems: list = []

  # ------------------------------------------------------------------ results

  @property
  def orders(self) -> np.ndarray:
    return self._orders.copy()

  @property
  def rdp(self) -> np.ndarray:
    return rs.monotone(self._rdp)

  @property
  def pure_epsilon(self) -> Optional[float]:
    return self._pure

  @property
  def theorem(self) -> str:
    return " + ".join(dict.fromkeys(self._theorems)) or "nothing composed"

  def get_epsilon(self, target_delta: float) -> float:
    target_delta = _validate.probability("target_delta", target_delta)
    eps = _dpa.rdp_to_epsilon(self._orders, self.rdp, target_delta)
    if self._pure is not None:
      eps = min(eps, self._pure)
    # dp-accounting's two conversions can disagree in the last bits: round eps up
    # until the delta conversion confirms it, so epsilon and delta stay inverses.
    step = max(abs(eps), 1e-12) * 2e-16
    for _ in range(64):
      if not math.isfinite(eps) or self.get_delta(eps) <= target_delta:
        break
      eps, step = eps + step, 2 * step
    return eps

  def get_delta(self, target_epsilon: float) -> float:
    target_epsilon = _validate.real("target_epsilon", target_epsilon, low=0.0, allow_inf=True)
    if self._pure is not None and target_epsilon >= self._pure:
      return 0.0
    return _dpa.rdp_to_delta(self._orders, self.rdp, target_epsilon)

  # ------------------------------------------------------------------ composition

  def _fresh(self) -> "RdpSelectionAccountant":
    return type(self)(self._orders)

  def _single(self, event) -> tuple[np.ndarray, Optional[float], str]:
    """(RDP, pure epsilon, theorem) of one event, by this accountant's own method."""
    sub = self._fresh().compose(event)
    rdp = sub.rdp
    if sub.pure_epsilon is not None:  # the exact RR curve of a pure guarantee may be tighter
      rdp = np.minimum(rdp, ev.PureDp(sub.pure_epsilon).rdp(self._orders))
    return rdp, sub.pure_epsilon, sub.theorem

  def _add(self, rdp, pure, theorem, count):
    self._rdp = self._rdp + count * np.asarray(rdp, dtype=np.float64)
    self._pure = None if (self._pure is None or pure is None) else self._pure + count * pure
    self._theorems.append(theorem)

  def _rules(self):
    return {
        ev.PureDp: self._pure_dp, ev.ApproxDp: self._approx_dp,
        ev.Zcdp: self._rdp_guarantee, ev.RdpCurve: self._rdp_guarantee, ev.ReportNoisyMax: self._rdp_guarantee,
        ev.UniformCandidates: self._candidates,
        ev.RandomStopping: self._random_stopping,
        ev.RepeatAndSelect: self._repeat_and_select,
        ev.SelectionWithCount: self._with_count,
        ev.ThresholdSelect: self._threshold,
        ev.SubsampledTuning: self._subsampled_tuning,
        dpa.NonPrivateDpEvent: self._non_private,
    }

  def _pure_dp(self, event, count, do_compose) -> Optional[_Details]:
    if do_compose:
      self._add(event.rdp(self._orders), event.epsilon, "single run", count)
    return None

  def _approx_dp(self, event: ev.ApproxDp, count, do_compose) -> Optional[_Details]:
    if event.delta > 0:
      return _Details(event, "an (eps, delta)-DP guarantee with delta > 0 bounds no Renyi "
                             "divergence; use method 'profile' or 'pld'")
    return self._pure_dp(event, count, do_compose)

  def _rdp_guarantee(self, event, count, do_compose) -> Optional[_Details]:
    """A guarantee with its own RDP curve (`event.rdp`) and no pure epsilon."""
    if do_compose:
      self._add(event.rdp(self._orders), None, "single run", count)
    return None

  def _candidates(self, event: ev.UniformCandidates, count, do_compose) -> Optional[_Details]:
    for c in event.candidates:
      err = self._maybe_compose(c, 1, False)
      if err is not None:
        return err
    if do_compose:  # KK Lemma 1: the pointwise worst candidate
      parts = [self._single(c) for c in event.candidates]
      pures = [p for _, p, _ in parts]
      self._add(np.max([r for r, _, _ in parts], axis=0),
                None if any(p is None for p in pures) else max(pures),
                "candidates drawn at random (KK Lemma 1)", count)
    return None

  def _random_stopping(self, event, count, do_compose) -> Optional[_Details]:
    return self._maybe_compose(as_repeat_and_select(event), count, do_compose)

  def _repeat_and_select(self, event: ev.RepeatAndSelect, count, do_compose) -> Optional[_Details]:
    err = self._maybe_compose(event.base, 1, False)
    if err is not None:
      return err
    if do_compose:
      rdp, pure, inner = self._single(event.base)
      curve, pure_out, theorem = self._select(rdp, pure, event)
      self._add(curve, pure_out, theorem if inner == "single run" else f"{theorem} on [{inner}]", count)
    return None

  def _with_count(self, event: ev.SelectionWithCount, count, do_compose) -> Optional[_Details]:
    del count, do_compose
    return _Details(event, "K is released beside the best (SelectionWithCount): the Papernot-Steinke "
                           "RDP bound holds for the mixture over a hidden K only; methods "
                           "'composition' and 'pld' cover the pair")

  def _subsampled_tuning(self, event: ev.SubsampledTuning, count, do_compose) -> Optional[_Details]:
    for part in (event.tune.base, event.final):
      err = self._maybe_compose(part, 1, False)
      if err is not None:
        return err
    if do_compose:
      curve, theorem = self._subsampled(event)
      self._add(curve, None, theorem, count)
    return None

  def _non_private(self, event, count, do_compose) -> Optional[_Details]:
    del event
    if do_compose:
      self._add(np.full_like(self._orders, np.inf), None, "non-private", count)
    return None

  def _dp_accounting_part(self, event, count, do_compose) -> Optional[_Details]:
    # Any other dp-accounting event: dp-accounting's own RDP accountant.
    if not dpa.rdp.RdpAccountant(list(self._orders)).supports(event):
      return _Details(event, "dp-accounting's RdpAccountant cannot account this event")
    if do_compose:
      self._add(_dpa.dp_event_rdp(event, self._orders), _laplace_pure(event), "single run", count)
    return None

  def _threshold(self, event, count, do_compose):
    del count, do_compose
    return _Details(event, "no RDP theorem for Liu-Talwar's threshold algorithm; see methods "
                           "'liu-talwar' and 'composition'")

  def _select(self, rdp, pure, event: ev.RepeatAndSelect):
    """(curve, pure epsilon, theorem) of the best of K ~ D runs of a base with curve `rdp`."""
    orders, dist, base = self._orders, event.distribution, event.base
    if isinstance(dist, dist_lib.TruncatedNegativeBinomial):
      curve, theorem = rs.theorem2(orders, rdp, dist), "PS Thm 2"
      if isinstance(base, ev.Zcdp):
        curve, theorem = np.minimum(curve, rs.corollary4(orders, base.rho, dist)), "PS Thm 2 + Cor 4"
      pure_out = None
      if pure is not None:  # Cor 3: (2 + eta) eps-DP
        pure_out, theorem = (2.0 + dist.eta) * pure, theorem + " + Cor 3"
      return curve, pure_out, theorem
    hockey = ev.PureDp(pure).hockey_stick if pure is not None else None
    if isinstance(dist, dist_lib.Poisson):
      if dist.mean >= 1.0:
        return rs.theorem6(orders, rdp, dist.mean, hockey), None, "PS Thm 6"
      return (rs.poisson_any_mean(orders, rdp, dist.mean, hockey), None,
              "PS Thm 6, K=0 atom kept (mean < 1)")
    curve = np.minimum(rs.lemma7(orders, rdp, dist, pure), rs.composition(orders, rdp, dist))
    return (rs.monotone(curve), _composed_pure(pure, dist),
            "PS Lemma 7 (numerical, K=0 atom) / composition")

  def _integer_curve(self, event, method_cls) -> tuple:
    """RDP of `event` by `method_cls` on every integer order 2..ceil(max order)."""
    top = int(math.ceil(min(float(self._orders.max()), float(ss.DEFAULT_INTEGER_ORDERS[-1]))))
    ints = np.arange(2, max(top, 2) + 1, dtype=np.float64)
    sub = method_cls(ints).compose(event)
    return ints, sub.rdp, sub.theorem

  def _on_own_orders(self, ints, curve):
    # RDP is non-decreasing in the order: an integer order >= lambda bounds lambda.
    idx = np.ceil(np.maximum(self._orders, 2.0)).astype(int) - 2
    out = np.full_like(self._orders, np.inf)
    ok = idx < ints.size
    out[ok] = np.asarray(curve)[idx[ok]]
    return out

  def _subsampled(self, event: ev.SubsampledTuning):
    """Koskela-Kulkarni: Thm 1 (variant 1) or Zhu-Wang + composition (variant 2)."""
    ints, tune, _ = self._integer_curve(event.tune, RdpSelectionAccountant)
    _, final, _ = self._integer_curve(event.final, RdpSelectionAccountant)
    at = lambda curve: (lambda o: curve[np.asarray(o).astype(int) - 2])
    if event.variant == 1:
      curve, theorem = ss.variant1(at(tune), at(final), event.q, ints), "KK Thm 1 (variant 1) on PS tuning bound"
    else:
      curve, theorem = (ss.variant2(at(tune), at(final), event.q, ints),
                        "KK variant 2: Zhu-Wang subsampled tuning + final run")
    return self._on_own_orders(ints, rs.monotone(curve)), theorem


class CompositionAccountant(RdpSelectionAccountant):
  """Method "composition": every one of the K runs is paid for as if released.

  What tuning costs without the selection theorems; valid for every law of K
  and for Liu-Talwar's threshold algorithm (a post-processing of its calls).
  """

  method = "composition"

  def _with_count(self, event, count, do_compose):
    # The K-run transcript holds K: its bound covers the pair (K, best) as it is.
    return self._repeat_and_select(event.selection, count, do_compose)

  def _threshold(self, event, count, do_compose):
    # Its output post-processes the transcript of K ~ min(Geometric(gamma), T) calls.
    return self._maybe_compose(ev.RepeatAndSelect(event.base, threshold_calls(event)), count, do_compose)

  def _select(self, rdp, pure, event):
    dist = event.distribution
    return (rs.composition(self._orders, rdp, dist), _composed_pure(pure, dist),
            "composition of K runs (joint convexity over K)")

  def _subsampled(self, event):
    # The subset only amplifies privacy, so tuning (composed) + final run is valid for both variants.
    ints, tune, _ = self._integer_curve(event.tune, CompositionAccountant)
    _, final, _ = self._integer_curve(event.final, CompositionAccountant)
    return self._on_own_orders(ints, tune + final), "composition of all K runs and the final run"


def _composed_pure(pure, dist):
  return pure * dist.max_k if (pure is not None and dist.max_k is not None) else None


def _laplace_pure(event) -> Optional[float]:
  """Pure epsilon of dp-accounting events that have one (Laplace), else None."""
  if isinstance(event, dpa.LaplaceDpEvent) and event.noise_multiplier > 0:
    return 1.0 / event.noise_multiplier
  return None


def dp_accounting_pure_epsilon(event) -> Optional[float]:
  """Pure epsilon of a dp-accounting event built from Laplace and no-op events
  by (self-)composition (pure epsilons add), else None."""
  if isinstance(event, dpa.NoOpDpEvent):
    return 0.0
  if isinstance(event, dpa.SelfComposedDpEvent):
    inner = dp_accounting_pure_epsilon(event.event)
    return None if inner is None else event.count * inner
  if isinstance(event, dpa.ComposedDpEvent):
    parts = [dp_accounting_pure_epsilon(e) for e in event.events]
    return None if any(p is None for p in parts) else math.fsum(parts)
  return _laplace_pure(event)
