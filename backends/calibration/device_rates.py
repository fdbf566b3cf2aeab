"""What the roofline model (``sim/roofline.py``) needs to know about this device, measured:
achieved matmul rate, memory bandwidth and the cost of one kernel launch.

- matmul: the workload's own GEMM shapes, as calibration anchors collectives at the
  workload's sizes: the MLP up-projection of a micro batch (tokens x d -> 4d) forward and
  its two backward GEMMs, FLOP/s = FLOPs / time over the three, with *cold* operands
  (distinct sets cycled over 64 MB; 512 MB on GPUs), as the roofline assumes every kernel streams its
  operands from memory. Here one core runs that GEMM at ~200 GFLOP/s when the same
  operands repeat (cache-hot, how microbenchmarks flatter) and at ~30 GFLOP/s cold,
  which is what the same GEMMs reach inside a training step (~40, torch.profiler).
- attention: ``F.scaled_dot_product_attention(causal)`` forward + backward at the model's
  (batch, heads, T, head_dim), operands cycled as for matmul, FLOP/s on torch's counted FLOPs (full T x T) times
  ``CAUSAL_SHARE``, i.e. the rate the roofline charges (CPU flash attention runs far
  below the GEMM rate).
- memory bandwidth: ``dst.copy_(src)`` over 64 MB on CPU, 512 MB on GPU (beyond the
  last-level cache); bytes moved = read + write (2x the buffer), as the roofline counts.
- launch: a chain of tiny (matmul, layer norm, GELU, add) blocks with autograd,
  forward and backward, divided by the kernels the same chain launches (counted by
  :class:`oresearcher.models.op_trace.KernelRecorder` on the meta device): the fixed cost per
  kernel of eager PyTorch on this host, dispatcher and autograd included.

Every figure is the median of ``repeats`` timings after a warm-up. On CUDA the device is
synchronised around each timing. Used by ``oresearcher.calibrate`` (written into the
device profile) and by the CPU roofline test.
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

from oresearcher.models.op_trace import KernelRecorder

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _median_s(fn, repeats: int, device) -> float:
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


COLD_BYTES = 64 * 10**6  # operand sets are cycled until they span this: beyond any CPU's last-level cache
COLD_BYTES_GPU = 512 * 10**6  # ... and ten times a datacenter GPU's L2 (40-60 MB on A100/H100/H200)


def _cold_bytes(device) -> int:
    return COLD_BYTES_GPU if torch.device(device).type == "cuda" else COLD_BYTES


def _copies(nbytes_per_set: int, device="cpu") -> int:
    return max(2, -(-_cold_bytes(device) // max(1, nbytes_per_set)))


def matmul_rate(tokens: int, d_model: int, dtype: str = "fp32", repeats: int = 9, device="cpu") -> float:
    """Achieved FLOP/s of an MLP up-projection's forward and backward GEMMs, operands cold."""
    dt = DTYPES[dtype]
    size = torch.empty((), dtype=dt).element_size() * (tokens * d_model + 4 * d_model * d_model + 4 * tokens * d_model)
    sets = [(torch.randn(tokens, d_model, device=device).to(dt), torch.randn(d_model, 4 * d_model, device=device).to(dt),
             torch.randn(tokens, 4 * d_model, device=device).to(dt)) for _ in range(_copies(size, device))]

    def gemms():
        for x, w, g in sets:
            torch.mm(x, w)  # forward
            torch.mm(g, w.t())  # grad of the input
            torch.mm(x.t(), g)  # grad of the weight

    return len(sets) * 3 * 2.0 * tokens * d_model * 4 * d_model / _median_s(gemms, repeats, device)


def attention_rate(batch: int, heads: int, seq_len: int, head_dim: int, dtype: str = "fp32", repeats: int = 5,
                   device="cpu") -> float:
    """FLOP/s of causal SDPA forward + backward, on the FLOPs the roofline charges."""
    from torch.utils.flop_counter import FlopCounterMode

    from oresearcher.sim.roofline import CAUSAL_SHARE

    def make():
        return [torch.randn(batch, heads, seq_len, head_dim, device=device).to(DTYPES[dtype]).requires_grad_()
                for _ in range(3)]

    def run(q, k, v):
        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()

    with FlopCounterMode(display=False) as counter:
        run(*[t.to("meta").detach().requires_grad_() for t in make()])
    size = 3 * batch * heads * seq_len * head_dim * torch.empty((), dtype=DTYPES[dtype]).element_size()
    sets = [make() for _ in range(min(16, _copies(size, device)))]

    def all_sets():
        for qkv in sets:
            run(*qkv)

    return len(sets) * counter.get_total_flops() * CAUSAL_SHARE / _median_s(all_sets, repeats, device)


def memory_bandwidth(nbytes: int | None = None, repeats: int = 9, device="cpu") -> float:
    """Achieved bytes/s of a device copy (read + write) of ``nbytes`` (default: the cold
    size, beyond the last-level cache)."""
    nbytes = nbytes or _cold_bytes(device)
    src = torch.ones(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    return 2.0 * src.numel() * 4 / _median_s(lambda: dst.copy_(src), repeats, device)


def _chain(x: torch.Tensor, w: torch.Tensor, blocks: int) -> None:
    y = x
    for _ in range(blocks):  # a transformer's op mix: matmul, norm, activation, residual
        y = y + F.gelu(F.layer_norm(y @ w, y.shape[-1:]))
    y.sum().backward()


def launch_cost(blocks: int = 50, repeats: int = 9, device="cpu") -> float:
    """Seconds per kernel of eager PyTorch: forward and backward of a chain of tiny
    (matmul, layer norm, GELU, add) blocks, whose work is negligible, over the kernels
    the chain launches."""
    rec = KernelRecorder()
    with rec:
        _chain(torch.ones(4, 8, device="meta", requires_grad=True), torch.ones(8, 8, device="meta",
                                                                                 requires_grad=True), blocks)
    kernels = sum(o.launches for o in rec.ops)
    x = torch.ones(4, 8, device=device, requires_grad=True)
    w = torch.eye(8, device=device, requires_grad=True)
    return _median_s(lambda: _chain(x, w, blocks), repeats, device) / kernels


def measure_rates(model: str, micro_batch: int, seq_len: int, dtype: str = "fp32", device="cpu",
                  repeats: int = 9) -> dict:
    """{matmul_flops, attention_flops, memory_bandwidth_Bps, launch_s} of this device,
    at preset ``model``'s shapes for one micro batch."""
    from oresearcher.models import PRESETS

    cfg = PRESETS[model]
    return {"matmul_flops": matmul_rate(micro_batch * seq_len, cfg.d_model, dtype, repeats, device),
            "attention_flops": attention_rate(micro_batch, cfg.n_head, seq_len, cfg.head_dim, dtype,
                                              max(3, repeats // 2), device),
            "memory_bandwidth_Bps": memory_bandwidth(repeats=repeats, device=device),
            "launch_s": launch_cost(repeats=repeats, device=device)}
