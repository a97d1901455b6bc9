"""Figure 1: the tuned SVM weight differs with and without the outliers."""

import csv

import numpy as np

from jaxdp.experiments import fig1


def test_fig1_outputs_and_the_leak(tmp_path, capsys):
  assert fig1.main(["--out", str(tmp_path), "--datasets", "3"]) == 0
  for name in ("fig1.png", "fig1.pdf", "fig1.csv"):
    assert (tmp_path / name).stat().st_size > 0
  rows = list(csv.DictReader(open(tmp_path / "fig1.csv")))
  assert set(rows[0]) == {"outliers", "alpha", "train_accuracy_mean", "train_accuracy_stderr", "datasets"}
  curves = {o: np.array([float(r["train_accuracy_mean"]) for r in rows if r["outliers"] == o])
            for o in ("False", "True")}
  alphas = np.array(fig1.ALPHAS)
  assert np.all((curves["True"] >= 0) & (curves["True"] <= 1))
  # Without outliers a small alpha already separates the classes; with them it does not:
  # the alpha a non-private tuner picks depends on whether the outliers are present.
  first_good = {o: alphas[np.argmax(c >= 0.95)] for o, c in curves.items()}
  assert curves["False"].max() > 0.98 and curves["True"].max() < curves["False"].max()
  assert first_good["True"] > 10 * first_good["False"]
  assert "best alpha" in capsys.readouterr().out


def test_fig1_bad_arguments(tmp_path, capsys):
  assert fig1.main(["--out", str(tmp_path), "--datasets", "0"]) == 2
  assert "--datasets must be >= 1" in capsys.readouterr().err
