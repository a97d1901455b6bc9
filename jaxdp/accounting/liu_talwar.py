"""Liu & Talwar (STOC 2019), "Private selection from private candidates": events
and their accounting.

Two algorithms over an oracle Q (draw a candidate, run it, return (output, score)):

  * `ThresholdSelect` (their Algorithm 1): call Q until a score reaches a known
    threshold tau; after each failed call stop with probability `stop_prob`
    (output BOT); at most `max_iterations` calls.
  * `RandomStopping` (their Algorithm 2): call Q, then stop with probability
    `stop_prob`; release the best result. This is repeat-and-select with a
    geometric number of runs (capped at `max_iterations` for the hard-stopped
    variant), so it is a `RepeatAndSelect` and every other method applies too.

Accounting (method "liu-talwar"; pure eps1-DP base only):

  * Thm 3.1(b): Algorithm 1 is (2 eps1 + eps0)-DP with eps0 = 2 exp(-gamma T),
    for T >= 1 + 1/(e gamma); T = inf gives 2 eps1. (REFERENCE section 6: recon
    cross-checked with OpenDP's implementation and brute force.) Any T also
    gives T eps1 (the output post-processes T runs); the smaller is used.
  * Thm 3.2: Algorithm 2 without a cap is 3 eps1-DP (= Papernot-Steinke Cor 3
    with eta = 1).
  * Thm 3.5 (hard stop, pure base): its exact constant was lost in the
    extraction, so it is replaced by the pure-DP limit of Papernot-Steinke
    Lemma 7 for K = min(Geometric(gamma), T), evaluated rigorously
    (`pure_selection_epsilon`): D_inf(A||A') <= eps1 + sup log f'(q)/f'(q')
    over pairs with q <= e^eps1 q' and 1 - q' <= e^eps1 (1 - q).

Not implemented (not recoverable from the paper as extracted): Thm 3.1(c) and
Thm 3.4 for (eps, delta)-DP bases; the method then says it does not apply.
For approximate-DP bases use `RandomStopping` with the "profile" method (KRW
Thm 5.2) when there is no cap.
"""

from __future__ import annotations

import functools
import math
from typing import Optional

import dp_accounting as dpa
import numpy as np

from jaxdp.accounting import base
from jaxdp.accounting import distributions as dist_lib
from jaxdp.accounting import events as ev
from jaxdp.accounting import profiles as prof_lib
from jaxdp.accounting import rdp_accountant
from jaxdp.accounting import rdp_selection as rs

_Details = base.CompositionErrorDetails


_N_CELLS = 4000


