"""The fused codec kernels where the interpreter tests cannot reach: compiled for CUDA
targets (no GPU needed), and test_codec_triton.py run in a child process when this one
imported triton before TRITON_INTERPRET=1 could be set (torch imports it as part of
torch.utils.flop_counter, which most of the suite loads first)."""
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")
HERE = os.path.dirname(__file__)


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return {**env, **extra}


def test_every_kernel_compiles_for_cuda_with_exact_float_ops():
    """What the interpreter cannot show: every variant compiles (globals, shapes,
    constexprs), no fused multiply-add (the launch passes enable_fp_fusion=False, as here)
    and only correctly rounded divisions."""
    out = subprocess.run([sys.executable, os.path.join(HERE, "triton_compile_check.py"), "80"], env=_env(),
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert len(lines) == 15 and all(line.split()[2] == "ok" for line in lines), out.stdout
    ops = {op for line in lines for op in line.split()[3:]} - {"-"}
    assert ops == {"div.rn.f32"}, ops  # 127/a and a/127 correctly rounded; no fma, no approximate division


def test_interpreter_tests_ran_here_or_run_in_a_child():
    from oresearcher.codecs import fused

    if fused.interpreted():
        pytest.skip("this process runs the kernels in the interpreter: test_codec_triton.py ran here")
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:warnings",
                          os.path.join(HERE, "test_codec_triton.py")], env=_env(TRITON_INTERPRET="1"),
                         capture_output=True, text=True, timeout=600, cwd=os.path.dirname(os.path.dirname(HERE)))
    last = (out.stdout.strip().splitlines() or ["no output"])[-1]
    assert out.returncode == 0 and "passed" in last and "skipped" not in last, out.stdout[-3000:]
