"""Help that explains: every flag of the CLIs says what it does and its default."""
import argparse
import subprocess
import sys
from pathlib import Path

from oresearcher import calibrate

ROOT = Path(__file__).resolve().parents[1]


def test_calibrate_help_explains_every_flag_and_default():
    parser = calibrate.build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        assert action.help, f"{action.option_strings} has no help"
        if action.default not in (None, [], True, False):
            assert "default" in action.help, f"{action.option_strings} does not give its default"
    (out,) = [a for a in parser._actions if "--out" in a.option_strings]
    assert "runs/<scenario name>/profile.yaml" in out.help
    assert parser.parse_args([]).out is None  # resolved under runs/, never the working directory


def test_bench_sim_to_real_help_is_whole_sentences():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_sim_to_real.py"), "--help"], capture_output=True,
                         text=True, check=True).stdout
    description = out.split("options:")[0].split("\n\n", 1)[1]
    assert description.strip().endswith("."), description
    assert "--repeats" in out and "default 5" in out
