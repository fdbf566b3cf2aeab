"""The roofline compute model against measured steps: the figures of one H200 probe and,
on this machine, gpt-tiny / gpt-small-cpu.

    OMP_NUM_THREADS=1 python benchmarks/bench_roofline.py             # GPU table + CPU check
    OMP_NUM_THREADS=1 python benchmarks/bench_roofline.py --no-cpu    # GPU table only (no timing)

GPU: fwd + bwd + AdamW of one step, 8 x 2048 tokens, bf16, activation checkpointing, one
H200, as measured by a probe (steady state, data excluded): gpt-125m 77 ms,
gpt-1.3b 393 ms. The profile's constants come from vendor specs and published kernel
rates (oresearcher/hardware/profiles/H200.yaml), not from these two numbers. The probe ran the learner
of that time (bf16 parameters and bf16 AdamW state); the roofline prices today's mixed
precision learner (fp32 masters and AdamW state: twice the optimizer bytes).
"""
from __future__ import annotations

import argparse

MEASURED_H200_MS = {"gpt-125m": 77.0, "gpt-350m": None, "gpt-1.3b": 393.0}


def gpu_table() -> None:
    from oresearcher.models.op_trace import pass_ops
    from oresearcher.hardware import builtin_profiles, lookup
    from oresearcher.sim.roofline import Roofline, price_lm_step

    dev = lookup(builtin_profiles(), "device", "H200:roofline", "bench")
    roof = Roofline.from_profile(dev, "bf16")
    print("H200, 8 x 2048 tokens, bf16, activation checkpointing: fwd + bwd + AdamW per step")
    print(f"{'model':<10}{'flat':>9}{'roofline':>10}{'measured':>10}{'err flat':>10}{'err roof':>10}"
          f"   roofline split: compute / memory / launch / optimizer ms")
    for model, measured in MEASURED_H200_MS.items():
        p = price_lm_step(dev, model, 8, 2048, "bf16", True)
        flat = p.pass_flops / dev.flops_per_s("bf16")  # the flat model charges no optimizer time
        b = roof.breakdown(pass_ops(model, 8, 2048, "bf16", True))
        err = (lambda x: f"{(x / (measured / 1e3) - 1):+.0%}") if measured else (lambda x: "-")
        print(f"{model:<10}{flat * 1e3:>6.1f} ms{p.step_s * 1e3:>7.1f} ms"
              f"{(f'{measured:.0f} ms' if measured else '-'):>10}{err(flat):>10}{err(p.step_s):>10}"
              f"   {b['compute_bound_s'] * 1e3:.1f} / {b['memory_bound_s'] * 1e3:.1f} / {b['launch_s'] * 1e3:.1f}"
              f" / {p.optimizer_s * 1e3:.1f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-cpu", action="store_true", help="skip the timed CPU check")
    a = ap.parse_args(argv)
    gpu_table()
    if not a.no_cpu:
        from oresearcher.backends.calibration.roofline_check import main as cpu_main

        print("\nthis CPU, one thread, fp32, rates measured as calibrate does (medians of 5 rounds):")
        cpu_main([])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
