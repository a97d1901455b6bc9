"""Privacy accounting for differentially private hyperparameter tuning.

Run a DP training K ~ D times and release only the best run: what (eps, delta)
does the whole search satisfy?

  >>> import dp_accounting as dpa
  >>> from jaxdp import accounting as acc
  >>> base = dpa.SelfComposedDpEvent(
  ...     dpa.PoissonSampledDpEvent(256 / 60000, dpa.GaussianDpEvent(1.1)), 14063)
  >>> ev = acc.RepeatAndSelect(base, acc.Poisson(mean=10))
  >>> round(acc.epsilon(ev, delta=1e-5, method="rdp"), 4)
  5.7489
"""

from jaxdp.accounting.accountant import ALL_METHODS
from jaxdp.accounting.accountant import delta
from jaxdp.accounting.accountant import epsilon
from jaxdp.accounting.accountant import guarantee
from jaxdp.accounting.accountant import Guarantee
from jaxdp.accounting.accountant import MethodResult
from jaxdp.accounting.accountant import METHODS
from jaxdp.accounting.accountant import NotApplicableError
from jaxdp.accounting.accountant import rdp_curve
from jaxdp.accounting.accountant import Report
from jaxdp.accounting.accountant import report
from jaxdp.accounting.calibration import calibrate_noise_grid
from jaxdp.accounting.distributions import Binomial
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
from jaxdp.accounting.events import RepeatAndSelect
from jaxdp.accounting.guarantees import ApproxDp
from jaxdp.accounting.guarantees import DEFAULT_ORDERS
from jaxdp.accounting.guarantees import PureDp
from jaxdp.accounting.guarantees import RdpCurve
from jaxdp.accounting.guarantees import ReportNoisyMax
from jaxdp.accounting.guarantees import UnsupportedBaseError
from jaxdp.accounting.guarantees import Zcdp
from jaxdp.accounting.inverse import calibrate_noise
from jaxdp.accounting.inverse import dpsgd_event
from jaxdp.accounting.inverse import max_mean
from jaxdp.accounting.liu_talwar import CappedGeometric
from jaxdp.accounting.liu_talwar import RandomStopping
from jaxdp.accounting.liu_talwar import ThresholdSelect
from jaxdp.accounting.profiles import base_profile
from jaxdp.accounting.profiles import PrivacyProfile
from jaxdp.accounting.subsampled import parallel_composition
from jaxdp.accounting.subsampled import SubsampledTuning
from jaxdp.accounting.subsampled import UniformCandidates
