"""Issue 20: valid input never crashes accounting.

Every method either answers (a valid bound) or raises `NotApplicableError`
saying why; `supports(event)` is true only where the computation succeeds;
"best" answers whenever one method does. Covered here: sampling rates within
1e-12 of 1 (dp-accounting's PLD construction raises), every event type the
package knows nested two and three deep, and pure-DP guarantees up to 1e6
(Laplace noise down to 1e-6).
"""

from __future__ import annotations

import math
import random

import dp_accounting as dpa
import pytest

from jaxdp import accounting as acc
from jaxdp.accounting import _dpa
from jaxdp.accounting import _dpa_pld
from jaxdp.accounting import profile_accountant
from jaxdp.accounting import profiles

G = dpa.GaussianDpEvent
FLOOR = _dpa_pld.PLD_DELTA_FLOOR


def _epsilons(event, delta=1e-5, methods=acc.METHODS):
  """{method: epsilon} over the methods that answer; NotApplicableError is the only other outcome."""
  out = {}
  for method in methods:
    try:
      out[method] = acc.epsilon(event, delta, method=method)
    except acc.NotApplicableError:
      continue
  return out


# ----------------------------------------------------------------------------- q close to 1

#: Single DP-SGD steps whose PLD dp-accounting 0.6.0 cannot build: its
#: connect-the-dots Gaussian raises ValueError("a must be greater than b")
#: at a grid point within rounding of the asymptote log(1 - q), where
#: 1 - 1/q has lost its last digits. A sweep of q = 1 - 10^-k (k = 1..15) and
#: 0.5, 0.9, 0.95 by 20 sigmas in [0.2, 100] (360 builds) failed for exactly
#: these 9 on the machine that found them. Whether a build fails is a float
#: comparison, so the tests below ask dp-accounting in the same process
#: instead of trusting this list on another processor.
PLD_FAILURES = [(1 - 1e-12, 0.2), (1 - 1e-12, 0.25), (1 - 1e-12, 0.3), (1 - 1e-13, 0.2),
                (1 - 1e-13, 0.25), (1 - 1e-13, 0.3), (1 - 1e-15, 0.2), (1 - 1e-15, 0.25),
                (1 - 1e-15, 0.3)]


def _dp_accounting_build_fails(event) -> bool:
  """Whether dp-accounting's own PLD accountant fails on `event`, at jaxdp's grid, here."""
  try:
    dpa.pld.PLDAccountant(value_discretization_interval=_dpa_pld.pld_interval_for(event)).compose(event)
  except ValueError:
    return True
  return False


def test_a_failing_dp_accounting_pld_build_is_not_applicable_with_its_reason():
  failing = [acc.dpsgd_event(q, sigma, 1) for q, sigma in PLD_FAILURES]
  failing = [event for event in failing if _dp_accounting_build_fails(event)]
  assert failing, "dp-accounting built every PLD of the list: nothing left to test here"
  for event in failing[:3]:
    with pytest.raises(acc.NotApplicableError, match="ValueError: a must be greater than b"):
      _dpa_pld.pld_of_event(event, _dpa_pld.pld_interval_for(event))


def _check_q_near_one(q, sigma, steps):
  event = acc.dpsgd_event(q, sigma, steps)
  got = _epsilons(event)
  # RDP never fails here; the PLD methods fail exactly where dp-accounting's build does.
  assert {"rdp", "composition"} <= set(got)
  pld_fails = _dp_accounting_build_fails(event)
  assert ("pld" not in got and "profile" not in got) == pld_fails
  best = acc.epsilon(event, 1e-5)
  assert math.isfinite(best) and best > 0.0
  assert best == min(v for m, v in got.items() if m not in acc.OPT_IN_METHODS)


Q_NEAR_ONE = [1 - 1e-12, 1 - 1e-9, 1 - 1e-6, 0.999999]


@pytest.mark.parametrize("q,sigma,steps", [(1 - 1e-12, 0.3, 1), (1 - 1e-12, 1.0, 3), (1 - 1e-9, 2.0, 1)],
                         ids=repr)
def test_q_near_one_never_crashes_and_best_is_the_min_of_the_methods_that_answer(q, sigma, steps):
  _check_q_near_one(q, sigma, steps)


@pytest.mark.slow
@pytest.mark.parametrize("steps", [1, 3])
@pytest.mark.parametrize("sigma", [0.3, 0.5, 1.0, 2.0])
@pytest.mark.parametrize("q", Q_NEAR_ONE, ids=repr)
def test_q_near_one_never_crashes_over_the_whole_grid(q, sigma, steps):
  _check_q_near_one(q, sigma, steps)


