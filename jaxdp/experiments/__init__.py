"""Reproductions of the figures of the papers that jaxdp implements.

Each module is runnable with ``python -m jaxdp.experiments.<name> --help``
(or ``jaxdp reproduce <figure>``). This subpackage sits on top of the library:
it may import any part of jaxdp, and nothing in jaxdp imports it (the CLI only
looks its modules up by name when asked to reproduce a figure). Importing it
does no work: the start-up settings (CPU cores as JAX devices, a headless
matplotlib backend) are applied by each script's ``main()``.

Public helpers for notebooks and scripts:
  expose_host_devices  every CPU core as a JAX device; call before JAX's first computation.
"""

from jaxdp.experiments.common import expose_host_devices

__all__ = ["expose_host_devices"]
