"""The report's ``convergence`` section: predicted loss against simulated time and tokens.

The base run follows the scenario's scaling law (:mod:`oresearcher.models.convergence`; N the
model preset's parameters, D = global batch x sequence length x steps). The strategy's
effective-token multiplier is measured: the scenario's own program (same agents and
roles, interval, codec, optimizer and learning rate, local steps) runs in numeric mode
on a small proxy (``convergence.proxy_model`` on the synthetic-lm stream, one short
sequence per agent per step) beside synchronous data parallel without a codec, seed by
seed; the median over seeds is the multiplier and the seeds' range its band.

Proxy curves are cached on disk under ``convergence.cache_dir``, one JSON file per run
named by the hash of everything that decides its values (the proxy scenario, this
module's method version, the torch version, torch's thread count), so a sweep over
strategies runs the shared data-parallel baseline once and a rerun runs nothing. An entry
is checked against its key, its scenario, its schema and its curve's checksum before it
is used, and rerun and replaced otherwise (:mod:`oresearcher.sim.proxy_cache`).

Before any proxy trains, the work it will do on this CPU is estimated as numeric mode's
is (:mod:`oresearcher.sim.numeric_cost`): past a minute a note says so, past an hour the
simulation is refused in one line. A proxy that diverges is no prediction, said in the
section, not a failed simulation.
"""
from __future__ import annotations

import functools
import itertools
import math
from pathlib import Path

import torch

from oresearcher.models import convergence as cv
from oresearcher.models import n_non_embedding, n_params
from oresearcher.errors import UserError
from oresearcher.scenario import Scenario, validate

METHOD = "proxy-v2"  # bump when what a cached curve means changes


def proxy_data(scenario: Scenario, seed: int, strategy: str | None = None, codec: str | None = None) -> dict:
    """The raw scenario of one proxy run (validated by :func:`proxy_scenario`)."""
    spec = scenario.convergence
    data = scenario.resolved()
    for key in ("convergence", "faults", "distill"):
        data.pop(key, None)
    data["seed"] = seed
    data["workload"].update(model=spec.proxy_model, seq_len=spec.proxy_seq_len, dtype="fp32",
                            global_batch=scenario.agents.count * spec.proxy_batch, activation_checkpointing=False)
    data["training"].update(steps=spec.proxy_steps, eval_every=0, checkpoint_every=0)
    data["simulation"] = {"mode": "numeric"}
    if strategy is not None:
        data["training"]["strategy"] = strategy
    if codec is not None:
        data["communication"]["codec"] = codec
    return data


def proxy_scenario(data: dict, parent: Scenario) -> Scenario:
    sc = validate(data, f"{getattr(parent, '_source', parent.name)} (convergence proxy)")
    sc._source = getattr(parent, "_source", None)
    return sc


def cache_key(data: dict) -> str:
    """The cache key of one proxy run (:mod:`oresearcher.sim.proxy_cache`)."""
    from . import proxy_cache

    return proxy_cache.key(data, METHOD)


def cache_root(scenario: Scenario) -> Path:
    root = Path(scenario.convergence.cache_dir)
    return root if root.is_absolute() else Path.cwd() / root


def run_proxy(scenario: Scenario, data: dict, log=None) -> list[float]:
    """The proxy's mean loss per step, the first ``training.steps`` of them: from the cache
    (:mod:`oresearcher.sim.proxy_cache`: an entry that fails a check is run again and
    replaced), or run in numeric mode and cached. (The cooperative program's allocation
    can hand an agent more steps than the nominal in a round and another fewer; past the
    nominal count the mean would be over the few agents that ran on.)"""
    from . import proxy_cache

    root, full_key = cache_root(scenario), cache_key(data)
    steps = data["training"]["steps"]
    curve = proxy_cache.read(root, full_key, data, steps, log)
    if curve is not None:
        return curve
    proxy = proxy_scenario(data, scenario)
    try:  # before the run, not after it: an unwritable cache fails in a second, not a run later
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"convergence.cache_dir {root}: cannot create it ({e.strerror})") from None
    if is_baseline(proxy) and proxy.strategy.closed_form_curve:
        curve = data_parallel_curve(proxy)
    else:
        from .simulate import simulate

        report, _ = simulate(proxy, mode="numeric")
        curve = cv.mean_curve(report["metrics"])  # steps with no finite loss are left out of it
        bad = [row["step"] for rows in report["metrics"].values() for row in rows
               if row.get("loss") is not None and not math.isfinite(row["loss"])]
        if bad:
            raise ProxyFailed(f"its loss is not finite from step {min(bad)} (training.lr={proxy.training.lr:g})")
    if not curve or not all(math.isfinite(v) for v in curve):  # data parallel's own curve keeps every step
        bad = next((i for i, v in enumerate(curve) if not math.isfinite(v)), 0)
        raise ProxyFailed(f"its loss is not finite from step {bad} (training.lr={proxy.training.lr:g})")
    if log:
        log(f"convergence proxy: {data['training']['strategy']} seed {data['seed']}, {len(curve)} steps of "
            f"{data['workload']['model']} (cached in {root})")
    try:
        proxy_cache.write(root, full_key, data, curve, METHOD)
    except OSError as e:
        raise UserError(f"convergence.cache_dir {root}: cannot write the proxy's result ({e.strerror})") from None
    return curve[:steps]


