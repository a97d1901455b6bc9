"""DP-SGD training of any task: per-example clipping, Gaussian noise, Poisson sampling, runs.

Its modules::

  task         Task (any Flax module / init-apply pair, per-example loss over
               a batch pytree, score, optax optimizer factory), Model,
               HParams, the DP scores NoisyMean and DpScore.
  presets      the papers' classifiers as ready-made tasks.
  plan         DpSgdPlan: clipped gradients carrying their sensitivity, the
               noise that reads it, Poisson sampling and the DpEvent, from
               one object.
  clipping     per_example_grads, clip_per_example, clipped_grad_sum and the
               optax transform clip_per_example_l2, clipped against NormBounds
               that hold after float32 rounding (clip_scales).
  ghost        ghost clipping: the same clipped sum without per-example
               gradients of Embed/Dense/DenseGeneral/Conv layers, everywhere (Task(clipping='ghost'))
               or where a cost model says it pays (Task(clipping='auto'), the default).
  microbatching  the automatic microbatch size of the per-example path.
  noise        add_gaussian_noise, normalize_by_expected_batch_size (optax).
  sampling     Poisson subsampling with static padded shapes.
  config       TrainConfig (a candidate: task, privacy, hyperparameters),
               ExecutionConfig, epsilon of one run.
  program      LoopSpec and the pure programs (train loop, scoring, one
               candidate), compiled once per spec.
  checks       shape checks of a task against its data, before any work.
  schedules    optax's learning-rate schedules with a traced peak
               (`schedules.warmup_cosine(hp["learning_rate"], 10, hp.num_steps)`).
  trainer      train_candidate and its CandidateResult.
"""

from jaxdp.train import presets
from jaxdp.train import schedules
from jaxdp.train.clipping import (ClipScales, ClipState, NormBound, clip_per_example, clip_scales, clip_per_example_l2,
                                  clipped_grad_sum, gradient_bound, per_example_global_norms,
                                  per_example_grads, weighted_sum)
from jaxdp.train.ghost import ghost_clipped_grad_sum
from jaxdp.train.ghost_analysis import GhostLayer, GhostSplit, ghost_layers
from jaxdp.train.microbatching import auto_microbatch_size, per_example_bytes
from jaxdp.train.noise import (ExpectedBatchState, GaussianNoiseState, add_gaussian_noise,
                               normalize_by_expected_batch_size)
from jaxdp.train.plan import ClippedGrad, DpSgdPlan
from jaxdp.train.sampling import (default_padded_batch_size, poisson_batch_sum, poisson_mask,
                                  sampled_indices)
from jaxdp.train.task import (CLIPPING_METHODS, DpScore, HParams, Model, NoisyMean, Task, keep_hparams,
                              scale_learning_rate)
from jaxdp.train.checks import check_task
from jaxdp.train.config import (CONFIG_FIELDS, EPSILON_METHOD, ExecutionConfig, NotPrivateWarning,
                                TrainConfig, UncheckedHparamsWarning, epsilon)
from jaxdp.train.program import LoopOutput, build_evaluate, build_train_loop, init_params
from jaxdp.train.loop_spec import LoopSpec
from jaxdp.train.trainer import CandidateResult, train_candidate
from jaxdp.train import digest  # program digests: what a durable pool records of a candidate's code

__all__ = [
    "CLIPPING_METHODS", "CONFIG_FIELDS", "GhostLayer", "GhostSplit", "auto_microbatch_size",
    "ghost_clipped_grad_sum", "ghost_layers", "per_example_bytes", "CandidateResult", "ClipState", "ClippedGrad", "DpScore", "DpSgdPlan",
    "ExecutionConfig", "ExpectedBatchState", "GaussianNoiseState", "HParams", "LoopOutput",
    "LoopSpec", "Model", "NoisyMean", "NotPrivateWarning", "Task", "TrainConfig", "UncheckedHparamsWarning",
    "add_gaussian_noise", "build_evaluate", "build_train_loop", "check_task", "ClipScales", "NormBound", "clip_scales", "gradient_bound",
    "clip_per_example", "clip_per_example_l2", "clipped_grad_sum", "default_padded_batch_size",
    "EPSILON_METHOD", "epsilon", "init_params", "keep_hparams", "normalize_by_expected_batch_size",
    "per_example_global_norms", "per_example_grads", "poisson_batch_sum", "poisson_mask",
    "presets", "sampled_indices", "schedules", "scale_learning_rate", "train_candidate", "weighted_sum",
]
