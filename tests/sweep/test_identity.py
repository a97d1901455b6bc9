"""A training function's identity follows its behaviour (`jaxdp.sweep.identity`, issue 42).

A user fixes their function and reruns on the same `run_dir`: each scenario below changed what
the function computes while its identity stayed the same, so the stored candidates of the old
function were released with the new one's epsilon. Each is now told apart, and the unchanged
function still resumes.
"""

import functools
import importlib.util
import sys
import textwrap
import warnings

import jax
import numpy as np
import pytest

from examples import dp_logistic_regression as ex
from jaxdp import accounting as acc
from jaxdp.sweep import SearchMismatchError
from jaxdp.sweep.identity import UNIDENTIFIED, function_identity
from jaxdp.tuning import RunConfig, TrainFunction, random_search

GRID = {"learning_rate": [0.3, 1.0], "l2_clip_norm": [0.5], "sampling_prob": [0.1], "steps": [20],
        "noise_multiplier": [4.0]}


@pytest.fixture
def modules(tmp_path, monkeypatch):
  """Writes and imports the user's modules (files on disk, as a project's are); `load(name,
  source)` (re)imports one, as a new process would after an edit."""
  monkeypatch.syspath_prepend(str(tmp_path))
  loaded = []

  def load(name, source):
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loaded.append(name)
    spec.loader.exec_module(module)
    return module
  yield load
  for name in loaded:
    sys.modules.pop(name, None)


def _identities(modules, versions, train_module, train_source):
  """The identity of `train_module.train_fn` with each version of the other modules loaded."""
  out = []
  for version in versions:
    for name, source in version.items():
      modules(name, source)
    out.append(function_identity(modules(train_module, train_source).train_fn))
  return out


TRAIN_READS = """
    import {module}
    from {module} import {name}

    def train_fn(hparams, seed):
      return float({use}), None
"""


def test_a_module_level_partial_whose_bound_value_changed(modules):
  step = "import functools\ndef _step(x, lr):\n  return x * lr\nstep = functools.partial(_step, lr={lr})\n"
  same, same_again, changed = _identities(
      modules, [{"cfg_partial": step.format(lr=0.1)}, {"cfg_partial": step.format(lr=0.1)},
                {"cfg_partial": step.format(lr=0.2)}],
      "train_partial", TRAIN_READS.format(module="cfg_partial", name="step", use="step(1.0)"))
  assert same == same_again and same != changed and UNIDENTIFIED not in same


def test_a_callable_object_from_another_module_whose_attributes_changed(modules):
  source = "class Trainer:\n  def __init__(self, lr):\n    self.lr = lr\n  def __call__(self, x):\n    return x * self.lr\ntrainer = Trainer({lr})\n"
  same, same_again, changed = _identities(
      modules, [{"cfg_object": source.format(lr=0.1)}, {"cfg_object": source.format(lr=0.1)},
                {"cfg_object": source.format(lr=0.2)}],
      "train_object", TRAIN_READS.format(module="cfg_object", name="trainer", use="trainer(1.0)"))
  assert same == same_again and same != changed


def test_an_attribute_of_an_imported_config_module(modules):
  train = "import cfg_module\n\ndef train_fn(hparams, seed):\n  return cfg_module.LR * cfg_module.train.steps, None\n"
  config = "import types\nLR = {lr}\ntrain = types.SimpleNamespace(steps={steps})\nUNREAD = {unread}\n"
  base, unread_changed, lr_changed, nested_changed = _identities(
      modules, [{"cfg_module": config.format(lr=0.1, steps=5, unread=0)},
                {"cfg_module": config.format(lr=0.1, steps=5, unread=1)},
                {"cfg_module": config.format(lr=0.2, steps=5, unread=0)},
                {"cfg_module": config.format(lr=0.1, steps=6, unread=0)}], "train_module", train)
  # A module is recorded whole: the code that reads it may be elsewhere (a helper given `cfg`), so
  # even an attribute train_fn never names refuses a resume (safe, if conservative).
  assert base != unread_changed and base != lr_changed and base != nested_changed


