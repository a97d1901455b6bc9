# Shared by every notebook: notebooks/_build.py inserts these two cells after each
# notebook's title cell (the Colab install, then the small mode the tests use).

# %%
# Installs jaxdp in Colab; where jaxdp is already importable (a local clone) this cell does nothing.
#
# jaxdp is not on PyPI yet, and the PyPI package that is called "jaxdp" is an unrelated project
# (dynamic programming for MDPs): do not `pip install jaxdp`. Instead, in a clone of this
# repository run `python -m build --wheel` (or `pip wheel --no-deps -w dist .`), upload
# dist/jaxdp-*.whl with Colab's file browser (left sidebar) into /content, or put the whole
# clone at /content/jaxdp, and run this cell.
import glob
import importlib.util
import os
import subprocess
import sys


def jaxdp_importable():
    try:
        return importlib.util.find_spec("jaxdp.experiments") is not None
    except ModuleNotFoundError:
        return False


if "google.colab" in sys.modules and not jaxdp_importable():
    wheels = sorted(glob.glob("/content/jaxdp-*.whl"))
    clone = "/content/jaxdp"
    source = wheels[-1] if wheels else clone if os.path.isfile(os.path.join(clone, "pyproject.toml")) else None
    if source is None:
        raise RuntimeError("jaxdp is not on PyPI yet: upload a wheel built with `python -m build --wheel` "
                           "(dist/jaxdp-*.whl) to /content, or a clone of the repository to /content/jaxdp, "
                           "then rerun this cell.")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", source], check=True)
if "google.colab" in sys.modules and os.path.isdir("/content/jaxdp/experiments"):
    # The figures' profiles live in the clone's experiments/ (not in the wheel).
    os.environ.setdefault("JAXDP_EXPERIMENTS", "/content/jaxdp/experiments")

# %%
# JAXDP_NOTEBOOK_SMALL=1 shrinks the work so the notebook runs in seconds (the tests set it);
# leave it unset for the full-size run.
import os

SMALL = os.environ.get("JAXDP_NOTEBOOK_SMALL", "") == "1"
print("small mode (JAXDP_NOTEBOOK_SMALL=1)" if SMALL else "full size")
