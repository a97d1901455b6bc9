"""`jaxdp account`: values, JSON, help, and clean errors with exit code 2."""

import json
import re
import subprocess
import sys

import dp_accounting as dpa
import pytest

from jaxdp import accounting as acc
from jaxdp import cli

DPSGD_SPEC = "dpsgd:q=0.004267,sigma=1.1,steps=14063"
DPSGD = dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.004267, dpa.GaussianDpEvent(1.1)), 14063)


@pytest.mark.parametrize("spec,dist", [
    ("poisson:mean=10", acc.Poisson(mean=10)),
    ("geometric:mean=10", acc.Geometric(mean=10)),
    ("logarithmic:mean=10", acc.Logarithmic(mean=10)),
    ("tnb:eta=0.5,mean=10", acc.TruncatedNegativeBinomial(0.5, mean=10)),
    ("binomial:n=20,p=0.5", acc.Binomial(20, 0.5)),
    ("fixed:k=3", acc.Fixed(3)),
])
def test_account_json_matches_library(spec, dist, capsys):
  assert cli.main(["account", "--base", DPSGD_SPEC, "--repeat", spec, "--delta", "1e-5",
                   "--method", "rdp", "--json"]) == 0
  out = json.loads(capsys.readouterr().out)
  assert out["epsilon"] == pytest.approx(acc.epsilon(acc.RepeatAndSelect(DPSGD, dist), 1e-5, "rdp"), rel=1e-12)
  assert out["method"] == "rdp" and out["delta"] == 1e-5


def test_account_pinned_value_and_report(capsys):
  assert cli.main(["account", "--base", DPSGD_SPEC, "--repeat", "poisson:mean=10", "--method", "rdp"]) == 0
  printed = float(re.search(r"epsilon = ([0-9.]+)", capsys.readouterr().out).group(1))
  # Recorded on another machine: RDP in float64 (drift below 1e-12), printed to
  # 6 digits, so 1e-5 absolute. The privacy side holds exactly at the printed value
  # (it is rounded to 6 digits, so it may sit a hair below the accounted epsilon:
  # allow the print resolution).
  assert printed == pytest.approx(5.74938, abs=1e-5)
  event = acc.RepeatAndSelect(DPSGD, acc.Poisson(mean=10))
  assert acc.delta(event, printed + 5e-6, method="rdp") <= 1e-5
  assert cli.main(["account", "--base", "gaussian:sigma=4", "--repeat", "geometric:mean=10"]) == 0
  text = capsys.readouterr().out
  assert "rdp" in text and "composition" in text and "tightest" in text


@pytest.mark.parametrize("base,expected", [
    ("pure:eps=0.5", 0.5), ("zcdp:rho=0.1", acc.epsilon(acc.Zcdp(0.1), 1e-5, "rdp")),
    ("gaussian:sigma=4", 1.0126), ("dpsgd:q=0.01,sigma=2,epochs=50",
                                   acc.epsilon(dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(
                                       0.01, dpa.GaussianDpEvent(2.0)), 5000), 1e-5, "rdp")),
])
def test_single_run_bases(base, expected, capsys):
  assert cli.main(["account", "--base", base, "--method", "rdp", "--json"]) == 0
  assert json.loads(capsys.readouterr().out)["epsilon"] == pytest.approx(expected, abs=1e-4)


def test_epsilon_to_delta(capsys):
  assert cli.main(["account", "--base", "pure:eps=1", "--repeat", "geometric:mean=5",
                   "--epsilon", "3.0", "--method", "rdp", "--json"]) == 0
  assert json.loads(capsys.readouterr().out)["delta"] == 0.0  # Cor 3: 3 eps-DP


@pytest.mark.parametrize("argv,match", [
    (["--base", "dpsgd:q=2,sigma=1,steps=3"], "q must be in"),
    (["--base", "dpsgd:q=0.1,sigma=1"], "exactly one of steps or epochs"),
    (["--base", "laplace:b=1"], "unknown name 'laplace'"),
    (["--base", "gaussian:sigma=abc"], "not a number"),
    (["--base", "gaussian:scale=1"], "unknown"),
    (["--base", "pure:eps=1", "--repeat", "poisson:mean=0"], "mean must be in"),
    (["--base", "pure:eps=1", "--repeat", "tnb:eta=-2,mean=3"], "eta must be in"),
    (["--base", "pure:eps=1", "--repeat", "binomial:n=2.5,p=0.5"], "n must be an integer"),
    (["--base", "pure:eps=1", "--delta", "0"], "delta must be in"),
    (["--base", "pure:eps=1", "--orders", "1,2"], "orders"),
])
def test_bad_input_exits_2_with_a_message(argv, match, capsys):
  assert cli.main(["account"] + argv) == 2
  err = capsys.readouterr().err
  assert match in err and "Traceback" not in err


def test_console_script_help_and_error_without_traceback():
  help_out = subprocess.run([sys.executable, "-m", "jaxdp.cli", "account", "--help"],
                            capture_output=True, text=True, check=True).stdout
  for word in ("dpsgd:q=Q,sigma=S,steps=T", "poisson:mean=M", "tnb:eta=H,mean=M", "fixed:k=K", "--json"):
    assert word in help_out
  bad = subprocess.run([sys.executable, "-m", "jaxdp.cli", "account", "--base", "pure:eps=-1"],
                       capture_output=True, text=True)
  assert bad.returncode == 2 and "epsilon must be in" in bad.stderr and "Traceback" not in bad.stderr


def test_reproduce_dispatches_to_the_figure_scripts(tmp_path, capsys):
  assert cli.main(["reproduce", "fig1", "--out", str(tmp_path), "--datasets", "1"]) == 0
  assert (tmp_path / "fig1.png").exists()
  with pytest.raises(SystemExit) as exc:
    cli.main(["reproduce", "fig99"])
  assert exc.value.code == 2


def test_version_plan_and_allow_refined(capsys):
  with pytest.raises(SystemExit) as exc:
    cli.main(["--version"])
  assert exc.value.code == 0 and capsys.readouterr().out.startswith("jaxdp ")
  assert cli.main(["account", "--base", "gaussian:sigma=4", "--plan", "2", "--json"]) == 0
  plan = json.loads(capsys.readouterr().out)
  assert [f["family"] for f in plan["families"]] == ["poisson", "geometric", "logarithmic", "tnb-0.5", "fixed"]
  assert all(f["epsilon"] <= 2.0 for f in plan["families"])
  # The report's header is readable, "best" marks its row, and profile-refined is explained.
  assert cli.main(["account", "--base", "gaussian:sigma=4", "--repeat", "geometric:mean=10"]) == 0
  text = capsys.readouterr().out
  assert text.startswith("Privacy of: best of K ~ Geometric") and "used by best" in text
  assert "profile-refined is opt-in" in text
  assert cli.main(["account", "--base", "gaussian:sigma=4", "--repeat", "geometric:mean=10",
                   "--allow-refined", "--json"]) == 0
  rep = json.loads(capsys.readouterr().out)
  refined = {m["method"]: m["epsilon"] for m in rep["methods"]}["profile-refined"]
  assert rep["allow_refined"] and rep["best"]["epsilon"] == pytest.approx(refined)
  assert cli.main(["account", "--base", "gaussian:sigma=4", "--repeat", "fixed:k=2", "--plan", "2"]) == 2