@pytest.mark.parametrize("reach", [
    "def train_fn(hparams, seed):\n  import cfg_reach\n  return cfg_reach.LR, None\n",
    "import cfg_reach\ndef train_fn(hparams, seed, cfg=cfg_reach):\n  return cfg.LR, None\n",
    "import functools, cfg_reach\ndef _f(hparams, seed, cfg):\n  return cfg.LR, None\n"
    "train_fn = functools.partial(_f, cfg=cfg_reach)\n",
    "import cfg_reach\ndef _read(cfg):\n  return cfg.LR\n"
    "def train_fn(hparams, seed):\n  return _read(cfg_reach), None\n",
    "import cfg_reach\ndef train_fn(hparams, seed):\n  return getattr(cfg_reach, 'LR'), None\n",
], ids=["local-import", "default", "partial", "helper", "constant-getattr"])
def test_a_config_module_however_it_is_reached(modules, reach):
  """(A second review's finding: a module reached otherwise than `global.attr` was recorded
  by name.)"""
  first, again, changed = _identities(
      modules, [{"cfg_reach": "LR = 0.1\n"}, {"cfg_reach": "LR = 0.1\n"}, {"cfg_reach": "LR = 0.5\n"}],
      "train_reach", reach)
  assert first == again != changed and UNIDENTIFIED not in first


def test_a_custom_vjp_rule_is_part_of_it(modules):
  """Where custom clipping or noise lives: `jax.custom_vjp`'s `bwd`."""
  source = ("import jax\n@jax.custom_vjp\ndef clip(x):\n  return x\n"
            "clip.defvjp(lambda x: (x, None), lambda r, g: (g * {scale},))\n"
            "def train_fn(hparams, seed):\n  return float(jax.grad(clip)(1.0)), None\n")
  zero, again, one = (function_identity(modules("train_vjp", source.format(scale=s)).train_fn)
                      for s in ("0.0", "0.0", "1.0"))
  assert zero == again != one


def test_a_callable_object_whose_class_has_no_source_and_whose_call_changed():
  """A class defined by `exec` (or in a notebook cell): no source file to hash, only code."""
  def make(body):
    scope = {"__name__": "__main__"}
    exec(textwrap.dedent(f"""
        class Train:
          def __call__(self, hparams, seed):
            return {body}, None
        train = Train()
    """), scope)  # pylint: disable=exec-used
    return scope["train"]
  first, again, changed = make("0.5"), make("0.5"), make("0.75")
  assert function_identity(first)["source_sha256"] is None
  assert function_identity(first) == function_identity(again) != function_identity(changed)


def test_a_monkeypatched_call():
  class Train:
    def __call__(self, hparams, seed):
      return 0.5, None
  train = Train()
  before = function_identity(train)
  Train.__call__ = lambda self, hparams, seed: (0.75, None)
  assert function_identity(train) != before


def test_a_method_a_callable_object_calls_is_part_of_it():
  class Train:
    def __call__(self, hparams, seed):
      return self.score(), None

    def score(self):
      return 0.5
  before = function_identity(Train())
  Train.score = lambda self: 0.75
  assert function_identity(Train()) != before


def test_library_code_is_recorded_by_name_and_deep_user_code_is_never_resumed():
  def uses_numpy(hparams, seed):
    return float(np.mean([1.0])), None
  reads = function_identity(uses_numpy)["held"]
  assert ["np", ["module", "numpy"]] in reads[1][3][1]  # a library module read: by name
  last = lambda: 0.0
  for _ in range(12):  # each calls the one before: deeper than DEPTH
    last = (lambda f: lambda: f())(last)
  identity = function_identity(lambda hparams, seed: (last(), None))
  assert UNIDENTIFIED in identity and "calls deep" in identity[UNIDENTIFIED]


def test_a_run_dir_refuses_the_function_after_its_config_module_changed(modules, tmp_path):
  """End to end: the stored candidates of the old function are never released as the new's."""
  train = ("import cfg_run\nfrom examples import dp_logistic_regression as ex\n\n"
           "def train_fn(hparams, seed):\n  return ex.train_fn(dict(hparams, learning_rate=hparams['learning_rate'] * cfg_run.SCALE), seed)\n")
  args = dict(distribution=acc.Fixed(2), key=jax.random.key(0),
              run_config=RunConfig(run_dir=str(tmp_path / "run")))
  function = lambda: TrainFunction(modules("train_run", train).train_fn, ex.dp_event)
  modules("cfg_run", "SCALE = 1.0\n")
  random_search(function(), GRID, **args)
  modules("cfg_run", "SCALE = 1.0\n")
  assert random_search(function(), GRID, **args).unreleased.resumed == 2
  modules("cfg_run", "SCALE = 2.0\n")
  with pytest.raises(SearchMismatchError, match="train_fn"):
    random_search(function(), GRID, **args)


