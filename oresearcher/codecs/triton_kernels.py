"""Triton kernels of the fused codec path (:mod:`oresearcher.codecs.fused` launches them).

Each kernel does in one pass what the eager path (:mod:`.quant`, :mod:`.feedback`,
:mod:`.sparse`) does in several, with the same float32 operations in the same order, so
the bits agree (tests run these kernels in Triton's interpreter against the eager path):

- ``int8_encode``: per chunk (one row of a ``[ROWS, BLOCK]`` tile) the absmax
  ``max(max v, -min v)``, ``inv = 127/a`` correctly rounded (``div_rn``; a plain ``/``
  is approximate on GPUs), codes ``round_half_even(v*inv)`` or stochastic
  ``clamp(floor(v*inv + u), -127, 127)``, and chunks whose ``127/a`` overflows as
  ``(v/a)*127``. With error feedback (``EF``) it also forms ``v = e + x`` on the way in
  and writes the new residual ``v - q*fl(a/127)`` on the way out: one read of ``x`` and
  ``e``, one write of codes and residual. Per chunk it flags non-finite input (``1``)
  and a non-finite ``e + x`` (``2``) instead of raising: the host raises.
- ``int8_decode``: ``q * fl(a/127)``, clamped to the finite range.
- ``absmax_partials`` / ``scale_cast`` / ``unscale``: the fp16/bf16 casts' power-of-two
  scaling fused with the cast (the shift itself is chosen on the host from the absmax).
- ``randk_indices`` / ``randk_gather``: rand-k's indices generated on the device by a
  counter-based hash (splitmix64 of ``seed + (i+1)*golden``), gathered in the same pass.

Rounding to nearest-even is spelled with ``floor`` (exact for ``|y| < 2**23``), which
both the compiler and the interpreter have; libdevice's ``rint`` does not run in the
interpreter. Launches on a GPU pass ``enable_fp_fusion=False``: a fused multiply-add
would round ``v - q*s`` and ``v*inv + u`` once instead of twice and change bits.
"""
import triton
import triton.language as tl

FLT_MAX = tl.constexpr(3.4028234663852886e38)


@triton.jit
def _round_half_even(y):
    f = tl.floor(y)
    d = y - f  # exact for |y| < 2**23
    odd = (f - 2.0 * tl.floor(f * 0.5)) != 0.0
    up = (d > 0.5) | ((d == 0.5) & odd)
    return tl.where(up, f + 1.0, f)


@triton.jit(do_not_specialize=["seed"])
def int8_encode(x_ptr, e_ptr, enew_ptr, u_ptr, absmax_ptr, codes_ptr, flag_ptr, n, nchunks, chunk, seed,
                HAS_E: tl.constexpr, EF: tl.constexpr, NOISE: tl.constexpr,
                ROWS: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS).to(tl.int64)
    cols = tl.arange(0, BLOCK).to(tl.int64)
    offs = rows[:, None] * chunk + cols[None, :]
    mask = (cols[None, :] < chunk) & (offs < n)
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    if HAS_E:
        v = tl.load(e_ptr + offs, mask=mask, other=0.0) + x
    else:
        v = x
    xbad = tl.max(tl.where(mask & ~(tl.abs(x) <= FLT_MAX), 1, 0), axis=1)
    vbad = tl.max(tl.where(mask & ~(tl.abs(v) <= FLT_MAX), 1, 0), axis=1)
    hi = tl.max(tl.where(mask, v, -FLT_MAX), axis=1)
    lo = -tl.min(tl.where(mask, v, FLT_MAX), axis=1)
    a = tl.where(hi >= lo, hi, lo)
    a = tl.where(vbad > 0, 0.0, a)  # flagged: the host raises, nothing below is used
    rmask = rows < nchunks
    tl.store(absmax_ptr + rows, a, mask=rmask)
    tl.store(flag_ptr + rows, (xbad + 2 * vbad).to(tl.int8), mask=rmask)
    safe = tl.where(a > 0.0, a, 1.0)
    inv = tl.math.div_rn(tl.full(a.shape, 127.0, tl.float32), safe)
    tiny = (inv > FLT_MAX) & (a > 0.0)
    inv = tl.where((inv > FLT_MAX) | (a == 0.0), 0.0, inv)
    # div_rn does not broadcast (a plain builtin): give it the tile's shape
    y = tl.where(tiny[:, None], tl.math.div_rn(v, tl.broadcast_to(safe[:, None], (ROWS, BLOCK))) * 127.0,
                 v * inv[:, None])
    if NOISE == 0:
        q = _round_half_even(y)
    else:
        if NOISE == 1:
            u = tl.load(u_ptr + offs, mask=mask, other=0.0)
        else:
            u = tl.rand(seed, offs)
        q = tl.minimum(tl.maximum(tl.floor(y + u), -127.0), 127.0)
    tl.store(codes_ptr + offs, q.to(tl.int8), mask=mask)
    if EF:
        step = tl.math.div_rn(a, tl.full(a.shape, 127.0, tl.float32))
        sent = tl.minimum(tl.maximum(q * step[:, None], -FLT_MAX), FLT_MAX)
        tl.store(enew_ptr + offs, v - sent, mask=mask)