@pytest.mark.slow  # 7 s of PLD construction; CI's slow set runs it, so make test stays under 5 min
def test_a_method_named_explicitly_says_why_its_pld_failed():
  event = acc.dpsgd_event(1 - 1e-12, 0.3, 1)
  for method in ("pld", "profile", "profile-refined"):
    with pytest.raises(acc.NotApplicableError, match="PLD construction fails.*ValueError: a must be greater"):
      acc.epsilon(event, 1e-5, method=method)
  # The issue's numbers: "best" is RDP's (q = 1 - 1e-12 is a full-batch Gaussian
  # to 12 digits: sigma = 0.3 gives 20.39 at 1e-5).
  assert acc.epsilon(event, 1e-5) == acc.epsilon(event, 1e-5, "rdp") == pytest.approx(20.3925, abs=1e-4)
  rep = acc.report(event, 1e-5)
  assert rep.best_method == "rdp" and "ValueError" in dict((r.method, r.theorem) for r in rep.results)["pld"]
  # In a selection over that step the profile method needs the step's PLD and
  # fails inside; "best" does not. (The PLD mixture picks a coarser grid for
  # the whole selection, where dp-accounting's build succeeds.)
  search = acc.RepeatAndSelect(event, acc.Poisson(mean=2))
  got = _epsilons(search)
  assert "profile" not in got and "rdp" in got
  assert acc.epsilon(search, 1e-5) == min(got.values())


# ----------------------------------------------------------------------------- supports() is honest

# Every event type the package knows, small parameters (a few ms each).
_LEAVES = [
    G(2.0), dpa.LaplaceDpEvent(1.0), dpa.PoissonSampledDpEvent(0.2, G(1.5)), dpa.NoOpDpEvent(),
    dpa.NonPrivateDpEvent(), dpa.dp_event.RepeatAndSelectDpEvent(G(2.0), 3.0, math.inf),
    dpa.dp_event.RepeatAndSelectDpEvent(G(2.0), 3.0, 1.0),
    dpa.SampledWithoutReplacementDpEvent(100, 10, G(2.0)), dpa.UnsupportedDpEvent(),
    acc.PureDp(0.5), acc.PureDp(0.0), acc.ApproxDp(0.5, 1e-6), acc.ApproxDp(0.3, 0.0), acc.Zcdp(0.05),
    acc.RdpCurve([2.0, 8.0, 32.0], [0.1, 0.3, 0.9]), acc.ReportNoisyMax(3.0, 4),
    acc.ReportNoisyMax(3.0, 2, num_rounds=2, monotonic=True),
]
_DISTS = [acc.Poisson(3), acc.Poisson(0.5), acc.Geometric(mean=3), acc.Logarithmic(mean=3),
          acc.TruncatedNegativeBinomial(0.5, mean=3), acc.TruncatedNegativeBinomial(-0.5, mean=3),
          acc.Binomial(4, 0.5), acc.Binomial(3, 1.0), acc.Fixed(2), acc.CappedGeometric(0.4, 4)]


def _wrap(rng, pool):
  """One random selection, candidate set, subset tuning or composition over `pool`."""
  base, other = rng.choice(pool), rng.choice(pool)
  kind = rng.randrange(9)
  if kind == 0:
    return acc.RepeatAndSelect(base, rng.choice(_DISTS))
  if kind == 1:
    return acc.RandomStopping(base, 0.4, rng.choice([None, 4]))
  if kind == 2:
    return acc.ThresholdSelect(base, rng.choice([0.4, 1.0]), rng.choice([None, 4]))
  if kind == 3:
    return acc.UniformCandidates([base, other])
  if kind == 4:
    return acc.SubsampledTuning(acc.RepeatAndSelect(base, acc.Poisson(3)), other, 0.2, rng.choice([1, 2]))
  if kind in (5, 6):
    return dpa.ComposedDpEvent([base, other])
  if kind == 7:
    return dpa.SelfComposedDpEvent(base, 2)
  return dpa.dp_event.RepeatAndSelectDpEvent(base, 3.0, math.inf)


def _events(level2: int = 30, level3: int = 8):
  rng = random.Random(20)
  level1 = [_wrap(rng, _LEAVES) for _ in range(30)]
  nested = [_wrap(rng, level1) for _ in range(level2)]
  return (_LEAVES + [acc.RepeatAndSelect(b, d) for b in (G(2.0), acc.PureDp(0.5), acc.ApproxDp(0.5, 1e-6))
                     for d in _DISTS]
          + level1 + nested + [_wrap(rng, nested) for _ in range(level3)]
          # The issue's case: a part with only an RDP curve next to one with none.
          + [dpa.ComposedDpEvent([acc.ApproxDp(1.0, 1e-6),
                                  dpa.dp_event.RepeatAndSelectDpEvent(G(2.0), 3, math.inf)]),
             # A profile that is 1 everywhere composed (dp-accounting's PLDs cannot hold it).
             dpa.SelfComposedDpEvent(acc.UniformCandidates([dpa.NonPrivateDpEvent(), G(2.0)]), 2)])