def test_a_partial_of_a_user_function_is_followed(modules):
  helper = modules("helpers_partial", "def scale(x, by):\n  return x * by\n")
  one = functools.partial(helper.scale, by=1.0)
  assert function_identity(one) == function_identity(functools.partial(helper.scale, by=1.0))
  assert function_identity(one) != function_identity(functools.partial(helper.scale, by=2.0))


# --- What an adversarial review found (issue 42) ---------------------------------------------


def test_a_class_based_decorators_state_and_code_are_part_of_it():
  """A decorator written as a class (`functools.update_wrapper`) holds the noise it adds: the
  wrapped function alone does not say what runs."""
  def core(hparams, seed):
    return 0.5, np.ones(3)

  class WithNoise:
    def __init__(self, fn, noise):
      functools.update_wrapper(self, fn)
      self.noise = noise

    def __call__(self, hparams, seed):
      score, w = self.__wrapped__(hparams, seed)
      return score, w + np.random.default_rng(seed).normal(0, self.noise, 3)
  assert function_identity(WithNoise(core, 0.0)) != function_identity(WithNoise(core, 1.0))
  assert function_identity(WithNoise(core, 1.0)) == function_identity(WithNoise(core, 1.0))


def test_values_held_by_library_callables_are_part_of_it():
  """A library's code is recorded by name, what it holds by value: an optax transformation's
  closures, a bound method's generator, a C object's state."""
  import random  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  import optax.contrib  # pylint: disable=g-import-not-at-top

  def reads(value):
    return function_identity(lambda hparams, seed: (value, None))
  with warnings.catch_warnings():  # optax renames dpsgd's `seed`, by version
    warnings.simplefilter("ignore", DeprecationWarning)
    noiseless, noisy = (optax.contrib.dpsgd(0.1, 1.0, sigma, 0) for sigma in (0.0, 1.0))
  for one, other in [(noiseless, noisy),  # its noise multiplier, in its closures
                     (optax.sgd(0.1), optax.sgd(0.2)),
                     (np.random.default_rng(0).normal, np.random.default_rng(1).normal),
                     (random.Random(0), random.Random(1))]:
    assert reads(one) != reads(other)
  assert reads(optax.sgd(0.1)) == reads(optax.sgd(0.1)) and UNIDENTIFIED not in reads(optax.sgd(0.1))


@pytest.mark.parametrize("body", ["globals()['LR']", "getattr(cfg, 'L' + 'R')", "eval('LR')",
                                  "sys.modules[__name__].LR", "vars(cfg)['LR']"])
def test_code_that_looks_names_up_as_it_runs_is_never_resumed(modules, body):
  modules("cfg_dynamic", "LR = 0.1\n")
  train = modules("train_dynamic", f"import sys\nimport cfg_dynamic as cfg\nLR = 0.1\n\n"
                                   f"def train_fn(hparams, seed):\n  return {body}, None\n")
  identity = function_identity(train.train_fn)
  assert UNIDENTIFIED in identity and "looks names up as it runs" in identity[UNIDENTIFIED]
  assert function_identity(train.train_fn)["nonce"] != identity["nonce"]  # never the same twice


def test_a_functions_own_attributes_and_names_set_on_builtins_are_part_of_it():
  import builtins  # pylint: disable=g-import-not-at-top

  def train(hparams, seed):
    return train.lr * JAXDP_TEST_SCALE, None  # pylint: disable=undefined-variable
  train.lr = 0.1
  builtins.JAXDP_TEST_SCALE = 1.0
  try:
    before = function_identity(train)
    train.lr = 0.2
    assert function_identity(train) != before
    train.lr = 0.1
    builtins.JAXDP_TEST_SCALE = 2.0
    assert function_identity(train) != before
  finally:
    del builtins.JAXDP_TEST_SCALE