class ProxyFailed(Exception):
    """A proxy run that gave no usable curve (it diverged): no prediction, not an error."""


def data_parallel_curve(proxy: Scenario) -> list[float]:
    """The mean loss per step of synchronous data parallel without a codec, computed as
    what it is: one model (every agent's clone) stepping on the gradient of the mean loss
    over all agents' batches, each agent's batch from its own stream. Averaging the
    agents' gradients of their own mean losses gives the same gradient up to float
    rounding (equal batches), in one forward and backward a step instead of one per
    agent; tests/sim/test_convergence.py holds it to the simulated program's curve."""
    from oresearcher.tasks import make_learner

    learners = [make_learner(proxy, r, mode="numeric") for r in range(proxy.agents.count)]
    one, streams = learners[0], [l.batches for l in learners]
    one.batches = (torch.cat([next(s) for s in streams]) for _ in itertools.count())  # every agent's batch
    curve = []
    for _ in range(proxy.training.steps):
        curve.append(one.forward_backward()["loss"])
        one.optimizer_step()
    return curve


def no_prediction(scenario: Scenario) -> str | None:
    """One line saying why the model cannot predict this scenario, or None."""
    if not scenario.task.convergence_proxy:
        from oresearcher.tasks import TASKS, get_task

        covered = ", ".join(n for n in TASKS if get_task(n).convergence_proxy)
        return (f"no prediction: no proxy for task {scenario.workload.task} (the convergence model covers "
                f"{covered} language models)")
    if scenario.agents.architectures:
        return "no prediction: no proxy for agents of different architectures"
    return scenario.strategy.no_prediction(scenario)


def is_baseline(scenario: Scenario) -> bool:
    """Synchronous data parallel on exact gradients: the law's own regime, multiplier 1.
    FSDP replicas that all-reduce compute the same update, sharded (torch FSDP2)."""
    return scenario.strategy.exact_baseline(scenario)  # ddp without a codec; fsdp's allreduce replicas


