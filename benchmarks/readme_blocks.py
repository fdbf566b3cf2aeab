"""The README's figure blocks: for each, the command the README shows and a generator that
returns the text between its markers (see readme_figures.py, which rewrites README.md).

A generator runs the command as a subprocess in the repository root (100 columns unless
a block needs wider lines, one thread) or calls the benchmark's function, and trims the
output to what the README shows.
"""
from __future__ import annotations

import json
import re
import sys
import tempfile
import textwrap
from pathlib import Path

from readme_run import ROOT, Block, _report, fence, run, transcript  # noqa: F401 (Block: readme_figures)
from readme_blocks_collectives import collective_bench, collective_errors, gdr_level, nic_4_vs_8  # the collective model's blocks


# ---- the generators ---------------------------------------------------------------------
def sim_8xa100() -> str:
    return transcript("python -m oresearcher.sim scenarios/8xA100.yaml")


def sim_8xa100_table() -> str:
    """The README's first screen: the reference run's main table (the first one it prints)."""
    out = run("python -m oresearcher.sim scenarios/8xA100.yaml").splitlines()
    end = next(i for i, ln in enumerate(out) if ln.startswith("└"))
    return fence("\n".join(["$ python -m oresearcher.sim scenarios/8xA100.yaml   (trimmed)",
                             *out[2:end + 1]]))


def sim_8xa100_text() -> str:
    """The paragraph that explains the reference run's figures, with and without the
    overhead controller, and its timeline."""
    run("python -m oresearcher.sim scenarios/8xA100.yaml")
    r = json.loads((ROOT / "runs" / "8xA100" / "report.json").read_text())
    sc, steps, ws = r["scenario"], r["steps"], r["world_size"]
    plain = r["without_controller"]
    m = r["metrics"]
    opt = [int(k) for k, v in m.items() if v and v[0].get("role") == 1]
    k = next(e["budget_k"] for e in m[str(opt[0])] if "budget_k" in e)
    k_other = next(e["budget_k"] for e in m["0"] if "budget_k" in e)
    ms = lambda x: f"{1e3 * x:,.1f}"  # noqa: E731
    text = (
        f"The prediction: **{r['comm_overhead']:.1%} communication overhead** with the seed's overhead "
        f"controller on (`communication.budget: {sc['communication']['budget']}`, [budget.md](budget.md)), "
        f"**{plain['comm_overhead']:.1%} without it** (the table's line below the overhead: step "
        f"{ms(plain['step_time_s'])} ms). Without it nearly all of that is waiting, not the network: the "
        f"{len(opt)} optimizers (ranks {opt[0]}-{opt[-1]}) use SAM, whose steps cost two forward-backward "
        f"passes, and the other agents wait for them at every step's gradient share. The controller balances "
        f"by time: a SAM agent shares every {'step' if k == 1 else f'{k:g} steps'}, the others every "
        f"{'step' if k_other == 1 else f'{k_other:g} steps'}, "
        f"so all arrive together, with the same bytes on the wire. The table's step time, "
        f"{ms(r['step_time_s'])} ms, is the whole run ({r['total_time_s']:.1f} s) over its {steps} steps "
        f"({ws} ranks); no warm-up is excluded. The timeline shows the first 3 steps (ranks "
        f"{opt[0]}-{opt[-1]} are the optimizers):")
    return textwrap.fill(text, 88, break_on_hyphens=False) + "\n"


def sim_digits_final() -> str:
    """The end of a numeric-mode simulation: each agent's final metric and the deployable model's."""
    cmd = "python -m oresearcher.sim scenarios/digits-4.yaml"
    lines = run(cmd, columns=120).splitlines()
    start = next(i for i, ln in enumerate(lines) if "┃ agent" in ln) - 1  # the final table's top
    end = next(i for i, ln in enumerate(lines) if ln.startswith("deployable model:"))
    return fence(f"$ {cmd}      (trimmed)\n" + "\n".join(lines[start:end + 1]))


