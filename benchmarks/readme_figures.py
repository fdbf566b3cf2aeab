"""Regenerate the README's figures from fresh runs, in place, so they cannot drift.

    python benchmarks/readme_figures.py                  # every block: run, rewrite README.md
    python benchmarks/readme_figures.py --quick          # only the quick blocks (seconds each)
    python benchmarks/readme_figures.py --check --quick  # what CI runs: exit 1 with a diff on drift
    python benchmarks/readme_figures.py --only sim-8xA100
    python benchmarks/readme_figures.py --list

A figure in README.md sits between two HTML comments, invisible on GitHub:

    <!-- fig:NAME -->
    ...what the generator printed...
    <!-- /fig:NAME -->

Each NAME has a generator below (``BLOCKS``): it runs the command the README shows (a
subprocess in the repository root, 100 columns, one thread) or calls the benchmark's
function, and returns the text between the markers. Only the text inside markers is
replaced, and README.md is read again just before it is written, so edits elsewhere in
the file (by hand, at the same time) survive. A block marked non-quick takes minutes
(``--list`` says which); ``--check`` without ``--quick`` runs them too. Blocks with
``images`` also copy the figure the run drew into docs/img/ (not in ``--check``).

Figures that are wall-clock measurements of this machine (codec speeds, simulator speed,
sim-to-real, the cooperation/privacy/replay/finance benchmarks) move from run to run and
are not regenerated here; the README names the command beside each of them.
"""
from __future__ import annotations

import argparse
import difflib
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
COLUMNS = 100
MARK = re.compile(r"<!-- fig:([\w.-]+) -->\n(.*?)<!-- /fig:\1 -->", re.S)


@dataclass
class Block:
    name: str
    command: str  # what the README says prints it
    generate: Callable[[], str]  # the text between the markers
    quick: bool = True
    images: dict = field(default_factory=dict)  # file a run wrote -> README image path


