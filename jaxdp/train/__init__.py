"""DP-SGD training: per-example clipping, Gaussian noise, Poisson sampling, runs.

Composable pieces:
  clipping     per_example_grads, clip_per_example, clipped_grad_sum and the
               optax transform clip_per_example_l2.
  noise        add_gaussian_noise, normalize_by_expected_batch_size (optax).
  optimizers   dp_sgd, dp_adam (optax chains over clipped gradient sums).
  sampling     Poisson subsampling with static padded shapes.
  trainer      TrainConfig, train_candidate, dp_event and the pure inner loop.
"""

from jaxdp.train.clipping import (ClipState, clip_factors, clip_per_example, clip_per_example_l2,
                                  clipped_grad_sum, per_example_global_norms, per_example_grads,
                                  weighted_sum)
from jaxdp.train.noise import (ExpectedBatchState, GaussianNoiseState, add_gaussian_noise,
                               normalize_by_expected_batch_size)
from jaxdp.train.optimizers import dp_adam, dp_sgd
from jaxdp.train.sampling import (default_padded_batch_size, poisson_batch_sum, poisson_mask,
                                  sampled_indices)
from jaxdp.train.trainer import (OPTIMIZERS, CandidateResult, ExecutionConfig, HParams, LoopOutput,
                                 LoopSpec, NotPrivateWarning, TrainConfig, build_evaluate, build_train_loop,
                                 check_model_input, dp_event, epsilon, init_params,
                                 train_candidate)

__all__ = [
    "OPTIMIZERS", "CandidateResult", "ClipState", "ExecutionConfig", "ExpectedBatchState",
    "GaussianNoiseState", "HParams", "LoopOutput", "LoopSpec", "NotPrivateWarning", "TrainConfig",
    "add_gaussian_noise", "build_evaluate", "build_train_loop", "check_model_input",
    "clip_factors", "clip_per_example", "clip_per_example_l2", "clipped_grad_sum",
    "default_padded_batch_size", "dp_adam", "dp_event", "dp_sgd", "epsilon", "init_params",
    "normalize_by_expected_batch_size", "per_example_global_norms", "per_example_grads",
    "poisson_batch_sum", "poisson_mask", "sampled_indices", "train_candidate", "weighted_sum",
]