def sim_fsdp() -> str:
    """The sharded llama-7b run, trimmed to its headline rows; DDP's memory verdict beside it."""
    cmd = "python -m oresearcher.sim scenarios/8xA100-llama7b-fsdp.yaml"
    out = run(cmd, columns=200).splitlines()
    keep = [ln for ln in out if ": fsdp, " in ln or ln.startswith("memory per GPU")
            or (ln.startswith("│") and "waiting for slower" not in ln)]
    ddp = f"{cmd} --set training.strategy=ddp"
    verdict = [ln for ln in run(ddp, columns=200).splitlines() if ln.startswith(("memory per GPU", "  advice"))]
    return fence(f"$ {cmd}      (trimmed)\n" + "\n".join(keep) + f"\n\n$ {ddp}      (trimmed)\n" + "\n".join(verdict))


FAULTS = ("python -m oresearcher.sim 8xA100 --set training.strategy=ddp --set training.steps=50 \\\n"
          "    --set training.checkpoint_every=10 --set 'faults.stragglers=[{ranks: [3], factor: 1.2}]' \\\n"
          "    --set 'faults.links=[{start_s: 10, duration_s: 20, bandwidth_factor: 0.1}]' \\\n"
          "    --set 'faults.failures=[{at_s: 40, rank: 2}]' --set faults.restart_delay_s=30")


def sim_faults() -> str:
    """The faults table of a ddp run with a straggler, a slow link window and a lost rank."""
    out = run(FAULTS.replace("\\\n    ", ""), columns=120).splitlines()
    start = next(i for i, ln in enumerate(out) if ln.strip() == "faults")  # the table's title
    end = next(i for i, ln in enumerate(out) if "goodput" in ln)
    return fence(f"$ {FAULTS}\n...\n" + "\n".join(out[start:end + 1]))


SWEEP = ("python -m oresearcher.sim scenarios/8xA100.yaml --set training.strategy=ddp --set training.steps=5 "
         "--sweep communication.bucket_size_MB=1,25,100,400,1000")


def sim_sweep() -> str:
    """The bucket-size sweep's table (its figure goes to docs/img)."""
    out = run(SWEEP, columns=80).splitlines()
    start = next(i for i, ln in enumerate(out) if ln.lstrip().startswith("sweep of"))
    end = next(i for i, ln in enumerate(out) if ln.startswith("wrote"))
    shown = SWEEP.replace(" --sweep", " \\\n    --sweep")
    return fence(f"$ {shown}\n" + "\n".join(out[start:end + 1]))


def roofline_h200() -> str:
    """The flat and roofline models against the H200 measurements (no timing on this machine)."""
    out = run("python benchmarks/bench_roofline.py --no-cpu", columns=160).splitlines()
    start = next(i for i, ln in enumerate(out) if ln.startswith("model "))
    return fence("\n".join(ln for ln in out[start:] if ln.strip()))


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
    return textwrap.fill(f"On two nodes over HDR InfiniBand (`python -m oresearcher.sim scenarios/2x8xA100.yaml`, "
                         f"DDP) step time is {1e3 * r['step_time_s']:,.1f} ms, communication in flight "
                         f"{1e3 * r['comm_time_s']:,.1f} ms, exposed {1e3 * r['exposed_comm_time_s']:,.1f} ms "
                         f"({r['comm_overhead']:.2%}).", 88, break_on_hyphens=False) + "\n"


BAD_YAML = "cluster: {nodes: 1, gpus_per_node: 0, device: A100-SXM4-80GB, intra_node: nvswitch-a100}\n"


def bad_input() -> str:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "bad.yaml").write_text(BAD_YAML)
        first = run("python -m oresearcher.sim bad.yaml", cwd=Path(tmp), stderr=True, ok=(2,))
    second = run("python -m oresearcher.sim scenarios/8xA100.yaml --set cluster.device=Z80", stderr=True, ok=(2,))
    return fence(f"$ python -m oresearcher.sim bad.yaml\n{first}\n"
                 f"$ python -m oresearcher.sim scenarios/8xA100.yaml --set cluster.device=Z80\n{second}")


def codec_accuracy() -> str:
    out = run("python benchmarks/bench_codecs.py --accuracy-only --seeds 5")
    rows = ["| codec | test accuracy | against none (points) |", "|---|---|---|"]
    for ln in out.splitlines():
        m = re.match(r"\s+(\S+)\s+([\d.]+)%\s+([+-][\d.]+) \+- ([\d.]+) points", ln)
        if m:
            diff = "baseline" if m.group(1) == "none" else f"{m.group(3)} ± {m.group(4)}"
            rows.append(f"| `{m.group(1)}` | {m.group(2)}% | {diff} |")
    if len(rows) < 4:
        raise RuntimeError(f"bench_codecs printed no accuracy rows:\n{out}")
    return "\n".join(rows) + "\n"


