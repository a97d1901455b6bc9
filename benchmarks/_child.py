"""One measurement in a fresh interpreter (its own compile caches, device peak and RAM), and the
machine facts its JSON carries."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(module: str, args: list, label: str) -> dict:
  """`python -m module *args` from the repository root; the one JSON object it prints.

  Raises:
    RuntimeError: naming `label`, with the end of the child's output, if it fails.
  """
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
  proc = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=env, capture_output=True,
                        text=True, check=False)
  if proc.returncode != 0:
    raise RuntimeError(f"{label} failed:\n{(proc.stderr or proc.stdout)[-3000:]}")
  return json.loads(proc.stdout)


def pop_facts(results: list) -> dict:
  """The first result's machine facts (keys '_backend', ... without the '_'), removed from every result."""
  facts = {k[1:]: v for k, v in results[0].items() if k.startswith("_")}
  for r in results:
    for k in [k for k in r if k.startswith("_")]:
      del r[k]
  return facts
