"""Data the benchmarks share: MNIST-sized random images (no download; a step's speed does not
depend on the pixels)."""

import numpy as np


def mnist_sized(examples: int, image_size: int = 28):
  """A `Dataset` of `examples` random image_size x image_size x 1 images in 10 classes, and a
  test split of 1,000."""
  from jaxdp.data import Dataset, DataSplit  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  shape = (image_size, image_size, 1)
  split = lambda n: DataSplit(rng.normal(size=(n,) + shape).astype(np.float32),
                              (np.arange(n) % 10).astype(np.int32))
  return Dataset(name="mnist-sized random", train=split(examples), test=split(1000),
                 num_examples=examples, num_classes=10)