DISTILL = ("python -m oresearcher.sim scenarios/8xA100.yaml --set training.steps=200 --set distill.student=gpt-125m "
           "--set distill.steps=100")


def sim_distill() -> str:
    """The shape-mode price of distilling the reference cluster: training, then the student's steps."""
    r = _report(DISTILL)
    trained = max(ms[-1]["time_s"] for ms in r["metrics"].values() if ms)  # the last training step ends
    distill = r["total_time_s"] - trained
    n = r["scenario"]["distill"]["steps"]
    text = ("In shape mode the simulator prices distilling a language-model cluster (the teachers run forward on "
            f"the fly; a token stream cannot be precomputed): `{DISTILL}` predicts {trained:.1f} s of cooperative "
            f"training, then {distill:.1f} s of distillation, {distill / n:.2f} s a step, nearly all of it every "
            "rank running the eight gpt-1.3b teachers forward on its micro batch.")
    return textwrap.fill(text, 88, break_on_hyphens=False) + "\n"


def budget_8xa100() -> str:
    """bench_budget.py's 8xA100 cost table (shape mode: no seeds, no clock)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_budget import configs, cost_row

    steps = 200
    rows = [f"| 8xA100, shape mode, {steps} steps | step time | exposed | waiting | overhead | wire bytes / step |",
            "|---|---|---|---|---|---|"]
    for name, sets in configs(0.083):
        c = cost_row(sets, steps)
        ovh = f"{c['overhead']:.2%}"
        shown = name + (" (the reference)" if name == "share every 1" else "")
        rows.append(f"| {shown} | " + " | ".join(f"{1e3 * c[k]:,.1f} ms" for k in ("step_s", "exposed_s", "wait_s"))
                    + f" | {f'**{ovh}**' if name.startswith('controller') else ovh} | {c['bytes'] / 1e9:.3f} GB |")
    return "\n".join(rows) + "\n"


def budget_quality(task: str) -> str:
    """bench_budget.py's quality table of ``task`` (digits or lm; numeric mode, seeds 0-2),
    SWA and SAM side by side, each row's verdict against "share every 1"."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_budget import readme_block

    return readme_block(task)


def faults_checkpoint() -> str:
    return transcript("python benchmarks/bench_faults.py", columns=88)


def fsdp_published() -> str:
    return transcript("python benchmarks/bench_fsdp_published.py", columns=200)


def sim_finance() -> str:
    """The finance simulation's headline rows, each agent's final accuracy and the deployable model."""
    cmd = "python -m oresearcher.sim scenarios/finance.yaml"
    out = run(cmd, columns=100).splitlines()
    head = [ln for ln in out if ln.lstrip().startswith("finance:")
            or any(ln.startswith(f"│ {k}") for k in ("step time", "compute time", "communication overhead"))]
    start = next(i for i, ln in enumerate(out) if "┃ agent" in ln) - 1
    end = next(i for i, ln in enumerate(out) if ln.startswith("deployable model:"))
    return fence(f"$ {cmd}      (trimmed)\n" + "\n".join(head + out[start:end + 1]))


PRIVACY = ("python -m oresearcher.sim scenarios/digits-4.yaml --set cooperation.privacy.enabled=true "
           "--set cooperation.privacy.target_epsilon=3")
PRIVACY_PY = ("python -c \"import json; r = json.load(open('runs/digits-4/report.json')); "
              "print([(round(r['metrics'][a][-1]['epsilon'], 3), round(r['metrics'][a][-1]['test_accuracy'], 3)) "
              "for a in '0123'])\"")


def sim_privacy() -> str:
    """A private digits-4 simulation: the report's privacy line, then each agent's epsilon and accuracy."""
    spent = [ln for ln in run(PRIVACY, columns=120).splitlines() if ln.startswith("privacy:")]
    per_agent = run(PRIVACY_PY)  # reads the report the run above just wrote
    shown = PRIVACY.replace(" --set cooperation.privacy.target", " \\\n      --set cooperation.privacy.target")
    py = PRIVACY_PY.replace(" print(", " \\\n      print(")
    return fence(f"$ {shown}      (trimmed)\n" + "\n".join(spent) + f"\n$ {py}\n{per_agent}")