# Every leaf and selection, 30 events nested once; then 12 nested twice and 3
# three deep (the default suite), or 30 and 8 (`make test-slow`).
EVENTS = _events(level2=12, level3=3)
MORE_EVENTS = _events()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("events", [EVENTS, pytest.param(MORE_EVENTS, marks=pytest.mark.slow)],
                         ids=["default", "more"])
@pytest.mark.parametrize("method", acc.ALL_METHODS)
def test_supports_is_true_exactly_where_the_method_answers(method, events):
  counts = {True: 0, False: 0}
  for event in events:
    name = acc.describe(event)
    acct = acc.make_accountant(method)
    supported = acct.supports(event)
    counts[supported] += 1
    if not supported:
      with pytest.raises(acc.NotApplicableError):
        acc.epsilon(event, 1e-5, method=method)
      continue
    acct.compose(event)
    eps = acct.get_epsilon(1e-5)
    assert isinstance(eps, float) and eps >= 0.0, (name, eps)
    d = acct.get_delta(1.0)
    assert 0.0 <= d <= 1.0, (name, d)
    again = acc.epsilon(event, 1e-5, method=method)
    # The same accountant unless subset tuning moves the orders to integers.
    assert again == eps or acc.api.orders_for(event, None) is not None, (name, eps, again)
  assert counts[True] > 0 and counts[False] > 0, counts


def test_the_issues_composition_is_accounted_by_the_profile_method():
  # (1, 1e-6)-DP next to dp-accounting's repeat-and-select, which has an RDP
  # curve but no PLD: RDP cannot hold the (eps, delta) part, so the profile
  # method composes the selection through the envelope of its RDP profile.
  event = dpa.ComposedDpEvent([acc.ApproxDp(1.0, 1e-6),
                               dpa.dp_event.RepeatAndSelectDpEvent(G(2.0), 3, math.inf)])
  assert acc.ProfileAccountant().supports(event)
  assert {m for m in acc.METHODS if acc.make_accountant(m).supports(event)} == {"profile", "profile-refined"}
  acct = acc.ProfileAccountant().compose(event)
  eps = acct.get_epsilon(1e-5)
  assert "PLD composition" in acct.theorem and acct.get_delta(eps) <= 1e-5
  # Never below the exact epsilon of the (1, 1e-6)-DP part alone (its worst pair).
  assert 1e-6 + (1 - 1e-6) * _rr_delta(1.0, eps) <= 1e-5
  assert acc.epsilon(event, 1e-5) == eps


@pytest.mark.parametrize("base,supported", [(acc.PureDp(0.5), True), (G(2.0), False),
                                            (acc.ApproxDp(0.5, 1e-6), False)], ids=repr)
def test_binomial_with_p_one_is_supported_by_profile_only_for_a_pure_base(base, supported):
  event = acc.RepeatAndSelect(base, acc.Binomial(3, 1.0))
  acct = acc.ProfileAccountant()
  assert acct.supports(event) is supported
  if supported:
    # K = 3 always; KRW Thm 5.7 at p = 1: c = 2 eps1 with eps1 = 0.5.
    assert acct.compose(event).get_epsilon(1e-5) == pytest.approx(
        acc.ProfileAccountant().compose(base).get_epsilon(1e-5 / 3) + 1.0, abs=1e-9)
  else:
    assert "p = 1" in acct.unsupported(event).error_message


# ----------------------------------------------------------------------------- large pure epsilon


def _rr_delta(eps0, eps):
  """Exact profile of eps0-DP's worst pair (randomized response)."""
  return -math.expm1(min(eps - eps0, 0.0)) / (1.0 + math.exp(-eps0))


def _laplace_delta(eps0, eps):
  """Exact profile of the Laplace mechanism with scale 1/eps0, sensitivity 1."""
  return -math.expm1(min(eps - eps0, 0.0) / 2.0)