def pure_selection_epsilon(eps: float, dist: dist_lib.KDistribution) -> float:
  """Pure-DP limit of Papernot-Steinke Lemma 7 (REFERENCE section 3.1), rigorously.

  With A(y) = Q(y) E_t f'(q_y(t)), A(y)/A'(y) <= e^eps sup f'(q)/f'(q') over
  post-processed pairs, which satisfy q <= e^eps q' and q <= 1 - e^-eps (1 - q').
  f' and the largest feasible q, q_max(q'), are non-decreasing, so on a cell
  [a, b] of q' the ratio is at most f'(q_max(b)) / f'(a): an upper bound,
  not an estimate. The K = 0 atom (same on both sides) has ratio 1.

  Args:
    eps: the base's pure epsilon.
    dist: law of K (needs f'(0) > 0, i.e. P[K = 1] > 0).

  Returns:
    An epsilon such that best-of-K is eps-DP; inf if the bound is infinite.
  """
  if eps == 0.0:
    return 0.0
  tail = np.logspace(-14, math.log10(0.5), _N_CELLS // 2)
  qp = np.unique(np.concatenate([[0.0], tail, 1.0 - tail[::-1], np.linspace(0.0, 1.0, 4 * _N_CELLS + 1)]))
  q_max = np.minimum(1.0, np.minimum(rs.exp_times(eps, qp), 1.0 - math.exp(-eps) * (1.0 - qp)))
  with np.errstate(divide="ignore"):
    log_num = np.log(np.asarray(dist.pgf_derivative(q_max[1:]), dtype=np.float64))
    log_den = np.log(np.asarray(dist.pgf_derivative(qp[:-1]), dtype=np.float64))
  cells = log_num - log_den
  if np.any(np.isnan(cells)):
    return math.inf
  return eps + max(0.0, float(np.max(cells)))


class LiuTalwarAccountant(base.Accountant):
  """Method "liu-talwar": pure-DP bounds for threshold and random-stopping selection.

  Parts compose by adding their pure epsilons, so every part must be pure DP:
  `ThresholdSelect`, `RandomStopping` / `RepeatAndSelect` with a (capped)
  geometric K over a pure base, `PureDp`, `ApproxDp` with delta = 0,
  dp-accounting's Laplace and no-op events.

  Example:
    >>> from jaxdp import accounting as acc
    >>> acct = acc.LiuTalwarAccountant().compose(acc.ThresholdSelect(acc.PureDp(0.5), 0.1))
    >>> round(acct.get_epsilon(1e-6), 4)
    1.0
  """

  method = "liu-talwar"

  def __init__(self):
    super().__init__()
    self._pure = 0.0
    self._theorems: list = []

  @property
  def pure_epsilon(self) -> float:
    return self._pure

  @property
  def theorem(self) -> str:
    return " + ".join(dict.fromkeys(self._theorems)) or "nothing composed"

  def get_epsilon(self, target_delta: float) -> float:
    return float(prof_lib.PureDpProfile(self._pure).epsilon(target_delta))

  def get_delta(self, target_epsilon: float) -> float:
    return float(prof_lib.PureDpProfile(self._pure).delta(target_epsilon))

  def _add(self, eps: float, theorem: str, count: int, do_compose: bool) -> None:
    if do_compose:
      self._pure += count * eps
      self._theorems.append(theorem)
    return None

  def _rules(self):
    return {
        ev.PureDp: self._pure_dp, ev.ApproxDp: self._approx_dp, dpa.LaplaceDpEvent: self._laplace,
        ev.Zcdp: self._no_pure, ev.RdpCurve: self._no_pure, ev.ReportNoisyMax: self._no_pure,
        ev.UniformCandidates: self._candidates,
        ev.ThresholdSelect: self._threshold,
        ev.RandomStopping: self._random_stopping,
        ev.RepeatAndSelect: self._repeat_and_select,
        ev.SelectionWithCount: functools.partial(
            self._refuse, "K is released beside the best (SelectionWithCount): Liu-Talwar bounds hold "
                          "for a hidden K only; methods 'composition' and 'pld' cover the pair"),
        ev.SubsampledTuning: self._no_pure,
    }

  def _no_pure(self, event, count, do_compose) -> _Details:
    del count, do_compose
    return _Details(event, f"Liu-Talwar bounds need pure-DP parts; {type(event).__name__} has none")

  _dp_accounting_part = _no_pure

  def _pure_dp(self, event, count, do_compose) -> Optional[_Details]:
    return self._add(event.epsilon, "single run", count, do_compose)

  def _approx_dp(self, event: ev.ApproxDp, count, do_compose) -> Optional[_Details]:
    if event.delta > 0.0:
      return self._no_pure(event, count, do_compose)
    return self._pure_dp(event, count, do_compose)

  def _laplace(self, event: dpa.LaplaceDpEvent, count, do_compose) -> Optional[_Details]:
    if event.noise_multiplier <= 0:
      return self._no_pure(event, count, do_compose)
    return self._add(1.0 / event.noise_multiplier, "single run", count, do_compose)

  def _base_pure(self, base) -> Optional[float]:
    """The smallest pure epsilon of `base` this accountant or the RDP one proves."""
    found = []
    sub = LiuTalwarAccountant()
    if sub.supports(base):
      found.append(sub.compose(base).pure_epsilon)
    rdp = rdp_accountant.RdpSelectionAccountant()
    if rdp.supports(base):
      pure = rdp.compose(base).pure_epsilon
      if pure is not None:
        found.append(pure)
    return min(found) if found else None

  def _candidates(self, event: ev.UniformCandidates, count, do_compose) -> Optional[_Details]:
    parts = [self._base_pure(c) for c in event.candidates]
    if any(p is None for p in parts):
      return _Details(event, "a candidate has no pure-DP guarantee")
    return self._add(max(parts), "candidates drawn at random", count, do_compose)

  def _threshold(self, event: ev.ThresholdSelect, count, do_compose) -> Optional[_Details]:
    eps1 = self._base_pure(event.base)
    if eps1 is None:
      return _Details(event, "Liu-Talwar Thm 3.1 for an (eps, delta)-DP base: delta' is not "
                             "recoverable from the paper; needs a pure-DP base")
    gamma, t = event.stop_prob, event.max_iterations
    if t is None:
      return self._add(2.0 * eps1, "LT Thm 3.1(b), T = inf: 2 eps1", count, do_compose)
    eps, theorem = t * eps1, "composition of T calls"
    if t >= 1.0 + 1.0 / (math.e * gamma):
      lt = 2.0 * eps1 + 2.0 * math.exp(-gamma * t)
      if lt < eps:
        eps, theorem = lt, "LT Thm 3.1(b): 2 eps1 + 2 exp(-gamma T)"
    return self._add(eps, theorem, count, do_compose)

  def _random_stopping(self, event, count, do_compose) -> Optional[_Details]:
    return self._repeat_and_select(rdp_accountant.as_repeat_and_select(event), count, do_compose)

  def _repeat_and_select(self, event: ev.RepeatAndSelect, count, do_compose) -> Optional[_Details]:
    dist = event.distribution
    is_geom = isinstance(dist, dist_lib.TruncatedNegativeBinomial) and dist.eta == 1.0
    if not (is_geom or isinstance(dist, dist_lib.CappedGeometric)):
      return _Details(event, f"Liu-Talwar random stopping needs a geometric K, got {dist!r}")
    eps1 = self._base_pure(event.base)
    if eps1 is None:
      return _Details(event, "Liu-Talwar Thm 3.2 / 3.5 need a pure-DP base (Thm 3.4's "
                             "(eps, delta) constants are not recoverable); use method 'profile'")
    eps = pure_selection_epsilon(eps1, dist)
    theorem = "LT Thm 3.5 via PS Lemma 7, pure limit (numerical)"
    if is_geom and 3.0 * eps1 <= eps:
      eps, theorem = 3.0 * eps1, "LT Thm 3.2: 3 eps1"
    elif is_geom:
      theorem = "LT Thm 3.2 sharpened by PS Lemma 7, pure limit (numerical)"
    return self._add(eps, theorem, count, do_compose)