def sim_alloc() -> str:
    cmd = "python -m oresearcher.sim scenarios/alloc-8on4.yaml"
    out = run(cmd, columns=100).splitlines()
    at = next(i for i, ln in enumerate(out) if "alloc-8on4:" in ln)
    if out[at + 1].strip() == "steps":  # the title wraps at the table's width
        out[at:at + 2] = [out[at].rstrip() + " steps"]
    keep = [ln for ln in out if "alloc-8on4:" in ln or ln.startswith(("│ step time", "│ compute time",
                                                                      "│ communication time", "│   of which",
                                                                      "│ round_gather"))]
    return fence("\n".join(keep))


FSDP7B = "python -m oresearcher.sim scenarios/8xA100-llama7b-fsdp.yaml"


def fsdp_zero2() -> str:
    """ZeRO-2 beside ZeRO-3 for the llama-7b run: gathers, wire bytes and memory per GPU."""
    z3, z2 = _report(FSDP7B), _report(FSDP7B + " --set fsdp.reshard_after_forward=false")

    def per_rank(r):
        b = {x["name"]: x for x in r["breakdown"]}
        steps, ws = r["steps"], r["world_size"]
        gathers = b["fsdp_all_gather"]["count"] / steps / ws
        wire = sum(x["wire_bytes"] for x in r["breakdown"]) / steps / ws
        return gathers, wire / 1e9, r["memory"]["total"] / 1e9, 1e3 * r["step_time_s"]

    g3, w3, m3, t3 = per_rank(z3)
    g2, w2, m2, t2 = per_rank(z2)
    if f"{t2:,.3f}" == f"{t3:,.3f}":
        time = "the step time is the same: NVSwitch hides the backward gathers under compute"
    else:  # the gathers themselves overlap compute; what ZeRO-2 saves is their copy-outs on the compute stream
        time = (f"the step time is {t2:,.1f} ms against {t3:,.1f} ms here: NVSwitch hides the backward gathers "
                "under compute, and what ZeRO-2 saves is their copy-outs into the unsharded parameters, which run "
                "on the compute stream")
    text = (f"With `--set fsdp.reshard_after_forward=false` (ZeRO-2) the backward gathers go ({g2:.0f} all-gathers "
            f"a step instead of {g3:.0f}, {w2:.1f} GB on the wire per rank instead of {w3:.1f} GB) and the blocks "
            f"stay gathered: {m2:.1f} GB per GPU instead of {m3:.1f} GB; {time}.")
    return textwrap.fill(text, 88, break_on_hyphens=False) + "\n"


HETERO = "python -m oresearcher.sim scenarios/digits-hetero.yaml"


def sim_hetero_phases() -> str:
    """The simulated price of the heterogeneous digits run: training, then distillation."""
    r = _report(HETERO)
    trained = max(e["time_s"] for ms in r["metrics"].values() for e in ms if "phase_distill" not in e)
    text = (f"`{HETERO}` gives the same accuracies (numeric mode) and prices the phases: {trained:.3f} s of "
            f"simulated training, {r['total_time_s'] - trained:.3f} s of distillation.")
    return textwrap.fill(text, 88, break_on_hyphens=False) + "\n"


DIVERGE = "python -m oresearcher.sim cpu-tiny --mode numeric --set training.lr=10 --set workload.optimizer=sgd"


def sim_divergence() -> str:
    """The one line each divergence policy ends a run with (exit 2)."""
    lines = [f"$ {DIVERGE}"]
    for extra, shown in (("", None), (" --set training.on_divergence=skip", "$ ... --set training.on_divergence=skip")):
        if shown:
            lines.append(shown)
        lines += [ln for ln in run(DIVERGE + extra, stderr=True, ok=(2,)).splitlines() if ln.startswith("error:")]
    return fence("\n".join(lines))


ABLATION = ("python benchmarks/bench_ablation.py --summary benchmarks/results/ablation-digits.json "
            "benchmarks/results/ablation-finance.json benchmarks/results/ablation-synthetic-lm.json")


def ablation_summary() -> str:
    """Which mechanisms pay: the summary of the saved 5-seed ablation runs (the runs take
    minutes each; their tables: python benchmarks/bench_ablation.py --table FILE)."""
    return run(ABLATION, columns=200).strip("\n") + "\n"


