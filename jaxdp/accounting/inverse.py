"""Inverse accounting: how many candidates fit a budget, how much noise a tuned
DP-SGD run needs, and a planning table.

Every search returns a parameter whose epsilon was computed and found within
the target, on the log of the parameter: the answer always errs on the
private side, and only its optimality is approximate (relative `rtol`). A
search brackets the answer and `dp_accounting.calibrate_dp_mechanism`
(Brent's method) finishes, except where a feasible and an infeasible
parameter already lie within the tolerance of each other: the feasible one
is then the answer, as Brent's method would certify it.

Method "best" is the minimum of the methods' epsilons, so a parameter meets
the target by "best" iff it does by one of them: the answer is the most
permissive of the methods' answers. Each method is therefore searched on its
own, cheapest first, and a method after the first costs one evaluation (one
step past the answer so far, which it must meet to improve on it by more than
the tolerance; the PLD mixture can refuse from its first terms,
`PldAccountant.epsilon_exceeds`) unless it wins. A method that wins is
searched from that step by secants on log epsilon (`_calibrate_near`): two or
three evaluations near the answer, instead of a bracketing walk and Brent's
iterations. The expensive methods (privacy profiles, PLD mixtures) thus see
a few parameters instead of every step of the search, and no parameter is
accounted by every method at once.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Callable, Optional, Sequence

import dp_accounting as dpa

from jaxdp import _validate
from jaxdp.accounting import api
from jaxdp.accounting import distributions as dist_lib
from jaxdp.accounting import events as ev
from jaxdp.accounting.display import format_delta, format_epsilon
from jaxdp.accounting._search import FAMILIES, Family, Search, calibrate_search, max_mean_search

#: The smallest noise `calibrate_noise` and `noise_for` try.
SIGMA_MIN = 1e-3

def calibrate(make_event: Callable[[float], dpa.DpEvent], target_epsilon: float, target_delta: float, *,
              low: float, high: float, start: float, increasing: bool, method: str = "best",
              orders: Optional[Sequence[float]] = None, allow_refined: bool = False,
              rtol: float = 1e-3, discrete: bool = False) -> Optional[float]:
  """The x in [low, high] nearest the budget with epsilon(make_event(x)) <= target.

  epsilon must be monotone in x (`increasing` says which way). Brackets by
  doubling from `start` (so expensive accountants only see parameters near
  the answer), then `calibrate_dp_mechanism` finishes: on log x with relative
  tolerance `rtol`, or on the integers with `discrete=True`. With "best", a
  method after the first that improves on the answer so far is searched from
  there by secants (module docstring), to the same tolerance.

  Returns:
    x (an int if `discrete`), or None if no x in [low, high] meets the target.
  """
  return calibrate_search(make_event, target_epsilon, target_delta,
                          Search(method, orders, allow_refined), low=low, high=high, start=start,
                          increasing=increasing, rtol=rtol, discrete=discrete)


def max_mean(base, family: Family, epsilon: float, delta: float, method: str = "best", *,
             allow_refined: bool = False, orders: Optional[Sequence[float]] = None,
             rtol: float = 1e-3) -> float:
  """Largest E[K] such that repeat-and-select of `base` is (epsilon, delta)-DP.

  Args:
    base: one run's event (any DpEvent).
    family: "poisson", "geometric", "logarithmic", "tnb-0.5", or a callable
      mapping a mean to a distribution, e.g.
      `lambda m: TruncatedNegativeBinomial(0.5, mean=m)`.
    epsilon: target epsilon > 0.
    delta: target delta in (0, 1).
    method: accounting method (as for `epsilon`).
    allow_refined: let "best" use "profile-refined".
    orders: RDP orders.
    rtol: relative tolerance on the mean.

  Returns:
    The mean (a float, not rounded to the family's constraints); 1e9 if even
    that meets the target.

  Raises:
    ValueError: bad arguments, or no admissible mean meets the target.

  Example:
    >>> import dp_accounting as dpa
    >>> from jaxdp import accounting as acc
    >>> m = acc.max_mean(dpa.GaussianDpEvent(4.0), "geometric", 2.0, 1e-5, method="profile")
    >>> 15 < m < 16
    True
  """
  epsilon = _validate.real("epsilon", epsilon, low=0.0, low_open=True)
  delta = _validate.probability("delta", delta)
  rtol = _validate.real("rtol", rtol, low=0.0, low_open=True, high=1.0)
  return max_mean_search(base, family, epsilon, delta, Search(method, orders, allow_refined), rtol)


def calibrate_noise(sampling_prob: float, iterations: int,
                    distribution: Optional[dist_lib.KDistribution], epsilon: float, delta: float,
                    method: str = "best", *, allow_refined: bool = False,
                    orders: Optional[Sequence[float]] = None, rtol: float = 1e-3,
                    sigma_max: float = 1e3) -> float:
  """Smallest DP-SGD noise multiplier so that tuning meets (epsilon, delta).

  Each candidate runs `iterations` steps of the Poisson-subsampled Gaussian
  with rate `sampling_prob`; the tuner draws K ~ `distribution` candidates and
  releases the best (None: a single run).

  Args:
    sampling_prob: DP-SGD sampling rate in (0, 1].
    iterations: steps per run, >= 1.
    distribution: law of K, or None.
    epsilon: target epsilon > 0.
    delta: target delta in (0, 1).
    method, allow_refined, orders: as for `epsilon`.
    rtol: relative tolerance on sigma.
    sigma_max: give up above this noise multiplier.

  Returns:
    sigma (noise multiplier, relative to the clipping norm), rounded up.

  Raises:
    ValueError: bad arguments, or not even `sigma_max` meets the target.
  """
  sampling_prob = _validate.probability("sampling_prob", sampling_prob, one_ok=True)
  iterations = _validate.integer("iterations", iterations, low=1)
  epsilon = _validate.real("epsilon", epsilon, low=0.0, low_open=True)
  delta = _validate.probability("delta", delta)
  rtol = _validate.real("rtol", rtol, low=0.0, low_open=True, high=1.0)
  sigma_max = _validate.real("sigma_max", sigma_max, low=SIGMA_MIN, low_open=True)
  if distribution is not None:
    dist_lib.check_distribution(distribution)

  def make(sigma):
    run = ev.dpsgd_event(sampling_prob, sigma, iterations)
    return run if distribution is None else ev.RepeatAndSelect(run, distribution)

  return noise_for(make, epsilon, delta, method=method, orders=orders, allow_refined=allow_refined,
                   rtol=rtol, sigma_max=sigma_max)


def noise_for(make_event: Callable[[float], dpa.DpEvent], epsilon: float, delta: float, *,
              method: str = "best", orders=None, allow_refined: bool = False, rtol: float = 1e-3,
              sigma_max: float = 1e3, where: str = "") -> float:
  """Smallest sigma in [1e-3, sigma_max] with epsilon(make_event(sigma)) <= target.

  The general form of `calibrate_noise`, for any family of events: a
  search's whole event (its candidates' training and DP scores, K's law) as a
  function of the training noise is what `jaxdp.tuning`'s `target_epsilon`
  calibrates.

  Args:
    make_event: sigma -> DpEvent; its epsilon must not increase with sigma.
    epsilon: target epsilon > 0.
    delta: target delta in (0, 1).
    method, orders, allow_refined: as for `epsilon`.
    rtol: relative tolerance: the answer meets the target and sigma /
      (1 + rtol) does not (by every method, for "best").
    sigma_max: give up above this noise multiplier.
    where: appended to the out-of-reach message (e.g. " for this search").

  Returns:
    sigma, rounded towards more noise: `epsilon(make_event(sigma), delta,
    method)` is at most `epsilon`.

  Raises:
    ValueError: not even `sigma_max` meets the target.

  Seeded by the RDP answer, which is cheap and (nearly always) an upper
  bound of the others', so expensive accountants only see nearby sigmas
  ("best" searches RDP first anyway, and every later method from its answer).

  Example:
    >>> import dp_accounting as dpa
    >>> from jaxdp import accounting as acc
    >>> search = lambda s: acc.RepeatAndSelect(dpa.ComposedDpEvent(
    ...     [acc.dpsgd_event(0.2, s, 50), dpa.GaussianDpEvent(5.0)]), acc.Geometric(mean=3))
    >>> sigma = acc.noise_for(search, 2.0, 1e-5)
    >>> acc.epsilon(search(sigma), 1e-5) <= 2.0 < acc.epsilon(search(sigma / 1.001), 1e-5)
    True
  """
  seed = 1.0
  if method not in ("rdp", "best"):
    try:
      rough = calibrate(make_event, epsilon, delta, low=SIGMA_MIN, high=sigma_max, start=1.0,
                        increasing=False, method="rdp", orders=orders, rtol=0.05)
      seed = rough if rough is not None else sigma_max
    except dpa.UnsupportedEventError:
      pass  # no RDP theorem (e.g. Liu-Talwar's threshold selection): no seed, start from 1
  found = calibrate(make_event, epsilon, delta, low=SIGMA_MIN, high=sigma_max, start=seed,
                    increasing=False, method=method, orders=orders, allow_refined=allow_refined, rtol=rtol)
  if found is None:
    raise ValueError(f"epsilon={epsilon!r} is out of reach{where}: even noise_multiplier="
                     f"{sigma_max!r} does not meet it at delta={delta!r}; raise sigma_max or the "
                     "target, or train for fewer steps")
  return found


# ----------------------------------------------------------------------------- planning


@dataclasses.dataclass(frozen=True)
class PlanRow:
  """One family of K: the most candidates the budget affords."""

  family: str
  max_mean: Optional[float]      # largest E[K] (largest k for "fixed"); None if even the smallest fails
  prob_zero: Optional[float]     # P[K = 0]: the search releases nothing
  expected_quantile: Optional[float]  # E[K/(K+1)]: expected quantile of the released run's score
  epsilon: Optional[float]       # the epsilon at that mean (<= the budget)


@dataclasses.dataclass(frozen=True)
class Plan:
  """`plan`'s answer: per family of K, how many candidates fit (epsilon, delta)."""

  base: str
  epsilon: float
  delta: float
  method: str
  single_run_epsilon: float
  rows: tuple

  def to_dict(self) -> dict:
    return {"base": self.base, "epsilon": self.epsilon, "delta": self.delta, "method": self.method,
            "single_run_epsilon": self.single_run_epsilon,
            "families": [dataclasses.asdict(r) for r in self.rows]}

  def to_json(self) -> str:
    return json.dumps(self.to_dict(), indent=2)

  def __str__(self) -> str:
    fmt = lambda v, f: "-" if v is None else format(v, f)
    up = lambda v, f: "-" if v is None else format_epsilon(v, f)  # an epsilon: never shown below
    lines = [f"Budget (epsilon={format_epsilon(self.epsilon, 'g')}, delta={format_delta(self.delta)}) "
             f"by method {self.method!r} for",
             f"  one run: {self.base} (epsilon {format_epsilon(self.single_run_epsilon)} alone)", "",
             f"{'K family':<12} {'max E[K]':>10} {'P(K=0)':>8} {'E[quantile]':>12} {'epsilon':>9}"]
    for r in self.rows:
      lines.append(f"{r.family:<12} {fmt(r.max_mean, '10.4g'):>10} {fmt(r.prob_zero, '8.2g'):>8} "
                   f"{fmt(r.expected_quantile, '12.4f'):>12} {up(r.epsilon, '9.4f'):>9}")
    return "\n".join(lines + ["", *plan_legend(self.epsilon, self.delta)])


def plan_legend(epsilon: float, delta: float) -> list:
  """What each column of a `Plan` table means, in plain words (issue 45: a bare
  'geometric max E[K] 1.023e+04' was read as a recommendation)."""
  return [
      "Each row is one law of K, the number of candidates trained, at the largest mean this",
      "budget affords:",
      "  K family     poisson: K ~ Poisson(mean); geometric, logarithmic, tnb-0.5: truncated",
      "               negative binomials (K >= 1, a long tail); fixed: exactly k candidates",
      "  max E[K]     the largest expected number of candidates for which the whole search is",
      f"               still (epsilon={epsilon:g}, delta={delta:g})-DP (fixed: the largest k). An upper",
      "               limit, not advice: choose the mean you need and check it (jaxdp account",
      "               --repeat, or acc.epsilon)",
      "  P(K=0)       the chance that no candidate is drawn and the search releases nothing",
      "  E[quantile]  the released run's expected quantile among all candidates' scores (Papernot",
      "               & Steinke Sec. 3.6); higher means a better chance of a good one",
      "  epsilon      the whole search's epsilon at max E[K] (at most the budget)",
      "  -            the budget affords not even the smallest search of that family"]


PLAN_FAMILIES = ("poisson", "geometric", "logarithmic", "tnb-0.5", "fixed")


def plan(base, epsilon: float, delta: float, method: str = "best", *,
         allow_refined: bool = False, rtol: float = 1e-2) -> Plan:
  """Which distribution of K, and how many candidates, a budget affords.

  For each family (Poisson, geometric, logarithmic, TNB eta = 0.5, fixed K):
  the largest E[K] with the whole search (epsilon, delta)-DP, P[K = 0] and the
  expected quantile of the released run.

  Example:
    >>> import dp_accounting as dpa
    >>> from jaxdp import accounting as acc
    >>> p = acc.plan(dpa.GaussianDpEvent(4.0), epsilon=2.0, delta=1e-5)
    >>> [r.family for r in p.rows]
    ['poisson', 'geometric', 'logarithmic', 'tnb-0.5', 'fixed']
  """
  epsilon = _validate.real("epsilon", epsilon, low=0.0, low_open=True)
  delta = _validate.probability("delta", delta)
  rtol = _validate.real("rtol", rtol, low=0.0, low_open=True, high=1.0)
  single = api.epsilon(base, delta, method, allow_refined=allow_refined)
  # One search for the whole table: the epsilon at each family's answer is
  # the one its search already computed.
  search = Search(method, None, allow_refined)
  rows = []
  for family in PLAN_FAMILIES:
    if family == "fixed":
      k = calibrate_search(lambda k: ev.RepeatAndSelect(base, dist_lib.Fixed(k)), epsilon, delta, search,
                     low=1, high=100000, start=2, increasing=True, rtol=1e-3, discrete=True)
      dist = None if k is None else dist_lib.Fixed(k)
      mean = k
    else:
      try:
        mean = max_mean_search(base, family, epsilon, delta, search, rtol)
      except ValueError:
        mean = None
      dist = None if mean is None else FAMILIES[family][0](mean)
    if dist is None:
      rows.append(PlanRow(family, None, None, None, None))
      continue
    final = ev.RepeatAndSelect(base, dist)
    # api.epsilon's number; it is the search's own unless api.epsilon picks other orders.
    eps = (search.epsilon(final, delta) if api.orders_for(final, None) is None
           else api.epsilon(final, delta, method, allow_refined=allow_refined))
    rows.append(PlanRow(family, float(mean), float(dist.prob_zero),
                        float(dist_lib.expected_quantile(dist)), eps))
  return Plan(ev.describe(base), epsilon, delta, method, single, tuple(rows))
