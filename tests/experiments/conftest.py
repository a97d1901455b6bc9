"""Small end-to-end runs of the figure pipelines, shared by every test of this directory.

Training dominates these tests, so each training pipeline runs once per session
on its tiny profile (tests/experiments/tiny_profiles.py) and every test reads
the outputs of that one run; tests that rerun or change the inputs reuse its
pool instead of training again.
"""

import pytest

from jaxdp.experiments import fig7, kk_fig7
from tests.experiments.tiny_profiles import FIG7_TINY, KK_FIG7_TINY


@pytest.fixture(scope="session")
def fig7_tiny_run(tmp_path_factory):
  """The output directory of `fig7.main` on FIG7_TINY (fig7.*), its pool in pool/."""
  out = tmp_path_factory.mktemp("fig7")
  code = fig7.main(["--profile", "tiny", "--out", str(out), "--pool-dir", str(out / "pool")],
                   profiles={"tiny": FIG7_TINY})
  assert code == 0
  return out


@pytest.fixture(scope="session")
def kk_fig7_tiny_run(tmp_path_factory):
  """The output directory of `kk_fig7.main` on KK_FIG7_TINY (kk_fig7.*)."""
  out = tmp_path_factory.mktemp("kk_fig7")
  assert kk_fig7.main(["--profile", "tiny", "--out", str(out)], profiles={"tiny": KK_FIG7_TINY}) == 0
  return out
