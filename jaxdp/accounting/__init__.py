"""Privacy accounting for differentially private hyperparameter tuning.

Run a DP training K ~ D times and release only the best run: what (eps, delta)
does the whole search satisfy, alone and composed with everything else released?
Every jaxdp event is a `dp_accounting.DpEvent`; every method is a
`dp_accounting.PrivacyAccountant`.

  >>> import dp_accounting as dpa
  >>> from jaxdp import accounting as acc
  >>> run = acc.dpsgd_event(256 / 60000, 1.1, acc.dpsgd_steps(60, 256 / 60000))  # 14063 steps
  >>> tune = acc.RepeatAndSelect(run, acc.Poisson(mean=10))
  >>> acc.format_epsilon(acc.epsilon(tune, delta=1e-5, method="rdp"))  # rounded up, never down
  '5.7490'
  >>> acct = acc.RdpSelectionAccountant().compose(dpa.ComposedDpEvent([tune, run]))
"""

from jaxdp.accounting._dpa import DEFAULT_ORDERS
from jaxdp.accounting.api import ALL_METHODS
from jaxdp.accounting.api import BestAccountant
from jaxdp.accounting.api import delta
from jaxdp.accounting.api import epsilon
from jaxdp.accounting.api import make_accountant
from jaxdp.accounting.api import MethodResult
from jaxdp.accounting.api import METHODS
from jaxdp.accounting.api import OPT_IN_METHODS
from jaxdp.accounting.api import rdp_curve
from jaxdp.accounting.api import Report
from jaxdp.accounting.api import report
from jaxdp.accounting.calibration import calibrate_noise_grid
from jaxdp.accounting.cross_checking import cross_check
from jaxdp.accounting.cross_checking import CrossCheck
from jaxdp.accounting.cross_checking import CrossCheckRow
from jaxdp.accounting.display import format_delta
from jaxdp.accounting.display import format_epsilon
from jaxdp.accounting.distributions import Binomial
from jaxdp.accounting.distributions import CappedGeometric
from jaxdp.accounting.distributions import expected_quantile
from jaxdp.accounting.distributions import Fixed
from jaxdp.accounting.distributions import Geometric
from jaxdp.accounting.distributions import KDistribution
from jaxdp.accounting.distributions import Logarithmic
from jaxdp.accounting.distributions import Poisson
from jaxdp.accounting.distributions import success_probability
from jaxdp.accounting.distributions import tail_bound
from jaxdp.accounting.distributions import tnb_gamma_from_mean
from jaxdp.accounting.distributions import TruncatedNegativeBinomial
from jaxdp.accounting.events import ApproxDp
from jaxdp.accounting.events import describe
from jaxdp.accounting.events import dpsgd_event
from jaxdp.accounting.events import dpsgd_steps
from jaxdp.accounting.events import NotApplicableError
from jaxdp.accounting.events import PureDp
from jaxdp.accounting.events import RandomStopping
from jaxdp.accounting.events import RdpCurve
from jaxdp.accounting.events import RepeatAndSelect
from jaxdp.accounting.events import ReportNoisyMax
from jaxdp.accounting.events import SelectionWithCount
from jaxdp.accounting.events import SubsampledTuning
from jaxdp.accounting.events import ThresholdSelect
from jaxdp.accounting.events import UniformCandidates
from jaxdp.accounting.events import UnsupportedBaseError
from jaxdp.accounting.events import Zcdp
from jaxdp.accounting.inverse import calibrate_noise
from jaxdp.accounting.inverse import max_mean
from jaxdp.accounting.inverse import noise_for
from jaxdp.accounting.inverse import Plan
from jaxdp.accounting.inverse import plan
from jaxdp.accounting.inverse import PlanRow
from jaxdp.accounting.liu_talwar import LiuTalwarAccountant
from jaxdp.accounting.pld_accountant import PldAccountant
from jaxdp.accounting.profile_accountant import ProfileAccountant
from jaxdp.accounting.profiles import PrivacyProfile
from jaxdp.accounting.rdp_accountant import CompositionAccountant
from jaxdp.accounting.rdp_accountant import RdpSelectionAccountant
from jaxdp.accounting.subsampled import parallel_composition

__all__ = ["ALL_METHODS", "ApproxDp", "BestAccountant", "Binomial", "CappedGeometric",
           "CompositionAccountant", "CrossCheck", "CrossCheckRow", "DEFAULT_ORDERS", "Fixed", "Geometric",
           "KDistribution", "LiuTalwarAccountant", "Logarithmic", "MethodResult", "METHODS",
           "NotApplicableError", "OPT_IN_METHODS", "Plan", "PlanRow", "PldAccountant", "Poisson",
           "PrivacyProfile", "ProfileAccountant", "PureDp", "RandomStopping", "RdpCurve",
           "RdpSelectionAccountant", "RepeatAndSelect", "Report", "ReportNoisyMax", "SelectionWithCount",
           "SubsampledTuning", "ThresholdSelect", "TruncatedNegativeBinomial", "UniformCandidates",
           "UnsupportedBaseError", "Zcdp", "calibrate_noise", "calibrate_noise_grid", "cross_check", "delta",
           "describe", "dpsgd_event", "dpsgd_steps", "epsilon", "expected_quantile", "format_delta",
           "format_epsilon", "make_accountant",
           "max_mean", "noise_for", "parallel_composition", "plan", "rdp_curve", "report",
           "success_probability", "tail_bound", "tnb_gamma_from_mean"]
