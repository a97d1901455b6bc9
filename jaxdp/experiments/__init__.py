"""The pipelines that reproduce the figures of the papers that jaxdp implements.

The figures themselves, each one's profiles (``quick``, ``paper``, ...) and
its launch script, are in the repository's top-level ``experiments/`` (not in
the wheel): ``python experiments/<name>.py --help``. The modules here are the
reusable code those scripts run; ``python -m jaxdp.experiments.<name>``,
``jaxdp reproduce <figure>`` and ``<module>.PROFILES`` read the profiles from
that directory (a clone, or ``$JAXDP_EXPERIMENTS``), the only place they are
defined.

This subpackage sits on top of the library: it may import any part of jaxdp,
and nothing in jaxdp imports it (the CLI only looks its modules up by name
when asked to reproduce a figure). Importing it does no work: the start-up
settings (CPU cores as JAX devices, a headless matplotlib backend) are
applied by each pipeline's ``main()``.

Public helpers for notebooks and scripts:
  expose_host_devices  every CPU core as a JAX device; call before JAX's first computation.
"""

from jaxdp.experiments.common import expose_host_devices

__all__ = ["expose_host_devices"]
