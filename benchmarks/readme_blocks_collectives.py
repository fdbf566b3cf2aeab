"""The README's figure blocks of the collective model (see readme_blocks.py, which lists
every block): the 8xA100 all-reduce against a published nccl-tests curve, two nodes with
4 and with 8 NICs, and the model's error against each shipped published curve.
"""
from __future__ import annotations

import sys
import tempfile

from readme_run import ROOT, fence, run


ABCI = "tests/data/nccl-abci2-intra-anode-job08-a100sxm40-8gpu.csv"  # the published curve, shipped with its source
SHOWN_SIZES = ("8 B", "64 KiB", "1 MiB", "4 MiB", "16 MiB", "32 MiB")


def collective_bench() -> str:
    with tempfile.TemporaryDirectory() as tmp:
        out = run(f"python -m oresearcher.sim scenarios/8xA100.yaml --collective-bench all_reduce --reference {ABCI} "
                  f"--out {tmp}")
        full = run(f"python -m oresearcher.sim scenarios/8xA100.yaml --collective-bench all_reduce --out {tmp}")
    keep = [ln for ln in out.splitlines() if ln.startswith("┃") or ln.startswith("ref ") or ln.startswith("  error")
            or (ln.startswith("│") and ln.split("│")[1].strip() in SHOWN_SIZES)]
    cells = {ln.split("│")[1].strip(): [float(c.replace(",", "")) for c in ln.split("│")[2:5]]
             for ln in full.splitlines() if ln.startswith("│")}
    big = {size: row[0] for size, row in cells.items()}
    busbw = cells["8 GiB"][2]
    tail = (f"(without --reference, up to 8 GiB: 256 MiB {big['256 MiB']:,.1f} us, "
            f"1 GiB {big['1 GiB']:,.1f} us, 8 GiB {big['8 GiB']:,.1f} us = busbw {busbw:.1f} GB/s)")
    head = (f"$ python -m oresearcher.sim scenarios/8xA100.yaml --collective-bench all_reduce \\\n"
            f"    --reference {ABCI}   (trimmed)")
    return fence("\n".join([head, *keep, tail]))


NIC_SIZES = ("256 KiB", "1 MiB", "16 MiB", "256 MiB", "4 GiB")


def nic_4_vs_8() -> str:
    """All-reduce bus bandwidth on two A100 nodes with 8 and with 4 NICs per node at a few
    sizes: the rows the two commands print there, from the function they call."""
    sys.path.insert(0, str(ROOT))
    from oresearcher.scenario import load_scenario
    from oresearcher.sim.bench import bench_cluster, collective_bench
    from oresearcher.reporting.units import format_bytes

    sizes = [parse_size(x) for x in NIC_SIZES]
    lines, busbw = [], {}
    for nics, name, pad in (("8 NICs", "2x8xA100", "     "), ("4 NICs", "2x8xA100-4nic", "")):
        lines.append(f"$ python -m oresearcher.sim scenarios/{name}.yaml --collective-bench all_reduce   {pad}(trimmed)")
        scenario = load_scenario(ROOT / "scenarios" / f"{name}.yaml")
        device, topo = bench_cluster(scenario)
        rows = collective_bench(topo, device, "all_reduce", sizes, scenario.communication.algorithm)
        busbw[nics] = {format_bytes(r["size_bytes"], binary=True): f"{r['busbw_GBps']:.2f}" for r in rows}
    width = max(len(x) for x in NIC_SIZES) + 2
    lines.append("busbw (GB/s)" + "".join(f"{x:>{width}}" for x in NIC_SIZES))
    lines += [f"{nics:<12}" + "".join(f"{busbw[nics][x]:>{width}}" for x in NIC_SIZES) for nics in busbw]
    return fence("\n".join(lines))


GDR_SIZES = ("1 MiB", "16 MiB", "256 MiB", "4 GiB")


def gdr_level() -> str:
    """The 4-NIC A100 nodes' all-reduce with GPUDirect RDMA (the layout's PIX path, within
    the default level PXB) and without it (level LOC: through host memory and the uplinks)."""
    sys.path.insert(0, str(ROOT))
    from oresearcher.scenario import load_scenario
    from oresearcher.sim.bench import bench_cluster, collective_bench
    from oresearcher.reporting.units import format_bytes

    sizes = [parse_size(x) for x in GDR_SIZES]
    width = max(len(x) for x in GDR_SIZES) + 14
    cmd = "$ python -m oresearcher.sim scenarios/2x8xA100-4nic.yaml --collective-bench all_reduce"
    lines = [f"{cmd}                                (trimmed)",
             f"{cmd} --set cluster.gdr_level=LOC   (trimmed)",
             "busbw GB/s" + "".join(f"{x:>{width}}" for x in GDR_SIZES)]
    for label, sets in (("GDR", []), ("LOC", ["cluster.gdr_level=LOC"])):
        scenario = load_scenario(ROOT / "scenarios" / "2x8xA100-4nic.yaml", sets)
        device, topo = bench_cluster(scenario)
        rows = collective_bench(topo, device, "all_reduce", sizes, scenario.communication.algorithm)
        cells = {format_bytes(r["size_bytes"], binary=True): f"{r['busbw_GBps']:.1f} ({r['algorithm']})" for r in rows}
        lines.append(f"{label:<10}" + "".join(f"{cells[x]:>{width}}" for x in GDR_SIZES))
    return fence("\n".join(lines))


def parse_size(text: str) -> int:
    """"256 KiB" -> 262144."""
    number, unit = text.split()
    return int(number) * 2 ** (10 * ("B", "KiB", "MiB", "GiB").index(unit))


CURVES = {  # reference name -> the README's description of it
    "abci2-intra-anode-job08-a100sxm40-8gpu": ("ABCI 2.0, NCCL 2.8.4, one process per GPU, 4 B - 32 MiB",
                                               "1 x 8 A100, NVSwitch"),
    "oci-spinup-gpu-cluster-a100sxm40-8gpu": ("OCI BM.GPU4.8, `-g 8`, 1 MiB - 8 GiB", "1 x 8 A100, NVSwitch"),
    "oci-spinup-gpu-cluster-61925d8-a100sxm40-2node-roce": (
        "OCI, 2 nodes, RoCE 16 x 100 GbE per node, 64 B - 1 GiB", "2 x 8 A100"),
}


def collective_errors() -> str:
    sys.path.insert(0, str(ROOT))
    from oresearcher.sim.bench import reference_check

    rows = ["| published curve (tests/data/) | cluster | error |", "|---|---|---|"]
    for name, (what, cluster) in CURVES.items():
        _, _, err = reference_check(name, ROOT / "tests" / "data" / f"nccl-{name}.csv")
        rows.append(f"| {what} | {cluster} | {err:.1%} |")
    return "\n".join(rows) + "\n"
