"""Noise calibration over a (sampling rate, epochs) grid (KK Sec. 5)."""

import dp_accounting as dpa
import numpy as np
import pytest

from jaxdp import accounting as acc

OPACUS_ORDERS = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))
DELTA = 1e-5


def _eps(gamma, sigma, steps, orders=OPACUS_ORDERS):
  event = dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(gamma, dpa.GaussianDpEvent(sigma)), steps)
  return dpa.rdp.RdpAccountant(orders).compose(event).get_epsilon(DELTA)


@pytest.mark.parametrize("gamma,steps,target,expected", [
    (128 / 6000, 1875, 1.0, 3.8475),  # REFERENCE 9.7
    (128 / 6000, 1875, 3.0, 1.5818),
    (256 / 6000, 235, 1.0, 2.8572),
])
def test_reference_values_rounded_towards_more_noise(gamma, steps, target, expected):
  rtol = 1e-5
  sigma = float(acc.calibrate_noise_grid(gamma, steps=steps, target_epsilon=target, target_delta=DELTA,
                                         orders=OPACUS_ORDERS, rtol=rtol))
  assert sigma == pytest.approx(expected, abs=1e-4)
  assert _eps(gamma, sigma, steps) <= target  # never above the target
  assert _eps(gamma, sigma / (1 + rtol), steps) > target  # and within tolerance of the smallest


def test_epochs_use_the_trainer_step_rule():
  # The step rule T = ceil(epochs / q): 40 epochs at 128/6000 is 1875; 10 at 256/6000 is ceil(234.375) = 235.
  by_epochs = acc.calibrate_noise_grid([128 / 6000, 256 / 6000], [40, 10], target_epsilon=1.0,
                                       target_delta=DELTA, orders=OPACUS_ORDERS)
  by_steps = acc.calibrate_noise_grid([128 / 6000, 256 / 6000], steps=[1875, 235], target_epsilon=1.0,
                                      target_delta=DELTA, orders=OPACUS_ORDERS)
  np.testing.assert_array_equal(by_epochs, by_steps)
  # Rounding up never gives 0 steps: 0.001 epochs at q = 0.01 is one step.
  assert acc.dpsgd_steps(0.001, 0.01) == 1 and acc.dpsgd_steps(60, 256 / 60000) == 14063


def test_grid_broadcasts_and_is_monotone():
  gammas = np.array([0.01, 0.1])[:, None]
  epochs = np.array([1.0, 3.0, 10.0])[None, :]
  rtol = 1e-4
  sigma = acc.calibrate_noise_grid(gammas, epochs, target_epsilon=2.0, target_delta=DELTA, rtol=rtol)
  assert sigma.shape == (2, 3)
  # More epochs (more steps) and a larger sampling rate both need more noise.
  assert np.all(np.diff(sigma, axis=0) > 0)
  assert np.all(np.diff(sigma, axis=1) > 0)
  for i, g in enumerate(gammas[:, 0]):
    for j, e in enumerate(epochs[0]):
      steps = int(round(e / g))
      # Default orders are those of acc.epsilon(..., "rdp"): check against it.
      ev = acc.dpsgd_event(g, sigma[i, j], steps)
      assert acc.epsilon(ev, DELTA, "rdp") <= 2.0
      assert acc.epsilon(acc.dpsgd_event(g, sigma[i, j] / (1 + rtol), steps), DELTA, "rdp") > 2.0


def test_larger_target_needs_less_noise_and_scalar_gives_0d():
  sigma = acc.calibrate_noise_grid(0.05, 2.0, target_epsilon=[0.5, 1.0, 4.0], target_delta=DELTA)
  assert np.all(np.diff(sigma) < 0)
  single = acc.calibrate_noise_grid(0.05, 2.0, target_epsilon=1.0, target_delta=DELTA)
  assert single.shape == () and float(single) == sigma[1]


def test_unreachable_grid_point_is_named():
  # gamma = 0.01 (100 steps) is reachable with sigma <= 5; gamma = 1 (one full-batch step) is not.
  with pytest.raises(ValueError, match=r"grid point sampling_prob=1\.0, steps=1 \(epochs=1\.0\)"):
    acc.calibrate_noise_grid([0.01, 1.0], 1.0, target_epsilon=0.5, target_delta=DELTA, sigma_max=5.0)


@pytest.mark.parametrize("kwargs,match", [
    (dict(sampling_probs=0.0, epochs=1), "sampling_probs"),
    (dict(sampling_probs=1.5, epochs=1), r"sampling_probs must be in \(0.0, 1.0\]"),
    (dict(sampling_probs=0.1, epochs=0), "epochs"),
    (dict(sampling_probs=0.1, steps=2.5), "steps must be integers"),
    (dict(sampling_probs=0.1), "exactly one of epochs and steps"),
    (dict(sampling_probs=0.1, epochs=1, steps=10), "exactly one of epochs and steps"),
    (dict(sampling_probs=[0.1, 0.2], epochs=[1, 2, 3]), "do not broadcast"),
    (dict(sampling_probs=0.1, epochs=1, target_epsilon=-1.0), "target_epsilon"),
    (dict(sampling_probs=0.1, epochs=1, target_delta=1.0), "target_delta"),
    (dict(sampling_probs=0.1, epochs=1, rtol=0.0), "rtol"),
    (dict(sampling_probs=0.1, epochs=1, orders=[0.5, 2.0]), "orders"),
])
def test_bad_input(kwargs, match):
  kwargs = {"target_epsilon": 1.0, "target_delta": DELTA, **kwargs}
  with pytest.raises(ValueError, match=match):
    acc.calibrate_noise_grid(**kwargs)
