"""Tiny profiles of the training pipelines: seconds on a CPU, every code path of the real ones."""

import dataclasses

from jaxdp.experiments import fig7, kk_fig7

# Papernot-Steinke Fig. 7: 3 learning rates x 2 seeds = 6 logistic regressions of 2 epochs on digits.
FIG7_TINY = dataclasses.replace(fig7.PROFILES["quick"], name="tiny", dataset="digits", model="logreg", epochs=2,
                                batch_size=64, learning_rates=(0.1, 1.0, 10.0), seeds=(0, 1),
                                expected_ks=(1.5, 3, 8))
# Koskela-Kulkarni Fig. 7: one batch size and epoch count, 2 learning rates, 2 targets, 2 repetitions.
KK_FIG7_TINY = dataclasses.replace(kk_fig7.PROFILES["quick"], name="tiny", batch_sizes=(64,), epochs=(2,),
                                   learning_rates=(0.3, 1.0), target_epsilons=(1.0, 3.0), mu=3, q=0.2,
                                   repetitions=2)
