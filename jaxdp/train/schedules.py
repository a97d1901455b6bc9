"""Learning-rate schedules whose peak may be a traced hyperparameter.

optax builds some schedules with Python control flow on their values
(`optax.warmup_cosine_decay_schedule` compares its peak with 0.0,
`optax.exponential_decay` checks its rate), so a learning rate handed to them
must be a concrete number: jaxdp then makes it static, one compilation per
value. The schedules here are optax's own, built with peak 1.0 and every other
argument a Python constant, then multiplied by the peak at each step:

    schedule(t) = peak * unit_schedule(t)

`peak` may be a tracer, so the learning rate stays traced and a grid of
learning rates shares one compiled program:

    optimizer=lambda hp: optax.sgd(jaxdp.train.schedules.warmup_cosine(
        hp["learning_rate"], warmup_steps=100, decay_steps=hp.num_steps))

(`hp.num_steps` is the run's planned number of DP steps, see
`jaxdp.train.HParams.num_steps`.) The values equal optax's schedule with that
peak up to float rounding (a relative 1e-6 in float32).
"""

from __future__ import annotations

from typing import Any, Callable

import optax

Schedule = Callable[[Any], Any]


def scaled(peak: Any, unit_schedule: Schedule) -> Schedule:
  """The schedule t -> peak * unit_schedule(t); `peak` may be traced.

  `unit_schedule` is any schedule of peak 1.0 built from Python constants,
  e.g. `optax.cosine_decay_schedule(1.0, decay_steps=1000)`.
  """
  if not callable(unit_schedule):
    raise ValueError(f"unit_schedule must be a schedule step -> value (e.g. "
                     f"optax.cosine_decay_schedule(1.0, 1000)), got {unit_schedule!r}")

  def schedule(count):
    return peak * unit_schedule(count)
  return schedule


def warmup_cosine(peak: Any, warmup_steps: int, decay_steps: int, *, init_fraction: float = 0.0,
                  end_fraction: float = 0.0, exponent: float = 1.0) -> Schedule:
  """`optax.warmup_cosine_decay_schedule(init_fraction * peak, peak, warmup_steps, decay_steps,
  end_fraction * peak, exponent)` with a peak that may be traced.

  As in optax, `decay_steps` is the schedule's whole length, warmup included
  (e.g. `hp.num_steps`).
  """
  return scaled(peak, optax.warmup_cosine_decay_schedule(
      float(init_fraction), 1.0, warmup_steps, decay_steps, float(end_fraction), float(exponent)))


def cosine_decay(peak: Any, decay_steps: int, *, end_fraction: float = 0.0,
                 exponent: float = 1.0) -> Schedule:
  """`optax.cosine_decay_schedule(peak, decay_steps, alpha=end_fraction, exponent)` with a peak
  that may be traced."""
  return scaled(peak, optax.cosine_decay_schedule(1.0, decay_steps, float(end_fraction), float(exponent)))


def linear(peak: Any, transition_steps: int, *, init_fraction: float = 1.0, end_fraction: float = 0.0,
           transition_begin: int = 0) -> Schedule:
  """`optax.linear_schedule(init_fraction * peak, end_fraction * peak, transition_steps,
  transition_begin)` with a peak that may be traced (default: from peak down to 0)."""
  return scaled(peak, optax.linear_schedule(float(init_fraction), float(end_fraction), transition_steps,
                                            transition_begin))


def exponential_decay(peak: Any, transition_steps: int, decay_rate: float, *, transition_begin: int = 0,
                      staircase: bool = False) -> Schedule:
  """`optax.exponential_decay(peak, transition_steps, decay_rate, transition_begin, staircase)` with a
  peak that may be traced (`decay_rate` is a Python constant: optax checks it)."""
  return scaled(peak, optax.exponential_decay(1.0, transition_steps, decay_rate, transition_begin,
                                              staircase))
