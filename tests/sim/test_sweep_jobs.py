"""`--sweep ... --jobs N`: the configurations on a process pool give the serial sweep's
results, in the order given, byte for byte."""
from oresearcher.errors import cli_main
from oresearcher.sim.__main__ import main

SWEEP = ["scenarios/cpu-tiny.yaml", "--set", "training.steps=2", "--sweep", "communication.bucket_size_MB=0.05,1,0.2"]


def test_pool_sweep_is_byte_identical_to_serial(tmp_path, capsys):
    assert cli_main(main, [*SWEEP, "--out", str(tmp_path / "serial")]) == 0
    assert cli_main(main, [*SWEEP, "--out", str(tmp_path / "pool"), "--jobs", "2"]) == 0
    serial = (tmp_path / "serial" / "sweep.json").read_bytes()
    assert serial == (tmp_path / "pool" / "sweep.json").read_bytes()
    assert b'"values": [\n  0.05,\n  1,\n  0.2' in serial  # the order given, not sorted or by finish


def test_bad_jobs_is_one_line_and_exit_2(capsys):
    assert cli_main(main, [*SWEEP, "--jobs", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--jobs 0" in err[0]
    assert cli_main(main, ["scenarios/cpu-tiny.yaml", "--jobs", "2"]) == 2
    assert "--jobs only applies to --sweep" in capsys.readouterr().err