@triton.jit
def int8_decode(absmax_ptr, codes_ptr, out_ptr, n, chunk, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    mask = offs < n
    a = tl.load(absmax_ptr + offs // chunk, mask=mask, other=0.0)
    q = tl.load(codes_ptr + offs, mask=mask, other=0).to(tl.float32)
    step = tl.math.div_rn(a, tl.full(a.shape, 127.0, tl.float32))
    tl.store(out_ptr + offs, tl.minimum(tl.maximum(q * step, -FLT_MAX), FLT_MAX), mask=mask)


@triton.jit
def absmax_partials(x_ptr, part_ptr, flag_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(flag_ptr + pid, tl.max(tl.where(mask & ~(tl.abs(x) <= FLT_MAX), 1, 0), axis=0).to(tl.int8))
    tl.store(part_ptr + pid, tl.max(tl.where(mask & (tl.abs(x) <= FLT_MAX), tl.abs(x), 0.0), axis=0))


@triton.jit
def scale_cast(x_ptr, out_ptr, n, scale, BF16: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    mask = offs < n
    y = tl.load(x_ptr + offs, mask=mask, other=0.0) * scale
    if BF16:  # round to nearest even on the bits (the interpreter's bf16 cast truncates)
        bits = y.to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        tl.store(out_ptr + offs, (bits >> 16).to(tl.int16), mask=mask)  # out_ptr: the bf16 tensor's int16 view
    else:
        tl.store(out_ptr + offs, y.to(tl.float16), mask=mask)  # round to nearest even, as numpy and cvt.rn


@triton.jit
def unscale(d_ptr, out_ptr, n, scale, BF16: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    mask = offs < n
    if BF16:  # widen on the bits, exact (the interpreter's bf16 cast loses subnormals)
        bits = tl.load(d_ptr + offs, mask=mask, other=0).to(tl.uint16, bitcast=True).to(tl.uint32) << 16
        y = bits.to(tl.float32, bitcast=True) * scale
    else:
        y = tl.load(d_ptr + offs, mask=mask, other=0.0).to(tl.float32) * scale
    tl.store(out_ptr + offs, tl.minimum(tl.maximum(y, -FLT_MAX), FLT_MAX), mask=mask)


@triton.jit
def _splitmix_index(seed, i, d):
    z = seed.to(tl.uint64, bitcast=True) + (i + 1).to(tl.uint64) * 0x9E3779B97F4A7C15
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB
    z = z ^ (z >> 31)
    return ((z >> 1) % d.to(tl.uint64)).to(tl.int64)


@triton.jit(do_not_specialize=["seed", "d", "k"])  # a value of 1 would become a constexpr without .to()
def randk_indices(idx_ptr, seed, d, k, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    tl.store(idx_ptr + i, _splitmix_index(seed, i, d), mask=i < k)


@triton.jit(do_not_specialize=["seed", "d", "k"])
def randk_gather(x_ptr, vals_ptr, seed, d, k, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    mask = i < k
    idx = _splitmix_index(seed, i, d)
    tl.store(vals_ptr + i, tl.load(x_ptr + idx, mask=mask, other=0.0), mask=mask)