BLOCKS = [
    Block("sim-8xA100", "python -m oresearcher.sim scenarios/8xA100.yaml", sim_8xa100,
          images={"runs/8xA100/timeline.png": "docs/img/8xA100-timeline.png"}),
    Block("sim-8xA100-text", "python -m oresearcher.sim scenarios/8xA100.yaml (report.json)", sim_8xa100_text),
    Block("sim-8xA100-table", "python -m oresearcher.sim scenarios/8xA100.yaml (its first table)", sim_8xa100_table),
    Block("sim-variants", "python -m oresearcher.sim scenarios/8xA100.yaml --set ... (4 runs)", sim_variants,
          quick=False),
    Block("sim-2x8xA100", "python -m oresearcher.sim scenarios/2x8xA100.yaml", sim_two_nodes, quick=False),
    Block("bad-input", "python -m oresearcher.sim bad.yaml (and an unknown device)", bad_input),
    Block("collective-bench", "python -m oresearcher.sim scenarios/8xA100.yaml --collective-bench all_reduce "
          "--reference ...", collective_bench),
    Block("nic-4-vs-8", "python -m oresearcher.sim scenarios/2x8xA100{,-4nic}.yaml --collective-bench all_reduce",
          nic_4_vs_8),
    Block("collective-errors", "python benchmarks/bench_collectives.py", collective_errors),
    Block("gdr-level", "python -m oresearcher.sim scenarios/2x8xA100-4nic.yaml --collective-bench all_reduce "
          "[--set cluster.gdr_level=LOC]", gdr_level),
    Block("sim-digits-final", "python -m oresearcher.sim scenarios/digits-4.yaml", sim_digits_final, quick=False),
    Block("sim-sweep", "python -m oresearcher.sim scenarios/8xA100.yaml ... --sweep communication.bucket_size_MB=...",
          sim_sweep, quick=False, images={"runs/8xA100/sweep.png": "docs/img/8xA100-bucket-sweep.png"}),
    Block("sim-fsdp", "python -m oresearcher.sim scenarios/8xA100-llama7b-fsdp.yaml (and --set training.strategy=ddp)",
          sim_fsdp, quick=False),
    Block("sim-faults", "python -m oresearcher.sim 8xA100 --set ... faults (a straggler, a slow link, a lost rank)",
          sim_faults, quick=False),
    Block("roofline-h200", "python benchmarks/bench_roofline.py --no-cpu", roofline_h200, quick=False),
    Block("codec-accuracy", "python benchmarks/bench_codecs.py --accuracy-only --seeds 5", codec_accuracy,
          quick=False),
    Block("sim-distill", "python -m oresearcher.sim scenarios/8xA100.yaml ... --set distill.student=gpt-125m",
          sim_distill, quick=False),
    Block("budget-8xA100", "python benchmarks/bench_budget.py (the 8xA100 table)", budget_8xa100, quick=False),
    Block("budget-digits", "python benchmarks/bench_budget.py (the digits-4 tables)", lambda: budget_quality("digits"),
          quick=False),
    Block("budget-lm", "python benchmarks/bench_budget.py (the synthetic-lm tables)", lambda: budget_quality("lm"),
          quick=False),
    Block("faults-checkpoint", "python benchmarks/bench_faults.py", faults_checkpoint, quick=False),
    Block("fsdp-published", "python benchmarks/bench_fsdp_published.py", fsdp_published, quick=False),
    Block("sim-finance", "python -m oresearcher.sim scenarios/finance.yaml", sim_finance, quick=False),
    Block("sim-privacy", "python -m oresearcher.sim scenarios/digits-4.yaml --set cooperation.privacy...",
          sim_privacy, quick=False),
    Block("sim-alloc", "python -m oresearcher.sim scenarios/alloc-8on4.yaml", sim_alloc, quick=False),
    Block("sim-divergence", DIVERGE + " (stop, then skip)", sim_divergence, quick=False),
    Block("fsdp-zero2", FSDP7B + " --set fsdp.reshard_after_forward=false (and without)", fsdp_zero2, quick=False),
    Block("sim-hetero-phases", HETERO, sim_hetero_phases, quick=False),
    Block("ablation-summary", ABLATION, ablation_summary),
]
