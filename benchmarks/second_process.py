"""The README's quickstart search in two fresh processes sharing one compilation cache.

  python -m benchmarks.second_process [--quick]

Runs the search of the README's "Tune" quickstart (`random_search` over five
learning rates, K ~ Poisson(5), opacus_cnn on mnist_offline, 3 epochs) in a
first interpreter with jaxdp's default settings (no cache variable set: the
cache is on, in its default directory `$XDG_CACHE_HOME/jaxdp/xla`, here with
XDG_CACHE_HOME an empty temporary directory so that your own cache is neither
read nor written), then in a second one with what the first left there, and
prints one JSON object: each process's wall time from start to result (imports
included), the search's time within it, how many programs each wrote to the
cache (the second: none, it compiles nothing new), and what it released (the
same in both: the same draw, the same programs). `--quick`: one epoch of
digits with a logistic regression, two rates.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap

_CHILD = textwrap.dedent("""
    import json, sys, time
    start = time.perf_counter()
    import jax
    from jaxdp import accounting as acc
    from jaxdp.data import load_dataset
    from jaxdp.train import TrainConfig, presets
    from jaxdp.tuning import random_search
    quick = sys.argv[1] == "1"
    data = load_dataset("digits" if quick else "mnist_offline")
    config = TrainConfig(task=presets.classifier(10), l2_clip_norm=1.0, noise_multiplier=1.1,
                         sampling_prob=64 / 4000, epochs=1 if quick else 3,
                         hparams=dict(learning_rate=0.1, model="logreg" if quick else "opacus_cnn"))
    grid = {"learning_rate": [0.1, 0.5] if quick else [0.05, 0.1, 0.2, 0.5, 1.0]}
    searched = time.perf_counter()
    result = random_search(config, grid, data, distribution=acc.Poisson(mean=5), key=jax.random.key(0))
    end = time.perf_counter()
    print(json.dumps({"wall_s": end - start, "search_s": end - searched,
                      "release": [result.hyperparameters, result.score, result.epsilon]}))
""")


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="digits, logistic regression, one epoch")
  args = parser.parse_args(argv)
  runs = []
  with tempfile.TemporaryDirectory(prefix="jaxdp-second-process-") as home:
    # Default settings: no JAX or jaxdp cache variable, only a fresh XDG_CACHE_HOME.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE", "JAXDP_COMPILATION"))}
    env["XDG_CACHE_HOME"] = home
    cache = os.path.join(home, "jaxdp", "xla")
    for _ in range(2):
      before = set(os.listdir(cache)) if os.path.isdir(cache) else set()
      proc = subprocess.run([sys.executable, "-c", _CHILD, "1" if args.quick else "0"], env=env,
                            capture_output=True, text=True, check=False)
      if proc.returncode != 0:
        print(proc.stderr, file=sys.stderr)
        return 1
      runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
      runs[-1]["new_entries"] = len(set(os.listdir(cache)) - before) if os.path.isdir(cache) else 0
  first, second = runs
  print(json.dumps({
      "command": "python -m benchmarks.second_process" + (" --quick" if args.quick else ""),
      "first_process_s": first["wall_s"], "second_process_s": second["wall_s"],
      "first_search_s": first["search_s"], "second_search_s": second["search_s"],
      "second_over_first": second["wall_s"] / first["wall_s"],
      "first_new_entries": first["new_entries"], "second_new_entries": second["new_entries"],
      "same_release": first["release"] == second["release"], "release": first["release"],
      "quick": bool(args.quick), "cpu_count": os.cpu_count()}))
  return 0


if __name__ == "__main__":
  sys.exit(main())
