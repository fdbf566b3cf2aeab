"""fsdp in the simulator against a published FSDP run: Llama 2 7B on 128 A100-80GB
(16 nodes x 8, InfiniBand), sequence 4096, bf16, no activation checkpointing (their MFU
equals their HFU, 57%): 3,700 tokens/s per GPU (IBM and Meta's PyTorch teams, "Maximizing
training throughput using PyTorch FSDP", PyTorch blog, 2024; as summarised at
https://thebeat.tech/articles/boosting-training-throughput-with-pytorch-fsdp-a-7b-llama-model-case-study).

    OMP_NUM_THREADS=1 python benchmarks/bench_fsdp_published.py

The micro batch (2 sequences per GPU) is our assumption; tokens/s per GPU barely
depends on it when compute dominates. Prints predicted beside published throughput, the
exposed communication, and what the device profile assumes (its efficiency is the
fraction of peak that training reaches, so the throughput error is mostly that figure's).
"""
from __future__ import annotations

from oresearcher.scenario import load_scenario
from oresearcher.sim.simulate import build_cluster, simulate

PUBLISHED_TOKENS_PER_GPU = 3700.0
PUBLISHED_MFU = 0.57
OVERRIDES = ["name=llama7b-128xA100-fsdp", "cluster.nodes=16", "cluster.inter_node=hdr-ib", "cluster.nics_per_node=8",
             "agents.count=128", "training.steps=2", "workload.global_batch=256",
             "workload.activation_checkpointing=false"]


def main() -> None:
    sc = load_scenario("scenarios/8xA100-llama7b-fsdp.yaml", OVERRIDES)
    report, _ = simulate(sc)
    tokens = sc.workload.global_batch * sc.workload.seq_len / sc.world_size
    predicted = tokens / report["step_time_s"]
    print(f"llama-7b, 128 x A100-80GB, seq {sc.workload.seq_len}, micro batch "
          f"{sc.workload.global_batch // sc.world_size}, no activation checkpointing")
    print(f"  tokens/s per GPU   predicted {predicted:8,.0f}   published {PUBLISHED_TOKENS_PER_GPU:8,.0f}   "
          f"error {predicted / PUBLISHED_TOKENS_PER_GPU - 1:+.1%}")
    print(f"  exposed communication {report['exposed_comm_time_s'] * 1e3:.1f} ms of a {report['step_time_s'] * 1e3:,.0f} ms "
          f"step ({report['comm_overhead']:.2%}); memory per GPU {report['memory']['total'] / 1e9:.1f} GB")
    eff = build_cluster(sc)[0].efficiency
    print(f"  the compute time rests on the A100 profile's training efficiency, {eff:.2f} of peak; the published "
          f"run reached {PUBLISHED_MFU:.2f} (ratio {eff / PUBLISHED_MFU:.2f})")


if __name__ == "__main__":
    main()
