"""The roofline model against a measured training step on this CPU (the CPU check).

    OMP_NUM_THREADS=1 python -m oresearcher.backends.calibration.roofline_check            # gpt-tiny and gpt-small-cpu

Each round measures this device's rates (:mod:`oresearcher.backends.calibration.device_rates`, as
``oresearcher.calibrate`` does) and, right after, a few real steps of the preset
(forward, backward, AdamW; fp32, one thread), so both see the same load on a shared
host; the prediction is the roofline price of the step with that round's rates. The
reported error is the median over rounds of predicted / measured - 1.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

CASES = (("gpt-tiny", 4, 64), ("gpt-small-cpu", 2, 128))


def cpu_profile(rates: dict):
    from oresearcher.calibration.profiles import profile_fields
    from oresearcher.hardware import DeviceProfile

    return DeviceProfile(name="cpu-measured", peak_flops={"fp32": rates["matmul_flops"]}, efficiency=1.0,
                         memory_bytes=8e9, host_overhead_us=0.0, compute_model="roofline",
                         foreach_optimizer=False, **profile_fields(rates))


def measured_step_s(model: str, micro_batch: int, seq_len: int, steps: int, state: dict) -> float:
    """Median seconds of ``steps`` real steps (the model is built once and kept in ``state``)."""
    from oresearcher.models import build_model, lm_loss

    if "model" not in state:
        torch.manual_seed(0)
        m = build_model(model, device="cpu")
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        tokens = torch.randint(m.cfg.vocab_size, (micro_batch, seq_len + 1))
        state.update(model=m, opt=opt, tokens=tokens)
    m, opt, tokens = state["model"], state["opt"], state["tokens"]

    def step():
        opt.zero_grad(set_to_none=False)
        lm_loss(m(tokens[:, :-1]), tokens[:, 1:]).backward()
        opt.step()

    step()  # warm-up (and the optimizer's state on the first round)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def check(model: str, micro_batch: int, seq_len: int, rounds: int = 5, steps: int = 3) -> dict:
    """{predicted_s, measured_s, error, errors} for one preset (medians over rounds)."""
    from oresearcher.backends.calibration.device_rates import measure_rates
    from oresearcher.sim.roofline import price_lm_step

    state, preds, meas, errs = {}, [], [], []
    for _ in range(rounds):
        rates = measure_rates(model, micro_batch, seq_len, "fp32", repeats=3)
        p = price_lm_step(cpu_profile(rates), model, micro_batch, seq_len, "fp32", False).step_s
        m = measured_step_s(model, micro_batch, seq_len, steps, state)
        preds.append(p)
        meas.append(m)
        errs.append(p / m - 1)
    return {"predicted_s": statistics.median(preds), "measured_s": statistics.median(meas),
            "error": statistics.median(errs), "errors": errs}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    print(f"{'model':<15}{'tokens':>9}{'predicted':>12}{'measured':>11}{'error':>8}   per round")
    for model, mb, t in CASES:
        r = check(model, mb, t, rounds=a.rounds)
        rounds = " ".join(f"{e:+.0%}" for e in r["errors"])
        print(f"{model:<15}{f'{mb}x{t}':>9}{r['predicted_s'] * 1e3:>9.1f} ms{r['measured_s'] * 1e3:>8.1f} ms"
              f"{r['error']:>+8.1%}   {rounds}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
