"""The optional compiled int8 kernel (``int8_kernel.c``), built on first use.

Eager torch needs several passes and temporaries per chunk for int8 round-to-nearest
(about 0.15x the speed of a plain copy at 1M float32 elements); one fused C loop per
chunk, vectorised by gcc, reads the input once. The kernel gives the same bits as the
eager path in :mod:`oresearcher.codecs.quant`, which stays as the reference and the
fallback (tests compare the two on arbitrary inputs).

Build: the system C compiler (``$CC``, else ``cc`` or ``gcc``) with ``-O3 -march=native``
(plain ``-O3`` if that fails), ``-ffp-contract=off -fno-math-errno`` and never
``-ffast-math``, into ``$ORESEARCHER_CACHE`` (default ``~/.cache/oresearcher``; the
temp dir if that is not writable) under a name hashed from the source, the flags and
this CPU, written to a temp file and renamed, so concurrent ranks never load half a
file. Without a compiler, or with ``ORESEARCHER_NATIVE=0``, the eager path runs.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

_SOURCE = Path(__file__).with_name("int8_kernel.c")
_FLAGS = ["-O3", "-ffp-contract=off", "-fno-math-errno", "-shared", "-fPIC"]
how = "eager torch (no native kernel loaded yet)"


def _cpu_id() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cache_dirs():
    env = os.environ.get("ORESEARCHER_CACHE")
    if env:
        yield Path(env)
    yield Path.home() / ".cache" / "oresearcher"
    yield Path(tempfile.gettempdir()) / "oresearcher-cache"


def _build(cc: str, src: bytes):
    for arch in (["-march=native"], []):
        flags = arch + _FLAGS
        digest = hashlib.sha256(src + " ".join([cc] + flags).encode() + _cpu_id().encode()).hexdigest()[:16]
        for d in _cache_dirs():
            so = d / f"int8-{digest}.so"
            if so.exists():
                return ctypes.CDLL(str(so)), flags
            try:
                d.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(suffix=".so", dir=d)
                os.close(fd)
            except OSError:
                continue
            try:
                r = subprocess.run([cc, *flags, str(_SOURCE), "-o", tmp], capture_output=True, timeout=120)
                if r.returncode != 0:
                    break  # this flag set does not build: try the next one
                os.replace(tmp, so)
                return ctypes.CDLL(str(so)), flags
            except (OSError, subprocess.SubprocessError):
                break
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
    return None, None


@functools.cache
def lib():
    """The loaded kernel library, or None (no compiler, disabled, or a failed build);
    tried once per process (``lib.cache_clear()`` tries again)."""
    global how
    if os.environ.get("ORESEARCHER_NATIVE", "1") == "0":
        how = "eager torch (ORESEARCHER_NATIVE=0)"
        return None
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        how = "eager torch (no C compiler found)"
        return None
    try:
        k, flags = _build(cc, _SOURCE.read_bytes())
    except OSError:
        k, flags = None, None
    if k is None:
        how = f"eager torch ({cc} could not build {_SOURCE.name})"
        return None
    k.orq_int8_quantize.restype = ctypes.c_int
    k.orq_int8_quantize.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]
    k.orq_int8_dequantize.restype = None
    k.orq_int8_dequantize.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    how = f"native C kernel ({Path(cc).name} {' '.join(flags[:-2])})"
    return k


def _fits(*ts: torch.Tensor) -> bool:
    return all(t.device.type == "cpu" and t.is_contiguous() for t in ts)


def int8_quantize(flat: torch.Tensor, chunk: int):
    """``(absmax, codes)`` from the kernel, or None where it does not apply (not float32
    on CPU, or no kernel). Raises ValueError on non-finite input, as the eager path."""
    k = lib() if flat.dtype == torch.float32 and _fits(flat) else None
    if k is None:
        return None
    n = flat.numel()
    absmax = torch.empty(-(-n // chunk), dtype=torch.float32)
    codes = torch.empty(n, dtype=torch.int8)
    if n and k.orq_int8_quantize(flat.data_ptr(), n, chunk, absmax.data_ptr(), codes.data_ptr()):
        raise ValueError("codec input holds non-finite values (NaN or inf)")
    return absmax, codes


def int8_dequantize(absmax: torch.Tensor, codes: torch.Tensor, chunk: int, cdt: torch.dtype):
    """The decoded float32 tensor from the kernel, or None where it does not apply."""
    fits = cdt == torch.float32 and absmax.dtype == torch.float32 and _fits(absmax, codes)
    k = lib() if fits else None
    if k is None:
        return None
    out = torch.empty(codes.numel(), dtype=torch.float32)
    if codes.numel():
        k.orq_int8_dequantize(absmax.data_ptr(), codes.data_ptr(), codes.numel(), chunk, out.data_ptr())
    return out
