"""Printing a privacy bound without making it look smaller than it is.

Every epsilon and delta jaxdp computes is an upper bound; Python's format specs round
to NEAREST, so `f"{5.2892265:.4f}"` shows 5.2892, below the bound (and below the exact
epsilon of that Gaussian mechanism). `format_epsilon` and `format_delta` round UP in
the last printed digit instead, exactly: when the nearest decimal reads back (float())
below the value, the float's own decimal expansion (`decimal.Decimal(float)` is exact)
is rounded toward +infinity. So float(printed) >= value always; the printed decimal is
below the float by less than half a unit in its last binary place at most (0.1 prints
0.1000), far under the error of any computed bound.

  >>> format_epsilon(5.2892265, ".4f")
  '5.2893'
  >>> format_delta(1.2345e-6, ".3g")
  '1.24e-06'
  >>> format_epsilon(2.5, "10.4f")
  '    2.5000'
"""

import decimal
import math
import re

# A float's exact decimal expansion has at most 767 significant digits; quantize
# needs the context to hold them all, or it raises instead of rounding.
_PRECISION = 1100
_SPEC = re.compile(r"^(?P<width>\d*)(?:\.(?P<digits>\d+))?(?P<kind>[fg])$")


def _round_up(value: float, spec: str) -> str:
  match = _SPEC.match(spec)
  if match is None:
    raise ValueError(f"spec={spec!r} is not a fixed ('f') or general ('g') format spec such as "
                     "'.4f', '10.4f', '.6g' or 'g'")
  nearest = format(value, spec)
  # A decimal whose nearest float is `value` stands for `value` itself: 0.1 and 1e-05
  # print as typed, not as the 0.1001 and 1.00001e-05 that their binary floats (a hair
  # above the decimals) would round up to. inf and nan print as such here too.
  if not math.isfinite(value) or float(nearest) >= value:
    return nearest
  kind = match["kind"]
  digits = int(match["digits"]) if match["digits"] is not None else 6
  exact = decimal.Decimal(value)
  with decimal.localcontext() as context:
    context.prec = _PRECISION
    if kind == "f":
      quantum = decimal.Decimal(1).scaleb(-digits)
    else:
      # 'g' keeps `digits` significant digits: the last one sits `digits - 1` below the first.
      quantum = decimal.Decimal(1).scaleb(exact.adjusted() - max(digits, 1) + 1)
    rounded = exact.quantize(quantum, rounding=decimal.ROUND_CEILING)
  # `rounded` has no more digits than `spec` prints (a carry such as 9.99995 -> 10.000
  # only adds a zero), so formatting the nearest float to it prints `rounded` itself;
  # within a digit of the largest float that rounds to inf, still an upper bound.
  return format(float(rounded), spec)


def format_epsilon(value: float, spec: str = ".4f") -> str:
  """`value` formatted by `spec` ('.4f', '10.4f', '.6g', 'g', ...), rounded up, never down,
  in the last printed digit: float(format_epsilon(v, spec)) >= v. inf and nan print as such."""
  return _round_up(float(value), spec)


def format_delta(value: float, spec: str = "g") -> str:
  """`value` formatted by `spec`, rounded up like `format_epsilon`: a delta shown smaller
  than computed would overstate the guarantee just as a smaller epsilon would."""
  return _round_up(float(value), spec)
