"""A private search over an Opacus (PyTorch) training function, with the whole search's epsilon.

  pip install torch --index-url https://download.pytorch.org/whl/cpu   # CPU-only PyTorch first
  pip install -e '.[opacus]'        # PyTorch and Opacus: not needed by the rest of jaxdp
  python -m examples.opacus_search --help

Opacus trains one DP-SGD run and accounts that one run; it does not account
for the search that picked its hyperparameters. Here `jaxdp.tuning.random_search`
runs that search (Papernot & Steinke's random number of candidates K) and
reports the epsilon of the whole procedure. The training function is a plain
Opacus loop; `dp_event` is the DpEvent of what it runs: Poisson sampling at
rate q = 1 / (batches per epoch), as Opacus's `DPDataLoader` samples, for
epochs x batches steps of the Gaussian mechanism. After each run the function
checks that Opacus's own accountant recorded exactly that (q, sigma, steps).

Data: scikit-learn's breast-cancer set as in `examples.dp_logistic_regression`
(400 private training examples, 169 public test examples scoring the runs).
"""

from __future__ import annotations

import math
import sys
import warnings

import numpy as np

from examples.dp_logistic_regression import NUM_EXAMPLES, load_data, search_main
from jaxdp import accounting as acc

#: The grid: every combination is one candidate's hyperparameters (the noise is calibrated).
GRID = {"learning_rate": [0.05, 0.2], "l2_clip_norm": [1.0], "batch_size": [50, 100], "epochs": [5],
        "width": [16]}


#: How to install what the example needs. Without the first line, pip resolves `torch` to the
#: CUDA build on Linux, with its CUDA libraries, which a CPU-only machine does not use.
INSTALL = ("examples.opacus_search needs PyTorch and Opacus (jaxdp itself does not). Without a GPU, "
           "install PyTorch's CPU wheel first, or pip fetches the CUDA build and its libraries:\n"
           "  pip install torch --index-url https://download.pytorch.org/whl/cpu\n"
           "  pip install -e '.[opacus]'")


def torch_and_opacus() -> tuple:
  """(torch, opacus.PrivacyEngine), or an ImportError that says how to install them."""
  try:
    import torch  # pylint: disable=g-import-not-at-top
    from opacus import PrivacyEngine  # pylint: disable=g-import-not-at-top
  except ImportError as err:
    raise ImportError(f"{INSTALL}\n(the import failed: {err})") from err
  return torch, PrivacyEngine


def schedule(hparams: dict) -> tuple:
  """(q, steps) of the run Opacus makes of `hparams`: its `DPDataLoader` samples each example
  with probability 1 / len(loader) for len(loader) steps per epoch."""
  batches = math.ceil(NUM_EXAMPLES / hparams["batch_size"])
  return 1.0 / batches, hparams["epochs"] * batches


def dp_event(hparams: dict):
  """The DpEvent of one `train_fn` run."""
  q, steps = schedule(hparams)
  return acc.dpsgd_event(q, hparams["noise_multiplier"], steps)


def train_fn(hparams: dict, seed: int) -> tuple:
  """An Opacus DP-SGD run of a one-hidden-layer MLP: (public test accuracy, its weights as
  NumPy arrays, which a run directory stores without pickle)."""
  torch, PrivacyEngine = torch_and_opacus()
  torch.manual_seed(seed)  # the initialisation; the sampling and noise use `generator`
  generator = torch.Generator().manual_seed(seed)
  (x, y), (x_test, y_test) = load_data()["train"], load_data()["test"]
  train = torch.utils.data.TensorDataset(torch.tensor(x, dtype=torch.float32),
                                         torch.tensor(y, dtype=torch.float32))
  loader = torch.utils.data.DataLoader(train, batch_size=hparams["batch_size"], generator=generator)
  net = torch.nn.Sequential(torch.nn.Linear(x.shape[1], hparams["width"]), torch.nn.Tanh(),
                            torch.nn.Linear(hparams["width"], 1))
  optimizer = torch.optim.SGD(net.parameters(), lr=hparams["learning_rate"])
  loss_fn = torch.nn.BCEWithLogitsLoss()
  with warnings.catch_warnings():  # Opacus's notes (secure_mode off, backward hooks): an example
    warnings.simplefilter("ignore", UserWarning)
    engine = PrivacyEngine(accountant="rdp")
    model, optimizer, loader = engine.make_private(
        module=net, optimizer=optimizer, data_loader=loader, poisson_sampling=True,
        noise_multiplier=hparams["noise_multiplier"], max_grad_norm=hparams["l2_clip_norm"],
        noise_generator=generator)
    for _ in range(hparams["epochs"]):
      for xb, yb in loader:
        optimizer.zero_grad()
        if len(yb):  # an empty Poisson batch still takes a (noise-only) step
          loss_fn(model(xb)[:, 0], yb).backward()
        optimizer.step()
  q, steps = schedule(hparams)
  ran = [tuple(h) for h in engine.accountant.history]
  if ran != [(hparams["noise_multiplier"], q, steps)]:  # what ran must be what dp_event accounts
    raise RuntimeError(f"Opacus ran {ran}, dp_event accounts {(hparams['noise_multiplier'], q, steps)}")
  with torch.no_grad():
    logits = net(torch.tensor(x_test, dtype=torch.float32))[:, 0].numpy()
  accuracy = float(np.mean((logits > 0) == (y_test > 0.5)))
  return accuracy, {k: v.detach().numpy().copy() for k, v in net.state_dict().items()}


def main(argv=None) -> dict:
  if not {"-h", "--help"} & set(argv if argv is not None else sys.argv[1:]):
    torch_and_opacus()  # before the search starts (--help needs neither)
  return search_main(train_fn, dp_event, GRID, argv, description=__doc__.split("\n\n")[0],
                     target_epsilon=3.0, mean_candidates=4.0)


if __name__ == "__main__":
  main()
