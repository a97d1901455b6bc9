"""A digest of the program a candidate runs: its code, as JAX traces it, in one sha256.

A durable search or sweep (`jaxdp.sweep.CandidateStore`, which the tuners
and `jaxdp.sweep.run_sweep` train through) stores trained candidates and read them back on a
rerun. That is private only if the rerun would run the very same mechanism,
so the pool records what each candidate computes: its DpEvent, and the
digest of its program made here. The program is `program.run_candidate`
(init, the DP training loop, the public and the DP score: the composition of
the three programs lone and batched runs execute) traced by `jax.make_jaxpr` on abstract
arguments, so the digest reads the model, the loss, the score, the
optimizer, the clipping path, the trainable set and the inputs function as
they are *now*, not by name: a loss edited under the same name, a
`NoisyMean` with another noise multiplier, an activation swapped in the
model or a `trainable` predicate that selects other leaves all give another
digest.

What the digest reads:
  - the jaxpr's text (every primitive, shape, dtype and literal; shared
    sub-programs are printed once, by name), with object addresses
    (`at 0x7f...`) scrubbed, since they differ from process to process;
  - the bytes (with dtype and shape) of every constant the program closes
    over, at any depth: a loss closing over a NumPy array prints only the
    array's shape in the jaxpr's text, so two arrays of other values would
    otherwise give one digest.

Guarantees:
  - Deterministic across processes for the same code, data shapes and
    static settings (no addresses, no Python `hash`, no dict order).
  - Performance settings do not enter: the spec is traced with a canonical
    padding and one microbatch (`canonical_spec`), so a resume on a device
    with another memory budget, which picks another microbatch size, has the
    same digest. Traced values (learning rate, C, sigma of the DP-SGD plan)
    enter by shape only; their values are in the DpEvent and the
    configuration, which a pool records beside the digest.
  - What can still differ between machines is what changes the traced
    program itself: `Task(clipping='auto')` (the default) chooses each
    layer's path with the device's microbatch budget
    (`microbatching.budget_bytes`: the accelerator's memory, or the host
    cores per device on CPU), so on another device, or another number of
    host devices, a layer near the threshold may take the other path (the
    same clipped sum up to float rounding, another program); and another
    JAX version may trace the same code differently. Then a resume is
    refused: safe, never silently mixed.

Cost: one trace (no compilation) per distinct `LoopSpec`, about 0.25 s for a
small MLP on a 2-core CPU; the search of docs/guides/tune_your_own_model.md (6 configurations, 2 compiled
groups) records its mechanism in about 0.5 s. Only durable runs pay it.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import re
from typing import Any, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from jaxdp.data import Dataset
from jaxdp.train import padding
from jaxdp.train import program
from jaxdp.train.plan import DpSgdPlan
from jaxdp.train.loop_spec import LoopSpec
from jaxdp.train.sampling import default_padded_batch_size

#: An object's address in a repr ("<function f at 0x7f3a...>"): it differs per process.
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def scrub(text: str) -> str:
  """`text` without object addresses (" at 0x7f3a..." -> " at 0x?"), which differ per process."""
  return _ADDRESS.sub(" at 0x?", text)


def canonical_spec(spec: LoopSpec, num_rows: int) -> LoopSpec:
  """`spec` with its performance-only sizes replaced by ones no device decides.

  The padded batch is the default for `num_rows` examples and q (qN plus 4
  standard deviations), processed as one microbatch. Both are performance
  settings (`ExecutionConfig`): they change the order of the clipped sum,
  never which rows are sampled, the clipping or the noise.

  Args:
    spec: a candidate's `LoopSpec` (its microbatch may depend on the device).
    num_rows: the declared training set size (`Dataset.num_examples`, public).

  Returns:
    The spec to trace for a digest.
  """
  padded = default_padded_batch_size(max(int(num_rows), 1), spec.sampling_prob)
  return dataclasses.replace(spec, padded_batch_size=padded, microbatch_size=padded)


def jaxpr_digest(closed: Any) -> str:
  """sha256 of a closed jaxpr: its text (addresses scrubbed) and its constants' bytes.

  Args:
    closed: a `ClosedJaxpr` (what `jax.make_jaxpr` returns).

  Returns:
    64 hex digits.
  """
  digest = hashlib.sha256(scrub(str(closed)).encode())
  for value in _constants(closed):
    digest.update(_array_bytes(value))
  return digest.hexdigest()


def _array_bytes(value: Any) -> bytes:
  if isinstance(value, jax.Array) and jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
    value = jax.random.key_data(value)  # a typed key: its raw bits
  array = np.ascontiguousarray(np.asarray(value))
  return f"{array.dtype}{array.shape}".encode() + array.tobytes()


def _constants(closed: Any) -> Iterator[Any]:
  """The constants of `closed` and of every sub-jaxpr in its equations, in a fixed order."""
  stack = [closed]
  seen = set()
  while stack:
    item = stack.pop()
    jaxpr = getattr(item, "jaxpr", item)
    if id(jaxpr) in seen:  # a sub-program shared by several equations: read once, as printed once
      continue
    seen.add(id(jaxpr))
    yield from getattr(item, "consts", ())
    children = []
    for eqn in jaxpr.eqns:
      for var in eqn.invars:
        if isinstance(var, jax.extend.core.Literal):
          yield var.val  # printed too, but a non-scalar literal's text may not show every value
      for param in eqn.params.values():
        for sub in param if isinstance(param, (tuple, list)) else (param,):
          if isinstance(sub, (jax.extend.core.ClosedJaxpr, jax.extend.core.Jaxpr)):
            children.append(sub)
    stack.extend(reversed(children))


#: Primitives that run host or foreign code the trace does not show: a digest cannot read what
#: they compute (`jax.debug.callback` is absent: it returns nothing to the program).
HOST_CODE_PRIMITIVES = frozenset({"pure_callback", "io_callback", "ffi_call", "custom_call"})


def _host_code(closed: Any) -> list:
  """Names of the `HOST_CODE_PRIMITIVES` used anywhere in `closed`, sub-jaxprs included."""
  found, stack, seen = [], [closed], set()
  while stack:
    jaxpr = getattr(stack.pop(), "jaxpr", None)
    if jaxpr is None or id(jaxpr) in seen:
      continue
    seen.add(id(jaxpr))
    for eqn in jaxpr.eqns:
      if eqn.primitive.name in HOST_CODE_PRIMITIVES:
        found.append(eqn.primitive.name)
      for param in eqn.params.values():
        for sub in param if isinstance(param, (tuple, list)) else (param,):
          if isinstance(sub, jax.extend.core.ClosedJaxpr):
            stack.append(sub)
          elif isinstance(sub, jax.extend.core.Jaxpr):
            stack.append(jax.extend.core.ClosedJaxpr(sub, ()))
  return sorted(set(found))


def program_digest(spec: LoopSpec, data: Dataset) -> str:
  """The digest of `run_candidate` for `spec` on `data`'s shapes (see the module docstring).

  Args:
    spec: the candidate's `LoopSpec`, checked on `data` (a `RunPlan`'s:
      `jaxdp.train.run_plan.plan_runs` checked it; canonicalised here,
      `canonical_spec`).
    data: the data it trains on; only its splits' shapes and dtypes are read.

  Returns:
    64 hex digits.

  Guarantees:
    Equal in any process for the same code, data shapes and static
    settings, whatever the device's microbatch choice; different when the
    traced program or any constant it closes over differs.

  Raises:
    ValueError: the program calls host or foreign code (`jax.pure_callback`, `io_callback`, an FFI call), whose
      behaviour no digest of the trace can see, so a durable run could not
      tell a changed mechanism from the stored one.
  """
  canonical = canonical_spec(spec, data.num_examples)
  scalar = jax.ShapeDtypeStruct((), jnp.float32)
  # C and sigma are traced leaves of the plan (their values are the DpEvent's);
  # q, T and N are static and enter the program.
  plan = jax.tree.map(lambda _: scalar, DpSgdPlan(
      l2_clip_norm=1.0, noise_multiplier=1.0, sampling_prob=spec.sampling_prob,
      num_steps=spec.num_steps, num_examples=spec.num_examples))
  traced = {name: scalar for name in canonical.traced_names}
  key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype)
  # The splits as the programs take them: padded to their public capacities.
  splits = padding.abstract_splits(data, spec.task)
  closed = jax.make_jaxpr(functools.partial(program.run_candidate, canonical))(plan, traced, key, *splits)
  host = _host_code(closed)
  if host:
    raise ValueError(f"task {spec.task.name!r} calls host or foreign code ({', '.join(host)}): its "
                     "behaviour is outside the traced program, so a durable run_dir cannot check that "
                     "a resume runs the same mechanism; run it without run_dir, or compute that part "
                     "in JAX")
  return jaxpr_digest(closed)
