"""The final task metric of each agent, and of the one model a user would deploy.

A numeric-mode simulation and a real run end with trained agents; the report's
``metrics`` hold every step's values, which nobody reads at a glance. :func:`final_section`
picks, per rank, the last value of the task metric (test accuracy, test episode return,
else a loss) with the rank's role, and names the deployable model:

- after a distillation phase, the distilled student (``student_test_accuracy``);
- for programs whose ranks train one shared model (their declaration's ``shares_model``:
  ddp, fsdp; local_sgd and diloco after their last average), that model: the mean over ranks, which are equal or nearly so;
- for the cooperative program without a student, the fused agents: per architecture, the
  plain mean of its healthy final agents, which is what ``run --export`` writes
  (:mod:`oresearcher.cooperation.deploy`). No run evaluates that model on the test split
  (a finance run's comparison does, per credit dataset), so its value is None;
- hosted agents (``cooperation.allocation.agents_per_device`` > 1) are not fused at the
  end: the agent the validators scored most reliable (``final_reliability``), said as such.

Shape-mode simulations compute no values: no section.
"""
from __future__ import annotations

import math

from rich.table import Table

# task metric keys, best first; (key, label, higher is better)
TASK_METRICS = (("test_accuracy", "test accuracy", True), ("test_return", "test return", True),
                ("test_loss", "test loss", False), ("val_loss", "validation loss", False),
                ("task_loss", "training loss (task)", False), ("loss", "training loss", False))
ROLES = ("explorer", "optimizer", "validator")  # the codes of oresearcher.cooperation.roles.ROLE_CODES
FUSED = "the fused agents (per architecture, healthy ones averaged)"  # oresearcher.cooperation.deploy


def _last(history: list[dict], key: str):
    for m in reversed(history):
        v = m.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            return float(v)
    return None


def _role(history: list[dict]) -> str:
    """The rank's last role: a code (what programs report) or a name; "-" without roles."""
    for m in reversed(history):
        v = m.get("role")
        if isinstance(v, str) and v:
            return v
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            return ROLES[int(v)] if 0 <= int(v) < len(ROLES) else str(int(v))
    return "-"


def final_section(metrics: dict, strategy: str | None, shard_group: int | None = None,
                  hosted: bool = False, student: bool = False) -> dict | None:
    """``{"metric", "label", "agents": [{rank, role, value}], "deployable": {what, value}}``
    from a report's ``metrics`` (rank -> list of step dicts); None without a task metric.
    ``shard_group``: fsdp's sharded agents (``fsdp.replicas: fusion``), each that many
    consecutive ranks; they are separate models, so the deployable one is an agent.
    ``hosted``: cooperative agents share devices and are not fused at the end; ``student``:
    the scenario distils one (``distill.student``), deployed whether or not it was scored.
    ``strategy``: the report's training.strategy; what it deploys is what its declaration
    says (oresearcher.strategies: shares_model, cooperative, shards); a name nobody declares
    deploys its best agent."""
    from ..strategies import find_strategy

    s = find_strategy(strategy)
    shared, coop = s is not None and s.shares_model, s is not None and s.cooperative
    sharded = s is not None and s.shards and bool(shard_group)
    hist = {int(r): m for r, m in (metrics or {}).items() if m}
    for key, label, higher in TASK_METRICS:
        values = {r: _last(h, key) for r, h in sorted(hist.items())}
        if any(v is not None for v in values.values()):
            break
    else:
        return None
    agents = [{"rank": r, "role": _role(hist[r]), "value": v} for r, v in values.items()]
    got = [a for a in agents if a["value"] is not None]
    scored = [v for v in (_last(h, f"student_{key}") for h in hist.values()) if v is not None]
    if scored and key in ("test_accuracy", "val_loss"):  # the student scored as the agents are
        deploy = {"what": "distilled student", "value": scored[0]}
    elif sharded:
        deploy = _sharded_agent(hist, got, shard_group, label)
    elif shared:
        deploy = {"what": f"the shared model ({strategy}; mean over ranks)",
                  "value": sum(a["value"] for a in got) / len(got)}
    elif coop and student:
        deploy = {"what": "distilled student", "value": None}
    elif coop and not hosted:
        deploy = {"what": FUSED, "value": None}
    elif coop and any(_last(hist[a["rank"]], "final_reliability") is not None for a in got):
        best = max(got, key=lambda a: _last(hist[a["rank"]], "final_reliability") or -1.0)
        deploy = {"what": f"agent {best['rank']}, the validators' pick", "value": best["value"], "rank": best["rank"]}
    else:
        pick = (max if higher else min)(got, key=lambda a: a["value"])
        deploy = {"what": f"agent {pick['rank']}, the best by {label}", "value": pick["value"], "rank": pick["rank"]}
    out = {"metric": key, "label": label, "agents": agents, "deployable": deploy}
    if sharded:
        out["shard_group"] = shard_group  # rows are ranks, not agents
    return out


