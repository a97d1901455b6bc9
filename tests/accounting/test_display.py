"""A printed epsilon or delta is never below the computed one (adversarial review F2:
`f"{5.2892265:10.4f}"` printed 5.2892, under the exact Gaussian epsilon 5.2892265)."""

import math
import re

import dp_accounting as dpa
import numpy as np
import pytest
from scipy import optimize, stats

from jaxdp import accounting as acc
from jaxdp import cli

SPECS = [".4f", "10.4f", "9.4f", ".3f", ".0f", ".6g", "g", ".4g", ".3g", ".1g"]


def _values():
  rng = np.random.default_rng(0)
  spread = 10.0 ** rng.uniform(-320, 300, size=3000)                 # tiny to huge
  common = rng.uniform(0.0, 20.0, size=3000)                         # where epsilons live
  on_grid = np.round(rng.uniform(0.0, 20.0, size=1000), 4)           # exactly "printable" ones
  beside = np.concatenate([np.nextafter(on_grid, np.inf), np.nextafter(on_grid, -np.inf)])
  special = [0.0, 5e-324, 2.2250738585072014e-308, 1e-5, 0.1, 0.3, 2.5, 5.2892265, 9.99995, 9.999995,
             0.30000000000000004, 1e300, 1.7976931348623157e308, 123456.5, 0.5e-4]
  return [float(v) for v in np.concatenate([spread, common, on_grid, beside, special])]


@pytest.mark.parametrize("spec", SPECS)
def test_the_printed_value_is_never_below_the_value_and_at_most_one_digit_above(spec):
  digits = int(re.search(r"\.(\d+)", spec).group(1)) if "." in spec else 6
  for value in _values():
    for fmt in (acc.format_epsilon, acc.format_delta):
      shown = fmt(value, spec)
      assert float(shown) >= value, (value, spec, shown)
      nearest = format(value, spec)
      if float(nearest) >= value:
        assert shown == nearest, (value, spec, shown)  # already an upper bound: printed as usual
        continue
      if value > 1e308:  # one digit up overflows the largest float: inf, still an upper bound
        assert shown.strip() == "inf", (value, spec, shown)
        continue
      # Otherwise one unit up in the last printed digit, no more.
      if spec.endswith("f"):
        unit = 10.0 ** -digits
      else:
        unit = 10.0 ** (math.floor(math.log10(value)) - max(digits, 1) + 1)
      assert float(shown) - value <= unit * (1 + 1e-9), (value, spec, shown)
      if spec.endswith("f"):  # as many decimals as the spec asks, right-aligned to its width
        assert len(shown.partition(".")[2]) == digits and len(shown) >= len(nearest), (value, spec, shown)


def test_exact_values_print_as_typed_and_inf_nan_as_such():
  assert acc.format_epsilon(2.5, "10.4f") == "    2.5000"
  assert acc.format_epsilon(0.1, ".4f") == "0.1000"
  assert acc.format_delta(1e-5) == "1e-05"
  assert acc.format_epsilon(5.2892265, ".4f") == "5.2893"
  assert acc.format_epsilon(5.2892265, ".6g") == "5.28923"
  assert acc.format_epsilon(9.999995, ".6g") == "10"
  assert acc.format_delta(1.2345e-6, ".3g") == "1.24e-06"
  assert acc.format_epsilon(math.inf, "10.4f") == "       inf"
  assert acc.format_epsilon(math.nan, ".6g") == "nan"
  assert acc.format_delta(math.inf) == "inf"


def test_a_spec_that_is_not_fixed_or_general_is_refused():
  for spec in ("%", ".4e", "d", "x.4f"):
    with pytest.raises(ValueError, match=r"spec="):
      acc.format_epsilon(1.0, spec)


def _gaussian_exact(sigma, delta):
  """Balle-Wang's exact epsilon of the Gaussian mechanism (sensitivity 1) at `delta`."""
  def gap(eps):
    return (stats.norm.cdf(0.5 / sigma - eps * sigma)
            - math.exp(eps) * stats.norm.cdf(-0.5 / sigma - eps * sigma)) - delta
  return optimize.brentq(gap, 0.0, 50.0, xtol=1e-14)


def _printed_epsilons(table):
  """The epsilon column of a cross-check or report table."""
  rows = re.findall(r"^\S+(?: \S+)?(?: \*)?\s+(\d+\.\d{4})  ", table, flags=re.M)
  assert rows, table
  return [float(r) for r in rows]


def test_no_printed_row_of_the_gaussian_sweep_is_below_the_exact_epsilon():
  # The review's sweep: 44 of its 210 printed cross-check rows were below exact before.
  delta = 1e-5
  for sigma in [0.8 + 0.05 * i for i in range(30)]:
    exact = _gaussian_exact(sigma, delta)
    event = dpa.GaussianDpEvent(sigma)
    check = acc.cross_check(event, delta)
    assert len(_printed_epsilons(str(check))) == sum(r.applies for r in check.rows)
    assert min(_printed_epsilons(str(check))) >= exact, (sigma, str(check))
    assert min(_printed_epsilons(str(acc.report(event, delta)))) >= exact, sigma


def test_the_cli_prints_epsilon_and_delta_rounded_up(capsys):
  sigma, delta = 0.8500000000000001, 1e-5  # the review's case: exact epsilon 5.2892265...
  exact = _gaussian_exact(sigma, delta)
  assert cli.main(["account", "--base", f"gaussian:sigma={sigma!r}", "--method", "pld"]) == 0
  line = capsys.readouterr().out
  value = acc.epsilon(dpa.GaussianDpEvent(sigma), delta, method="pld")
  assert line.startswith(f"epsilon = {acc.format_epsilon(value, '.6g')}  (pld, delta=1e-05)"), line
  assert float(line.split()[2]) >= max(value, exact), line
  assert cli.main(["account", "--base", f"gaussian:sigma={sigma!r}", "--epsilon", "5.2", "--method", "pld"]) == 0
  line = capsys.readouterr().out
  value = acc.delta(dpa.GaussianDpEvent(sigma), 5.2, method="pld")
  assert line == f"delta = {acc.format_delta(value, '.6g')}  (pld)\n"
  assert float(line.split()[2]) >= value, line