# pi and 0.1 * 3 are not multiples of the PLD grid (1e-4): the pure 0.30000000000000004
# lies 1e-4 below its rounded-up loss, which the PLD alone reported (0.30008 at 1e-5).
PURE_EVENTS = ([(acc.PureDp(e), e, _rr_delta) for e in (0.1 * 3, math.pi, 50.0, 709.0, 710.0, 1e3, 1e4, 1e6)]
               + [(dpa.LaplaceDpEvent(b), 1.0 / b, _laplace_delta) for b in (1.0, 1e-2, 1.4e-3, 1e-3, 1e-6)])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("event,eps0,exact_delta", PURE_EVENTS, ids=[repr(e) for e, _, _ in PURE_EVENTS])
def test_one_pure_event_is_between_its_exact_curve_and_its_pure_epsilon(event, eps0, exact_delta):
  for method in acc.ALL_METHODS:
    if not acc.make_accountant(method).supports(event):
      with pytest.raises(acc.NotApplicableError):
        acc.epsilon(event, 1e-5, method=method)
      continue
    for delta in (0.9, 0.1, 1e-5, 1e-9, 1e-13, 1e-300):
      eps = acc.epsilon(event, delta, method=method)
      if method == "pld" and delta < FLOOR:
        assert eps == math.inf  # no PLD value is trusted there (documented); "best" answers
        continue
      assert eps <= eps0, (method, delta, eps)
      # Never below the exact epsilon: the exact curve is within delta there.
      assert exact_delta(eps0, eps) <= delta * (1 + 1e-9), (method, delta, eps)


def _built_on(part):
  yield dpa.ComposedDpEvent([part, G(1.0)]), True
  yield dpa.ComposedDpEvent([part, acc.PureDp(0.5)]), True
  yield dpa.SelfComposedDpEvent(part, 3), True
  yield dpa.ComposedDpEvent([acc.RepeatAndSelect(G(2.0), acc.Geometric(mean=3)), part]), True
  for dist in (acc.Poisson(3), acc.Geometric(mean=3), acc.Binomial(4, 0.5), acc.Binomial(3, 1.0),
               acc.Fixed(2), acc.CappedGeometric(0.4, 4)):
    yield acc.RepeatAndSelect(part, dist), False
  yield acc.RandomStopping(part, 0.3), False
  yield acc.RandomStopping(part, 0.3, 5), False
  yield acc.ThresholdSelect(part, 0.3), False
  yield acc.UniformCandidates([part, G(2.0)]), False
  yield acc.SubsampledTuning(acc.RepeatAndSelect(part, acc.Poisson(3)), part, 0.1), False
  yield dpa.ComposedDpEvent([acc.RepeatAndSelect(part, acc.Poisson(3)), G(2.0)]), True


# The first two in the default suite, all four in `make test-slow` (7 s each at most).
BIG = [(acc.PureDp(1e6), 1e6, _rr_delta), (dpa.LaplaceDpEvent(1e-6), 1e6, _laplace_delta),
       pytest.param(acc.PureDp(710.0), 710.0, _rr_delta, marks=pytest.mark.slow),
       pytest.param(dpa.LaplaceDpEvent(1e-3), 1e3, _laplace_delta, marks=pytest.mark.slow)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("part,eps0,exact_delta", BIG,
                         ids=["PureDp(1e6)", "Laplace(1e-6)", "PureDp(710)", "Laplace(1e-3)"])
def test_compositions_and_selections_of_a_large_pure_part_never_crash(part, eps0, exact_delta):
  for event, contains_part in _built_on(part):
    got = _epsilons(event)
    best = acc.epsilon(event, 1e-5)
    assert got and best == min(v for m, v in got.items() if m not in acc.OPT_IN_METHODS)
    assert math.isfinite(best), acc.describe(event)
    if contains_part:
      # The whole release contains the part's output: no valid bound is below the part's exact epsilon.
      for method, eps in got.items():
        assert exact_delta(eps0, eps) <= 1e-5 * (1 + 1e-9), (acc.describe(event), method, eps)


@pytest.mark.parametrize("eps0", [0.8, 5.0, 720.0, 1e6], ids=repr)
def test_envelope_of_a_pure_profile_is_its_randomized_response_pair(eps0):
  # The profile method composes a jaxdp part through this PLD; built from e^eps
  # it overflowed past eps ~ 709.78 and gave a 720-DP part delta 0 (eps 0.0).
  interval = max(1e-4, eps0 / 5e5)
  pld = profile_accountant.envelope_pld(profiles.PureDpProfile(eps0), interval)
  for frac in (0.0, 0.3, 0.9, 0.999, 1.0 - 1e-9, 1.0):
    eps = frac * eps0
    got, exact = pld.get_delta_for_epsilon(eps), _rr_delta(eps0, eps)
    assert exact * (1 - 1e-12) - 1e-15 <= got <= exact + 2 * interval, (eps, got, exact)
