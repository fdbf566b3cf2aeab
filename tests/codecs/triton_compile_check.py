"""Compile every fused codec kernel for CUDA targets, without a GPU (run by
test_codec_triton.py in a child process: the test process runs Triton's interpreter).

Prints one line per kernel variant: ``name target ok`` and the float32 instructions of
note in its PTX (fma, div, rcp), so the test can check that the launch options keep
``v - q*s`` and ``v*inv + u`` unfused and ``127/a`` correctly rounded."""
import re
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from oresearcher.codecs import triton_kernels as K

F, I8, I16, I64 = "*fp32", "*i8", "*i16", "i64"
ENC = {"x_ptr": F, "e_ptr": F, "enew_ptr": F, "u_ptr": F, "absmax_ptr": F, "codes_ptr": I8, "flag_ptr": I8,
       "n": I64, "nchunks": I64, "chunk": I64, "seed": I64, "HAS_E": "constexpr", "EF": "constexpr",
       "NOISE": "constexpr", "ROWS": "constexpr", "BLOCK": "constexpr"}
VARIANTS = [("int8_encode", ENC, {"HAS_E": e, "EF": e, "NOISE": noise, "ROWS": 2, "BLOCK": 2048})
            for noise in (0, 1, 2) for e in (False, True)]
VARIANTS += [
    ("int8_encode", ENC, {"HAS_E": False, "EF": False, "NOISE": 0, "ROWS": 1024, "BLOCK": 4}),
    ("int8_decode", {"absmax_ptr": F, "codes_ptr": I8, "out_ptr": F, "n": I64, "chunk": I64, "BLOCK": "constexpr"},
     {"BLOCK": 4096}),
    ("absmax_partials", {"x_ptr": F, "part_ptr": F, "flag_ptr": I8, "n": I64, "BLOCK": "constexpr"}, {"BLOCK": 4096}),
    ("randk_indices", {"idx_ptr": "*i64", "seed": I64, "d": I64, "k": I64, "BLOCK": "constexpr"}, {"BLOCK": 4096}),
    ("randk_gather", {"x_ptr": F, "vals_ptr": F, "seed": I64, "d": "i32", "k": "i32", "BLOCK": "constexpr"},
     {"BLOCK": 4096}),
]
for bf in (True, False):
    VARIANTS += [("scale_cast", {"x_ptr": F, "out_ptr": I16 if bf else "*fp16", "n": I64, "scale": "fp32",
                                 "BF16": "constexpr", "BLOCK": "constexpr"}, {"BF16": bf, "BLOCK": 4096}),
                 ("unscale", {"d_ptr": I16 if bf else "*fp16", "out_ptr": F, "n": I64, "scale": "fp32",
                              "BF16": "constexpr", "BLOCK": "constexpr"}, {"BF16": bf, "BLOCK": 4096})]

if __name__ == "__main__":
    arch = int(sys.argv[1]) if len(sys.argv) > 1 else 90
    for name, sig, consts in VARIANTS:
        src = ASTSource(fn=getattr(K, name), signature=sig, constexprs=consts)
        ptx = triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"enable_fp_fusion": False}).asm["ptx"]
        ops = sorted(set(re.findall(r"\b((?:fma|div|rcp)\.[\w.]*f32)", ptx)))
        print(name, f"sm_{arch}", "ok", " ".join(ops) or "-", flush=True)
