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


def test_ray_sweep_is_byte_identical_to_serial(tmp_path, capsys):
    """On a local Ray instance (skipped where Ray is not installed: the ray extra)."""
    import pytest

    pytest.importorskip("ray")
    sweep = [*SWEEP[:-1], "communication.bucket_size_MB=0.05,1"]
    assert cli_main(main, [*sweep, "--out", str(tmp_path / "serial")]) == 0
    assert cli_main(main, [*sweep, "--out", str(tmp_path / "ray"), "--sweep-backend", "ray"]) == 0
    assert (tmp_path / "serial" / "sweep.json").read_bytes() == (tmp_path / "ray" / "sweep.json").read_bytes()


def test_ray_flags_without_a_sweep_are_refused(capsys):
    assert cli_main(main, ["scenarios/cpu-tiny.yaml", "--sweep-backend", "ray"]) == 2
    assert "--sweep-backend and --ray-address only apply to --sweep" in capsys.readouterr().err
    assert cli_main(main, [*SWEEP, "--ray-address", "ray://x:1"]) == 2
    assert "--ray-address needs --sweep-backend ray" in capsys.readouterr().err


def test_an_unreachable_ray_address_is_one_line(capsys):
    import pytest

    pytest.importorskip("ray")
    assert cli_main(main, [*SWEEP, "--sweep-backend", "ray", "--ray-address", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--ray-address 127.0.0.1:1: nothing answers there" in err[0]
    assert cli_main(main, [*SWEEP, "--sweep-backend", "ray", "--ray-address", "nohost"]) == 2
    assert "expected [ray://]host:port" in capsys.readouterr().err