def _sharded_agent(hist: dict, got: list, size: int, label: str) -> dict:
    """The sharded agent with the lowest held-out loss (its ranks' mean; each rank scores
    its own held-out batch), else the best mean of ``label``; its value: its ranks' mean."""
    members: dict[int, list] = {}
    for a in got:
        members.setdefault(a["rank"] // size, []).append(a)
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    held = {k: [_last(hist[a["rank"]], "heldout_loss") for a in m] for k, m in members.items()}
    held = {k: mean(v) for k, v in held.items() if v and None not in v}
    value = {k: mean([a["value"] for a in m]) for k, m in members.items()}
    if held:
        best = min(held, key=held.get)
        why = f"the lowest held-out loss ({held[best]:.4f})"
    else:
        higher = next(h for _, lab, h in TASK_METRICS if lab == label)
        best = (max if higher else min)(value, key=value.get)
        why = f"the best by {label}"
    ranks = f"ranks {best * size}-{best * size + size - 1}"
    return {"what": f"sharded agent {best} ({ranks}), {why}", "value": value[best], "agent": best}


def fmt_value(key: str, v) -> str:
    if v is None:
        return "-"
    return f"{v:.4f}" if key in ("test_accuracy",) or "loss" in key else f"{v:,.1f}"


def final_table(section: dict, max_rows: int = 16) -> Table:
    """One row per agent (the first ``max_rows``)."""
    t = Table(header_style="bold")
    agents = section["agents"]
    roles = any(a["role"] != "-" for a in agents)  # programs without roles: no column of dashes
    t.add_column("rank" if section.get("shard_group") else "agent", justify="right")
    if roles:
        t.add_column("role")
    t.add_column(f"final {section['label']}", justify="right")
    for a in agents[:max_rows]:
        t.add_row(str(a["rank"]), *([a["role"]] if roles else []), fmt_value(section["metric"], a["value"]))
    if len(agents) > max_rows:
        t.add_row("...", *([""] if roles else []), f"{len(agents) - max_rows} more in report.json")
    return t


def language_line(metrics: dict) -> str | None:
    """A language model's scores (the text task), or None: the deployed student's
    (``student_*``) when it was distilled, else the mean over the agents' final evaluations:
    validation loss in nats/token and bits/byte, multiple-choice accuracy with its 95% CI."""
    hist = [m for m in (metrics or {}).values() if m]
    for prefix, what in (("student_", "deployed student"), ("", "agents (mean)")):
        vals = {k: [v for v in (_last(h, prefix + k) for h in hist) if v is not None]
                for k in ("val_loss", "val_bits_per_byte", "mc_accuracy", "mc_ci_low", "mc_ci_high", "mc_chance")}
        if vals["val_bits_per_byte"]:
            m = {k: sum(v) / len(v) for k, v in vals.items() if v}
            line = (f"{what}: validation loss {m['val_loss']:.4f} nats/token, {m['val_bits_per_byte']:.4f} "
                    f"bits/byte")
            if "mc_accuracy" in m:
                ci = (f" [95% CI {m['mc_ci_low']:.3f}-{m['mc_ci_high']:.3f}]" if prefix and "mc_ci_low" in m else "")
                line += f"; multiple-choice accuracy {m['mc_accuracy']:.3f}{ci}, chance {m.get('mc_chance', 0):.3f}"
            return line
    return None


def deployable_line(section: dict) -> str:
    d = section["deployable"]
    if d["value"] is None:
        return f"deployable model: {d['what']}, not scored"
    return f"deployable model: {d['what']}: {section['label']} {fmt_value(section['metric'], d['value'])}"