# ---- running things ---------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def run(cmd: str, cwd: Path = ROOT, stderr: bool = False, ok=(0,)) -> str:
    """Run ``cmd`` as the README shows it (python = this interpreter); its stdout (and
    stderr after it, with ``stderr``), trailing spaces stripped. Once per process: two
    blocks made from one run share it."""
    argv = cmd.split()
    if argv[0] == "python":
        argv[0] = sys.executable
    env = dict(os.environ, COLUMNS=str(COLUMNS), OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
    env.pop("FORCE_COLOR", None)
    p = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    if p.returncode not in ok:
        raise RuntimeError(f"{cmd}: exit {p.returncode}\n{p.stderr[-2000:]}")
    text = p.stdout + (p.stderr if stderr else "")
    return "\n".join(line.rstrip() for line in text.splitlines())


def fence(text: str) -> str:
    return f"```\n{text.strip(chr(10))}\n```\n"


def session(*commands: str, **kw) -> str:
    """A terminal session: ``$ command`` then what it printed, for each command."""
    return fence("\n".join(f"$ {c}\n{run(c, **kw)}" for c in commands))


# ---- the generators ---------------------------------------------------------------------
def sim_8xa100() -> str:
    return session("python -m oresearcher.sim scenarios/8xA100.yaml")


def _report(cmd: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        run(f"{cmd} --out {tmp}")
        return json.loads((Path(tmp) / "report.json").read_text())


def sim_8xa100_text() -> str:
    """The paragraph that explains the reference run's figures and its timeline."""
    run("python -m oresearcher.sim scenarios/8xA100.yaml")
    r = json.loads((ROOT / "runs" / "8xA100" / "report.json").read_text())
    sc, steps, ws = r["scenario"], r["steps"], r["world_size"]
    interval = sc["communication"]["interval"]
    rounds = steps // interval
    m = r["metrics"]
    opt = [int(k) for k, v in m.items() if v and v[0].get("role") == 1]
    times = [e["time_s"] for e in m["0"]]
    durations = [b - a for a, b in zip([0.0, *times], times)]
    slow, fast = durations[0], min(durations)
    opt_steps = len(m[str(opt[0])]) // rounds
    wait = {b["name"]: b["peer_wait_s"] for b in r["breakdown"]}
    ms = lambda x: f"{1e3 * x:,.0f}"  # noqa: E731
    per_step = {k: v / steps / ws for k, v in wait.items()}
    text = (
        f"The prediction: **{r['comm_overhead']:.1%} communication overhead**, and the tables say why: "
        f"{ms(r['peer_wait_time_s'])} of the {ms(r['comm_time_s'])} ms of communication per step is waiting for "
        f"slower peers, not the network. Each {interval}-step round (`communication.interval`) has two phases. "
        f"The {len(opt)} optimizers (ranks {opt[0]}-{opt[-1]}) use SAM, whose steps cost two forward-backward "
        f"passes, and run {opt_steps} steps of each round. While they run, all {ws} agents share gradients every "
        f"step, so a step takes {slow:.2f} s, and the explorers and validators wait for the optimizers at the "
        f"gradient all-reduce (`grad_share`: {ms(per_step['grad_share'])} ms per step, averaged over the run). "
        f"Then the optimizers wait at the round's parameter all-gather (`param_gather`: "
        f"{ms(per_step['param_gather'])} ms per step; {wait['param_gather'] / len(opt) / rounds:.0f} s a round for "
        f"each optimizer) while the other {ws - len(opt)} agents take their remaining steps at {fast:.2f} s. The "
        f"table's step time, {1e3 * r['step_time_s']:,.1f} ms, is the whole run ({r['total_time_s']:.1f} s) over "
        f"its {steps} steps, the mean of the two phases; no warm-up is excluded. The timeline shows the first 3 "
        f"steps, all in the slow phase ({slow:.2f} s each; ranks {opt[0]}-{opt[-1]} are the optimizers):")
    return textwrap.fill(text, 88, break_on_hyphens=False) + "\n"


VARIANTS = ("", "--set cooperation.roles.optimizer_method=swa",
            "--set training.strategy=ddp --set training.steps=20",
            "--set communication.codec=int8 --set training.strategy=ddp --set training.steps=3")


def sim_variants() -> str:
    rows = ["| command | step time | comm in flight | exposed | overhead |", "|---|---|---|---|---|"]
    base = "python -m oresearcher.sim scenarios/8xA100.yaml"
    for v in VARIANTS:
        r = _report(f"{base} {v}".strip())
        shown = f"`{base}`" if not v else f"`... {v}`"
        rows.append(f"| {shown} | {1e3 * r['step_time_s']:,.1f} ms | {1e3 * r['comm_time_s']:,.1f} ms | "
                    f"{1e3 * r['exposed_comm_time_s']:,.1f} ms | {r['comm_overhead']:.2%} |")
    return "\n".join(rows) + "\n"


def sim_two_nodes() -> str:
    r = _report("python -m oresearcher.sim scenarios/2x8xA100.yaml")
    return (f"(`scenarios/2x8xA100.yaml`, DDP) communication in flight is {1e3 * r['comm_time_s']:,.1f} ms, "
            f"exposed {1e3 * r['exposed_comm_time_s']:,.1f} ms ({r['comm_overhead']:.2%}).\n")


BAD_YAML = "cluster: {nodes: 1, gpus_per_node: 0, device: A100-SXM4-80GB, intra_node: nvswitch-a100}\n"


def bad_input() -> str:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "bad.yaml").write_text(BAD_YAML)
        first = run("python -m oresearcher.sim bad.yaml", cwd=Path(tmp), stderr=True, ok=(2,))
    second = run("python -m oresearcher.sim scenarios/8xA100.yaml --set cluster.device=Z80", stderr=True, ok=(2,))
    return fence(f"$ python -m oresearcher.sim bad.yaml\n{first}\n"
                 f"$ python -m oresearcher.sim scenarios/8xA100.yaml --set cluster.device=Z80\n{second}")


ABCI = "../shared/nccl-reference/abci2-intra-anode-job08-a100sxm40-8gpu.csv"
SHOWN_SIZES = ("8 B", "64 KiB", "1 MiB", "4 MiB", "16 MiB", "32 MiB")


def collective_bench() -> str:
    ref = ABCI if (ROOT / ABCI).is_file() else "tests/data/nccl-abci2-intra-anode-job08-a100sxm40-8gpu.csv"
    with tempfile.TemporaryDirectory() as tmp:
        out = run(f"python -m oresearcher.sim scenarios/8xA100.yaml --collective-bench all_reduce --reference {ref} "
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


def codec_accuracy() -> str:
    out = run("python benchmarks/bench_codecs.py --accuracy-only --seeds 5")
    got = {}
    for ln in out.splitlines():
        m = re.match(r"\s+(\S+)\s+([\d.]+)%\s+([+-][\d.]+) \+- ([\d.]+) points", ln)
        if m:
            got[m.group(1)] = (float(m.group(2)), float(m.group(3)), float(m.group(4)))

    def d(spec):
        _, mean, std = got[spec]
        return f"{mean:+.2f} ± {std:.2f}"

    return (f"int8 {d('int8')} points, int8:stochastic {d('int8:stochastic')},\n"
            f"ef(int8) {d('ef(int8)')}, ef(topk:0.01+int8) {d('ef(topk:0.01+int8)')}, ef(topk:0.01) "
            f"{d('ef(topk:0.01)')},\ntopk:0.01 without error feedback {d('topk:0.01')} "
            f"(baseline {got['none'][0]:.2f}%).\n")


BLOCKS = [
    Block("sim-8xA100", "python -m oresearcher.sim scenarios/8xA100.yaml", sim_8xa100,
          images={"runs/8xA100/timeline.png": "docs/img/8xA100-timeline.png"}),
    Block("sim-8xA100-text", "python -m oresearcher.sim scenarios/8xA100.yaml (report.json)", sim_8xa100_text),
    Block("sim-variants", "python -m oresearcher.sim scenarios/8xA100.yaml --set ... (4 runs)", sim_variants,
          quick=False),
    Block("sim-2x8xA100", "python -m oresearcher.sim scenarios/2x8xA100.yaml", sim_two_nodes, quick=False),
    Block("bad-input", "python -m oresearcher.sim bad.yaml (and an unknown device)", bad_input),
    Block("collective-bench", "python -m oresearcher.sim scenarios/8xA100.yaml --collective-bench all_reduce "
          "--reference ...", collective_bench),
    Block("collective-errors", "python benchmarks/bench_collectives.py", collective_errors),
    Block("codec-accuracy", "python benchmarks/bench_codecs.py --accuracy-only --seeds 5", codec_accuracy,
          quick=False),
]


# ---- the README -------------------------------------------------------------------------
def blocks_in(text: str) -> dict[str, str]:
    """NAME -> the text between its markers."""
    found = {}
    for m in MARK.finditer(text):
        if m.group(1) in found:
            raise ValueError(f"README.md: fig:{m.group(1)} appears twice")
        found[m.group(1)] = m.group(2)
    opened = set(re.findall(r"<!-- fig:([\w.-]+) -->", text))
    if opened - set(found):
        raise ValueError(f"README.md: fig:{sorted(opened - set(found))[0]} has no matching <!-- /fig:... --> line")
    return found


def replace(text: str, new: dict[str, str]) -> str:
    """``text`` with the inside of each named block replaced; nothing outside markers moves."""
    return MARK.sub(lambda m: f"<!-- fig:{m.group(1)} -->\n{new.get(m.group(1), m.group(2))}<!-- /fig:{m.group(1)} -->",
                    text)


def select(names, quick: bool) -> list[Block]:
    known = {b.name: b for b in BLOCKS}
    if names:
        unknown = [n for n in names if n not in known]
        if unknown:
            raise SystemExit(f"error: --only {unknown[0]}: no such block (known: {', '.join(known)})")
        return [known[n] for n in names]
    return [b for b in BLOCKS if b.quick or not quick]


def regenerate(blocks: list[Block], log=print) -> dict[str, str]:
    new = {}
    for b in blocks:
        log(f"regenerating {b.name}: {b.command}")
        new[b.name] = b.generate()
    return new


def diff(old: str, new: str, name: str) -> str:
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"README.md fig:{name}",
                                        f"fresh fig:{name}"))