def efficiency(scenario: Scenario, log=None) -> cv.Efficiency | str:
    """The strategy's multiplier with its seed band, or one line saying why there is none."""
    why = no_prediction(scenario)
    if why:
        return why
    if is_baseline(scenario):
        return cv.Efficiency.of([1.0])
    if uses_ladder(scenario):
        return ladder_efficiency(scenario)[0]
    from oresearcher.programs.divergence import AllExcluded, Diverged

    spec, per_seed = scenario.convergence, []
    window = max(5, spec.proxy_steps // 30)
    proxy_note(scenario)  # refuses an hour of proxy training (the CLI printed the note before the simulation)
    for base_data, mine_data in _proxy_runs(scenario):
        try:
            base = run_proxy(scenario, base_data, log)
            mine = run_proxy(scenario, mine_data, log)
        except (ProxyFailed, Diverged, AllExcluded) as e:  # the proxy's failure, not the simulation's
            what = str(e).split("; ")[0]
            return f"no prediction: the convergence proxy (seed {mine_data['seed']}) failed: {what}"
        m = cv.multiplier(cv.smooth(base, window), cv.smooth(mine, window))
        if m is not None:
            per_seed.append(m)
    if not per_seed:
        return "no prediction: the proxy's curves share no loss level with data parallel's"
    return cv.Efficiency.of(per_seed)


def ladder_file(scenario: Scenario) -> Path | None:
    """The fits file ``convergence.ladder`` names: the shipped one, a path (relative to the
    working directory), or None for 'none'."""
    from oresearcher.models.ladder_law import SHIPPED

    name = scenario.convergence.ladder
    return None if name == "none" else SHIPPED if name == "shipped" else Path(name)


@functools.lru_cache(maxsize=8)
def _read(path: Path) -> dict:
    from oresearcher.files import Unreadable, read_json

    try:
        return read_json(path)
    except (OSError, Unreadable, ValueError) as e:
        raise UserError(f"convergence.ladder {path}: cannot read it ({getattr(e, 'strerror', None) or e})") from None


def read_ladder(scenario: Scenario) -> dict:
    return _read(ladder_file(scenario))


def uses_ladder(scenario: Scenario) -> bool:
    """Whether the multiplier comes from a ladder: a named file always (a missing row is no
    prediction); the shipped one where it measured the strategy's settings."""
    if ladder_file(scenario) is None:
        return False
    return scenario.convergence.ladder != "shipped" or _ladder_row(scenario)[1] is not None


def _ladder_row(scenario: Scenario):
    """(row name or None, its Trend or None) for the scenario's strategy and settings."""
    from oresearcher.models import ladder_law as LL

    t, codec = scenario.training, scenario.communication.codec
    kind = "none" if codec.is_none else codec.dense.name if codec.sparse is None and not codec.feedback else "other"
    row = LL.row_for(t.strategy, kind, t.local_steps)
    return row, (LL.trends(read_ladder(scenario)).get(row) if row else None)


def ladder_efficiency(scenario: Scenario) -> tuple[cv.Efficiency | str, dict]:
    """The strategy's multiplier from the ladder's trend at the scenario's N, with the
    trend's 95% prediction interval as the band (:mod:`oresearcher.models.ladder_law`), and
    what the section says about it; or one line saying why there is none."""
    from oresearcher.models import ladder_law as LL

    fits, t = read_ladder(scenario), scenario.training
    row, trend = _ladder_row(scenario)
    if trend is None:
        return (f"no prediction: the ladder ({scenario.convergence.ladder}) has no row with 3 or more sizes for "
                f"{t.strategy} (rows: {', '.join(LL.trends(fits)) or 'none'})"), {}
    n = n_non_embedding(scenario.workload.model)  # the ladder's N (its sizes are non-embedding)
    m, low, high = trend.predict(n)
    chin = fits.get("chinchilla_ddp") or {}
    made = fits.get("made_by") or [{}]
    commits = list(dict.fromkeys(m["commit"][:7] for m in made if m.get("commit")))  # every invocation's, in order
    info = {"file": scenario.convergence.ladder, "made_by": {"command": made[0].get("command"), "host": made[0].get("host"),
                                                              "commit": ", ".join(commits) or None},
            "row": row, "sizes": trend.n, "largest_n": trend.largest,
            "distance": n / trend.largest, "slope": trend.b,
            "rule": "95% prediction interval of ln m on ln N (Student's t, n - 2 dof)",
            "published": LL.direction_line(row, trend.b),
            "ddp_exponents": {k: chin["coef"][k] for k in ("alpha", "beta")} if chin else None}
    return cv.Efficiency(m, low, high, ()), info


def _proxy_runs(scenario: Scenario) -> list[tuple[dict, dict]]:
    """(data parallel's, the strategy's) proxy scenario per seed."""
    return [(proxy_data(scenario, scenario.seed + k, strategy="ddp", codec="none"), proxy_data(scenario, scenario.seed + k))
            for k in range(scenario.convergence.proxy_seeds)]


def proxy_note(scenario: Scenario) -> str | None:
    """None when the scenario's proxy runs not yet cached are quick on this CPU (or there
    are none); a line with the estimate past a minute; UserError past an hour
    (:mod:`oresearcher.sim.numeric_cost`). The proxy trains one model per agent of the
    scenario, so a 1,024-agent cluster trains 1,024 proxies a step."""
    from oresearcher.reporting.progress import fmt_duration

    from . import proxy_cache
    from .numeric_cost import REFUSE_S, host_rate, numeric_flops

    if scenario.convergence is None or no_prediction(scenario) or is_baseline(scenario):
        return None
    if uses_ladder(scenario):  # the ladder's laws, read from its file: nothing trains
        return None
    root = cache_root(scenario)
    runs = [d for pair in _proxy_runs(scenario) for d in pair]
    todo = [d for d in runs if proxy_cache.read(root, cache_key(d), d, d["training"]["steps"]) is None]
    if not todo:
        return None
    flops = sum(numeric_flops(proxy_scenario(d, scenario)) or 0.0 for d in todo)
    seconds = flops / host_rate("fp32")
    if seconds <= 60.0:
        return None
    spec = scenario.convergence
    what = (f"the convergence proxy trains {len(todo)} runs of {scenario.agents.count:,} {spec.proxy_model} agents x "
            f"{spec.proxy_steps} steps on this CPU: {flops:.2g} FLOPs, about {fmt_duration(seconds)}")
    if seconds > REFUSE_S:
        raise UserError(f"{what}; lower convergence.proxy_steps or convergence.proxy_seeds, or predict a "
                        "smaller agents.count (the multiplier is measured with the scenario's own agents)")
    return f"note: {what}"


def _steps(law, n, target, m, tokens_per_step) -> int | None:
    d = cv.tokens_to_loss(law, n, target, m)
    return None if math.isinf(d) else math.ceil(d / tokens_per_step)


def attach(scenario: Scenario, report: dict, log=None) -> dict:
    """``report`` (of ``scenario``, from :func:`oresearcher.sim.simulate.simulate`) with the
    predicted loss at scale as its last section, when the scenario asks for one;
    ``log(line)`` hears about each proxy run trained."""
    if scenario.convergence is not None:
        report["convergence"] = section(scenario, report["step_time_s"], log=log)
    return report


def section(scenario: Scenario, step_time_s: float, log=None) -> dict:
    """The report's ``convergence`` section (JSON-ready)."""
    spec, w = scenario.convergence, scenario.workload
    law = spec.law.law()
    out = {"law": spec.law.model_dump(mode="json"), "target_loss": spec.target_loss,
           "budget_steps": scenario.training.steps, "step_time_s": step_time_s}
    eff = efficiency(scenario, log)
    if isinstance(eff, str):
        out["unavailable"] = eff
        return out
    n, tps = n_params(w.model), w.global_batch * w.seq_len
    out.update(n_params=n, tokens_per_step=tps, floor_loss=cv.floor(law, n), efficiency={
        "multiplier": eff.multiplier, "low": eff.low, "high": eff.high, "per_seed": list(eff.per_seed),
        "measured": not is_baseline(scenario), **_source(scenario)})
    budget = scenario.training.steps * tps
    out["final"] = {"tokens": budget, "time_s": scenario.training.steps * step_time_s,
                    **_band(lambda m: cv.loss(law, n, budget, m), eff)}
    horizon = scenario.training.steps
    if spec.target_loss is not None:
        steps = {k: _steps(law, n, spec.target_loss, m, tps) for k, m in
                 (("steps", eff.multiplier), ("steps_low", eff.high), ("steps_high", eff.low))}
        out["to_target"] = {**steps, **{k.replace("steps", "time_s"): None if v is None else v * step_time_s
                                        for k, v in steps.items()}}
        if steps["steps"] is None:
            out["to_target"]["why"] = (f"never reached: {spec.target_loss:g} is at or below the model's floor "
                                       f"{cv.floor(law, n):.3f} (E + A / N^alpha)"
                                       if spec.target_loss <= cv.floor(law, n) else
                                       f"never reached: it needs more than 1e300 tokens at law.beta="
                                       f"{spec.law.beta:g}")
        else:
            horizon = max(horizon, math.ceil(1.25 * (steps["steps_high"] or steps["steps"])))
    out["curve"] = [{"step": s, "tokens": s * tps, "time_s": s * step_time_s,
                     **_band(lambda m: cv.loss(law, n, s * tps, m), eff)} for s in _grid(horizon)]
    return out


def _source(scenario: Scenario) -> dict:
    """Where the multiplier comes from: the proxy's settings, or the ladder's row."""
    spec = scenario.convergence
    if uses_ladder(scenario) and not is_baseline(scenario):
        return {"ladder": ladder_efficiency(scenario)[1]}
    return {"proxy": {"model": spec.proxy_model, "n_params": n_params(spec.proxy_model), "steps": spec.proxy_steps,
                      "seeds": spec.proxy_seeds, "seq_len": spec.proxy_seq_len}}


def _band(f, eff: cv.Efficiency) -> dict:
    """The prediction at the multiplier and at its band's ends (more efficient: lower loss)."""
    return {"loss": f(eff.multiplier), "loss_low": f(eff.high), "loss_high": f(eff.low)}


def _grid(horizon: int, points: int = 60) -> list[int]:
    """Steps 1 .. horizon, evenly spaced in log (the curve's shape is a power law)."""
    out = sorted({max(1, round(horizon ** (i / (points - 1)))) for i in range(points)})
    return out if out[-1] == horizon else out + [horizon]
