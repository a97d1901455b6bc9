"""Bad input: every public constructor and function raises a ValueError naming the
parameter, its value and the valid range."""

import dp_accounting as dpa
import numpy as np
import pytest

from jaxdp import accounting as acc

GAUSS = dpa.GaussianDpEvent(1.0)


@pytest.mark.parametrize("build,match", [
    (lambda: acc.Poisson(mean=0), r"mean must be in \(0.0, inf\), got 0"),
    (lambda: acc.Poisson(mean=-1), "mean"),
    (lambda: acc.Poisson(mean=float("nan")), "mean must be finite"),
    (lambda: acc.Poisson(mean=float("inf")), "mean must be finite"),
    (lambda: acc.Poisson(mean="10"), "mean must be a real number"),
    (lambda: acc.TruncatedNegativeBinomial(-1, mean=10), r"eta must be in \(-1.0, inf\), got -1"),
    (lambda: acc.TruncatedNegativeBinomial(-1.5, mean=10), "eta"),
    (lambda: acc.TruncatedNegativeBinomial(0.5, gamma=0), r"gamma must be in \(0.0, 1.0\), got 0"),
    (lambda: acc.TruncatedNegativeBinomial(0.5, gamma=1), "gamma"),
    (lambda: acc.TruncatedNegativeBinomial(0.5, mean=1), r"mean must be in \(1.0, inf\), got 1"),
    (lambda: acc.TruncatedNegativeBinomial(0.5, mean=0.5), "mean"),
    (lambda: acc.TruncatedNegativeBinomial(0.5), "exactly one of mean, gamma"),
    (lambda: acc.TruncatedNegativeBinomial(0.5, mean=3, gamma=0.5), "exactly one of mean, gamma"),
    (lambda: acc.Geometric(mean=0.9), "mean"),
    (lambda: acc.Logarithmic(mean=float("nan")), "mean must be finite"),
    (lambda: acc.Binomial(0, 0.5), r"n must be an integer in \[1, inf\), got 0"),
    (lambda: acc.Binomial(2.5, 0.5), "n must be an integer"),
    (lambda: acc.Binomial(3, 0), r"p must be in \(0.0, 1.0\], got 0"),
    (lambda: acc.Binomial(3, 1.5), "p"),
    (lambda: acc.Fixed(0), "k must be an integer"),
    (lambda: acc.PureDp(-0.1), r"epsilon must be in \[0.0, inf\), got -0.1"),
    (lambda: acc.PureDp(float("inf")), "epsilon must be finite"),
    (lambda: acc.Zcdp(-1), "rho"),
    (lambda: acc.RdpCurve([1.0, 2.0], [0.1, 0.2]), r"every entry of orders must be in \(1.0, inf\)"),
    (lambda: acc.RdpCurve([2.0, 3.0], [0.1]), "same length"),
    (lambda: acc.RdpCurve([2.0, 3.0], [0.1, float("nan")]), "finite"),
    (lambda: acc.RdpCurve([2.0, 2.0], [0.1, 0.2]), "distinct"),
    (lambda: acc.RdpCurve([2.0, 3.0], [-0.1, 0.2]), "values"),
    (lambda: acc.RepeatAndSelect(GAUSS, 10), "distribution"),
    (lambda: acc.RepeatAndSelect("gaussian", acc.Poisson(3)), "base must be"),
])
def test_constructors_reject_bad_input(build, match):
  with pytest.raises(ValueError, match=match):
    build()


EV = acc.RepeatAndSelect(GAUSS, acc.Poisson(mean=3))


@pytest.mark.parametrize("call,match", [
    (lambda: acc.epsilon(EV, 0), r"delta must be in \(0.0, 1.0\), got 0"),
    (lambda: acc.epsilon(EV, 1.0), "delta"),
    (lambda: acc.epsilon(EV, float("nan")), "delta must be finite"),
    (lambda: acc.epsilon(EV, 1e-5, method="magic"), "method must be one of"),
    (lambda: acc.epsilon(EV, 1e-5, orders=[1.0, 2.0]), "orders"),
    (lambda: acc.epsilon(EV, 1e-5, orders=[0.5]), "orders"),
    (lambda: acc.epsilon(EV, 1e-5, orders=[]), "non-empty"),
    (lambda: acc.epsilon(EV, 1e-5, orders=[2.0, float("inf")]), "finite"),
    (lambda: acc.epsilon(EV, 1e-5, orders=[[2.0, 3.0]]), "1-D"),
    (lambda: acc.delta(EV, -1.0), r"epsilon must be in \[0.0, inf\), got -1.0"),
    (lambda: acc.delta(EV, float("inf")), "epsilon must be finite"),
    (lambda: acc.report(EV, 2.0), "delta"),
    (lambda: acc.epsilon("not an event", 1e-5), "base must be"),
    (lambda: acc.success_probability(acc.Poisson(3), 1.5), "p_good"),
    (lambda: acc.expected_quantile("poisson"), "distribution"),
    (lambda: acc.tail_bound(acc.Poisson(3), -1), "k must be"),
    (lambda: acc.Poisson(3).sample("seed", 3), "rng must be"),
    (lambda: acc.tnb_gamma_from_mean(0.5, 1.0), "mean"),
])
def test_functions_reject_bad_input(call, match):
  with pytest.raises(ValueError, match=match):
    call()


@pytest.mark.parametrize("base", [dpa.UnsupportedDpEvent(), dpa.SampledWithoutReplacementDpEvent(100, 10, GAUSS)],
                         ids=["unsupported", "sampled-without-replacement"])
def test_unsupported_base_has_its_own_exception_type(base):
  # Events are data: an unaccountable base is refused when accounted, by every method.
  event = acc.RepeatAndSelect(base, acc.Poisson(3))
  for method in acc.ALL_METHODS:
    assert not acc.make_accountant(method).supports(event)
    with pytest.raises(acc.UnsupportedBaseError, match="cannot account"):
      acc.epsilon(event, 1e-5, method)
  assert issubclass(acc.UnsupportedBaseError, ValueError)


def test_pgf_rejects_nan_and_divergent_arguments():
  with pytest.raises(ValueError, match="NaN"):
    acc.Poisson(3).pgf(np.nan)
  with pytest.raises(ValueError, match="diverges"):
    acc.Geometric(mean=2).pgf(2.5)
