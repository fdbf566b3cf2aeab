"""A report as the simulator writes it, small: what compare's tests damage field by field."""


def report(**kw) -> dict:
    r = {"step_time_s": 2.0, "compute_time_s": 1.5, "comm_time_s": 0.4, "exposed_comm_time_s": 0.5,
         "comm_overhead": 0.25, "wire_bytes_per_step": 3.4e6, "backend": "sim", "world_size": 2,
         "scenario": {"name": "local-gloo", "training": {"strategy": "ddp"}}}
    r.update(kw)
    return r
