"""`jaxdp account`: values, JSON, help, and clean errors with exit code 2."""

import json
import os
import re
import shlex
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
  for word in ("dpsgd:q=Q,sigma=S,steps=T", "b/N", "q=256/60000", "poisson:mean=M", "tnb:eta=H,mean=M",
               "fixed:k=K", "--json"):
    assert word in help_out
  bad = subprocess.run([sys.executable, "-m", "jaxdp.cli", "account", "--base", "pure:eps=-1"],
                       capture_output=True, text=True)
  assert bad.returncode == 2 and "epsilon must be in" in bad.stderr and "Traceback" not in bad.stderr


# The README's Python example: 60 epochs at batch 256 of MNIST's 60,000, sigma 1.1.
README_Q = 256 / 60000
README_RUN = acc.dpsgd_event(README_Q, 1.1, acc.dpsgd_steps(60, README_Q))
README_SPEC = "dpsgd:q=256/60000,sigma=1.1,epochs=60"


def test_q_as_a_fraction_is_the_python_event(capsys):
  assert acc.dpsgd_steps(60, README_Q) == 14063
  # Same rate, same step rule: the very event the Python example builds.
  assert cli._build(README_SPEC, "base", cli._BASES) == README_RUN  # pylint: disable=protected-access
  assert cli._build("dpsgd:q=256/6e4,sigma=1.1,steps=14063", "base", cli._BASES) == README_RUN  # pylint: disable=protected-access
  assert cli.main(["account", "--base", README_SPEC, "--repeat", "poisson:mean=10", "--delta", "1e-5",
                   "--method", "rdp", "--json"]) == 0
  out = json.loads(capsys.readouterr().out)
  # Both in this process, on the same event: equal, not close.
  assert out["epsilon"] == acc.epsilon(acc.RepeatAndSelect(README_RUN, acc.Poisson(mean=10)), 1e-5, "rdp")
  assert cli.main(["account", "--base", README_SPEC, "--plan", "8"]) == 0
  assert "steps=14063" in capsys.readouterr().out
  # The rounded decimal the README used to show is another rate, hence another event.
  assert cli._build("dpsgd:q=0.004267,sigma=1.1,epochs=60", "base", cli._BASES) != README_RUN  # pylint: disable=protected-access


@pytest.mark.parametrize("q,shown", [
    ("256/0", "b=256, N=0"), ("70000/60000", "b=70000, N=60000"), ("0/60000", "b=0, N=60000"),
    ("-1/60000", "b=-1, N=60000"), ("inf/inf", "b=inf, N=inf"), ("abc/60000", "is not a number"),
    ("256/", "is not a number"), ("1/2/3", "is not a number"),
])
def test_a_bad_fraction_exits_2_naming_q_its_value_and_the_range(q, shown, capsys):
  assert cli.main(["account", "--base", f"dpsgd:q={q},sigma=1.1,epochs=60"]) == 2
  err = capsys.readouterr().err
  assert f"--base dpsgd: q={q!r}" in err and shown in err, err
  assert "0 < b <= N" in err and "(0, 1]" in err and "Traceback" not in err
  assert len(err.strip().splitlines()) == 1


def test_only_q_takes_a_fraction(capsys):
  assert cli.main(["account", "--base", "gaussian:sigma=1/2"]) == 2
  assert "sigma='1/2' is not a number" in capsys.readouterr().err


def _readme_shell_block() -> str:
  readme = open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md"),
                encoding="utf-8").read()
  match = re.search(r"The same events from the shell.*?```bash\n(.*?)```", readme, re.S)
  assert match, "README.md has no shell block after 'The same events from the shell'"
  return match.group(1)


_NUMBER = r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?"


def test_readme_shell_lines_print_what_the_readme_quotes(capsys):
  """Each command of the README's shell block prints the `#` lines under it.

  The quoted numbers were printed on another machine: a number with decimals
  is compared to one unit of its last printed digit (RDP in float64 and PLDs
  drift far less), every other number (steps, delta) and all the words exactly.
  """
  commands, quoted = [], []
  pending = ""
  for line in _readme_shell_block().splitlines():
    if line.startswith("#"):
      quoted[-1].append(line[1:].strip())
    elif line.strip():
      pending += line.rstrip("\\").strip() + " "
      if not line.endswith("\\"):
        commands.append(shlex.split(pending)[1:])
        quoted.append([])
        pending = ""
  assert len(commands) == 4 and all(quoted)
  for argv, lines in zip(commands, quoted):
    assert "q=256/60000" in " ".join(argv)
    assert cli.main(argv) == 0
    printed = [l.strip() for l in capsys.readouterr().out.splitlines()]
    for want in lines:
      template = re.sub(_NUMBER, "#", want)
      got = next((l for l in printed if re.sub(_NUMBER, "#", l) == template), None)
      assert got is not None, (want, printed)
      for g, w in zip(re.findall(_NUMBER, got), re.findall(_NUMBER, want)):
        if "." in w and "e" not in w:
          assert abs(float(g) - float(w)) <= 10.0 ** -len(w.split(".")[1]), (got, want)
        else:
          assert g == w, (got, want)


def test_reproduce_dispatches_to_the_figure_scripts(tmp_path, capsys):
  assert cli.main(["reproduce", "fig1", "--out", str(tmp_path), "--datasets", "1"]) == 0
  assert (tmp_path / "fig1.png").exists()
  with pytest.raises(SystemExit) as exc:
    cli.main(["reproduce", "fig99"])
  assert exc.value.code == 2


def test_the_plan_explains_every_column_in_its_output_and_its_help(capsys):
  # Issue 45: "geometric max E[K] 1.023e+04" printed with no explanation.
  assert cli.main(["account", "--base", "gaussian:sigma=4", "--plan", "2"]) == 0
  table, legend = capsys.readouterr().out.split("\nEach row is one law of K")
  header = next(line for line in table.splitlines() if line.startswith("K family"))
  columns = ["K family", "max E[K]", "P(K=0)", "E[quantile]", "epsilon"]
  assert header.split() == " ".join(columns).split()
  explained = [line[2:15].strip() for line in legend.splitlines() if line.startswith("  ") and line[2] != " "]
  assert explained == columns + ["-"]
  assert ("the largest expected number of candidates for which the whole search is\n"
          "               still (epsilon=2, delta=1e-05)-DP") in legend
  assert "An upper\n               limit, not advice" in legend
  with pytest.raises(SystemExit):
    cli.main(["account", "--help"])
  help_text = capsys.readouterr().out
  for column in columns[1:]:
    assert f"\n{' ' * 26}{column}: " in help_text, column
  assert "largest expected number of candidates" in help_text


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