def check(blocks: list[Block], log=print) -> list[str]:
    """The diff of every block whose README text differs from a fresh run (empty: all match)."""
    present = blocks_in(README.read_text())
    missing = [b.name for b in blocks if b.name not in present]
    if missing:
        raise SystemExit(f"error: README.md has no <!-- fig:{missing[0]} --> block")
    fresh = regenerate(blocks, log)
    return [diff(present[n], t, n) for n, t in fresh.items() if present[n] != t]


def write(blocks: list[Block], log=print) -> list[str]:
    """Regenerate ``blocks`` and rewrite their README text; returns the names that changed."""
    blocks_in(README.read_text())  # fail before minutes of work on a broken README
    fresh = regenerate(blocks, log)
    for b in blocks:
        for src, dst in b.images.items():
            if (ROOT / src).is_file():
                shutil.copyfile(ROOT / src, ROOT / dst)
    text = README.read_text()  # fresh: others may have edited other sections meanwhile
    present = blocks_in(text)
    changed = [n for n, t in fresh.items() if n in present and present[n] != t]
    skipped = [n for n in fresh if n not in present]
    for n in skipped:
        log(f"warning: README.md has no <!-- fig:{n} --> block; {n} not written")
    tmp = README.with_suffix(".md.tmp")
    tmp.write_text(replace(text, fresh))
    tmp.replace(README)
    return changed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/readme_figures.py", description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="regenerate into memory; exit 1 with a diff if README differs")
    ap.add_argument("--quick", action="store_true", help="only the blocks that take seconds (--list marks them)")
    ap.add_argument("--only", action="append", metavar="NAME", help="one block (repeatable); see --list")
    ap.add_argument("--list", action="store_true", help="list the blocks, their commands and whether they are quick")
    args = ap.parse_args(argv)
    if args.list:
        for b in BLOCKS:
            print(f"{b.name:18} {'quick' if b.quick else 'slow ':5}  {b.command}")
        return 0
    blocks = select(args.only, args.quick)
    log = (lambda s: print(s, file=sys.stderr, flush=True))
    if args.check:
        diffs = check(blocks, log)
        for d in diffs:
            print(d)
        print(f"{len(diffs)} of {len(blocks)} README blocks differ from a fresh run" if diffs
              else f"all {len(blocks)} README blocks match a fresh run", file=sys.stderr)
        return 1 if diffs else 0
    changed = write(blocks, log)
    print(f"README.md: {len(changed)} of {len(blocks)} blocks changed" + (f" ({', '.join(changed)})" if changed else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
