"""The exported model: safetensors weights plus a small JSON, loaded by one function.

    python -m oresearcher.run --backend=gloo --scenario scenarios/digits-hetero.yaml --export runs/digits-hetero/model
    python -m oresearcher.export runs/digits-hetero/model      # check it and say what it is
    python -m oresearcher.run --backend=gloo --scenario scenarios/finance.yaml --export runs/finance/model
    python -m oresearcher.export runs/finance/model            # one model per architecture: each checked

    from oresearcher.tasks.export import load_model
    model, meta = load_model("runs/digits-hetero/model")       # an nn.Module in eval mode
    probs = model(x).softmax(-1)                               # x preprocessed as meta["preprocessing"] says

The export is the run's deployed model (:mod:`oresearcher.cooperation.deploy`): the
distilled student, else the fused model of the agents' architecture; a heterogeneous run
writes one directory per architecture under DIR. A directory holds ``model.safetensors``
(the model's state dict; safetensors holds only tensors and a JSON header, so loading
runs no code -- nothing is pickled) and ``model.json``:

    {"format": "oresearcher-model/1", "task": "digits", "architecture": "mlp",
     "preprocessing": {...}, "n_classes": 10, "weights_sha256": "...", "metrics": {...}, "scenario": "..."}

:func:`load_model` refuses, with one line naming the file and the problem
(:class:`oresearcher.errors.UserError`), a directory without both files, JSON that does
not parse or lacks a field, an unknown format, task or architecture, weights whose
SHA-256 is not the recorded one (tampering, truncation), tensors that do not match the
architecture's names, shapes and dtypes exactly, and an ``n_classes`` the weights' head
contradicts. Weights reload bit for bit.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ..errors import UserError, short
from ..files import sha256_file

FORMAT = "oresearcher-model/1"
WEIGHTS, META = "model.safetensors", "model.json"
MAX_META_BYTES = 1 << 20
FIELDS = {"format": str, "task": str, "architecture": str, "preprocessing": dict, "n_classes": int,
          "weights_sha256": str}
OPTIONAL = {"metrics": dict, "scenario": str}  # read by python -m oresearcher.export when present


def save_model(directory, module: torch.nn.Module, *, task: str, architecture: str, preprocessing: dict,
               n_classes: int, metrics: dict | None = None, scenario: str = "") -> Path:
    """Write ``module``'s weights and the JSON into ``directory`` (created); returns it.
    Both files through :func:`oresearcher.files.write_atomic`: a link planted at either
    name is replaced, never written through."""
    from safetensors.torch import save

    from ..files import write_atomic, write_text

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in module.state_dict().items()}
    write_atomic(out / WEIGHTS, save(tensors, metadata={"format": FORMAT}))
    meta = {"format": FORMAT, "task": task, "architecture": architecture, "preprocessing": preprocessing,
            "n_classes": int(n_classes), "weights_sha256": sha256_file(out / WEIGHTS),
            "metrics": {k: float(v) for k, v in (metrics or {}).items() if isinstance(v, (int, float))},
            "scenario": scenario}
    write_text(out / META, json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return out


def check_target(directory, replace: bool = False) -> Path:
    """``run --export DIR``, checked before any rank starts: DIR must be a directory that
    can be written (a file in its place: one line, not a failure after training), and
    must not hold an export already unless ``replace`` (``--overwrite``, or ``--resume``
    of the run that wrote it): an export is replaced on purpose, as a run directory is."""
    from ..files import writable_dir

    out = writable_dir(Path(directory), "--export")
    # a link at either name is no export of ours: the write replaces it, never follows it
    held = [p for p in (out / META, out / WEIGHTS) if p.is_file() and not p.is_symlink()] + model_dirs(out)
    if held and not replace:
        raise UserError(f"--export {out} already holds an exported model ({held[0].name}); replace it with "
                        "--overwrite, or export to a new directory")
    return out


def model_dirs(directory) -> list[Path]:
    """The subdirectories of ``directory`` that hold an export: a heterogeneous cooperative
    run exports one model per architecture (oresearcher.cooperation.deploy)."""
    d = Path(directory)
    return sorted(p for p in d.iterdir() if (p / META).is_file()) if d.is_dir() and not d.is_symlink() else []


def read_meta(directory) -> dict:
    """The checked ``model.json`` of ``directory`` (UserError on any problem)."""
    path = Path(directory) / META
    if not path.is_file():
        if parts := model_dirs(directory):
            raise UserError(f"{directory}: one model per architecture ({', '.join(p.name for p in parts)}); "
                            f"load one of them, e.g. {parts[0]}")
        raise UserError(f"{path}: no such file (not an exported model directory)")
    from ..files import Unreadable, read_json

    try:
        meta = read_json(path, max_bytes=MAX_META_BYTES)
    except (Unreadable, OSError) as e:
        raise UserError(f"{path}: not a model description: {short(str(e))}") from None
    if not isinstance(meta, dict):
        raise UserError(f"{path}: expected a JSON object")
    for key, kind in FIELDS.items():
        if not isinstance(meta.get(key), kind) or isinstance(meta.get(key), bool):
            raise UserError(f"{path}: field {key!r} missing or not a {kind.__name__}")
    for key, kind in OPTIONAL.items():
        if key in meta and not isinstance(meta[key], kind):
            raise UserError(f"{path}: field {key!r} is {short(meta[key], 60)}, not a {kind.__name__}")
    bad = [k for k, v in (meta.get("metrics") or {}).items() if isinstance(v, bool) or not isinstance(v, (int, float))]
    if bad:
        raise UserError(f"{path}: metrics[{short(bad[0], 60)}] is not a number")
    if meta["format"] != FORMAT:
        raise UserError(f"{path}: format {short(meta['format'])}, expected {FORMAT}")
    from . import TASKS, model_names

    if meta["task"] not in TASKS:
        raise UserError(f"{path}: unknown task {short(meta['task'])}")
    if meta["architecture"] not in model_names(meta["task"]):
        raise UserError(f"{path}: unknown architecture {short(meta['architecture'])} for task {meta['task']}")
    return meta


def load_model(directory) -> tuple[torch.nn.Module, dict]:
    """(module in eval mode on the CPU, its description) from an exported directory.

    The one documented way to load an export; refuses anything malformed or tampered
    with a :class:`~oresearcher.errors.UserError` of one line.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    meta = read_meta(directory)
    weights = Path(directory) / WEIGHTS
    if not weights.is_file():
        raise UserError(f"{weights}: no such file")
    if sha256_file(weights) != meta["weights_sha256"]:
        raise UserError(f"{weights}: SHA-256 differs from the one in {META} (modified or damaged); refusing it")
    try:
        tensors = load_file(str(weights))
    except (SafetensorError, OSError, ValueError) as e:
        raise UserError(f"{weights}: not a safetensors file ({short(str(e))})") from None
    from . import get_task

    task = get_task(meta["task"])
    if task.build_model is None:
        raise UserError(f"{Path(directory) / META}: task {meta['task']} has no exportable model")
    if task.import_tensors is not None:  # a task that exports another layout (text: Hugging Face GPT-2)
        tensors = task.import_tensors(tensors)
    vocab = meta.get("vocab_size")  # a language model's vocabulary, where it is not the preset's (text)
    ok = isinstance(vocab, int) and not isinstance(vocab, bool) and 0 < vocab <= 1 << 16
    build = {"vocab_size": vocab} if ok else {}
    with torch.random.fork_rng(devices=[]):  # building the module draws init weights, all replaced
        module = task.build_model(meta["architecture"], **build)
    want = module.state_dict()
    if set(tensors) != set(want):
        extra, missing = sorted(set(tensors) - set(want)), sorted(set(want) - set(tensors))
        raise UserError(f"{weights}: tensors do not match {meta['architecture']} "
                        f"(unexpected {short(str(extra[:3]))}, missing {short(str(missing[:3]))})")
    for name, t in tensors.items():
        if t.shape != want[name].shape or t.dtype != want[name].dtype:
            raise UserError(f"{weights}: tensor {name} is {tuple(t.shape)} {t.dtype}, "
                            f"{meta['architecture']} needs {tuple(want[name].shape)} {want[name].dtype}")
    module.load_state_dict(tensors, strict=True)
    classes = classes_of(task, module)
    if classes is not None and meta["n_classes"] != classes:  # the description must say what the weights are
        raise UserError(f"{Path(directory) / META}: n_classes is {meta['n_classes']}, but the weights' "
                        f"{meta['architecture']} head has {classes} outputs")
    return module.eval(), meta


def classes_of(task, module: torch.nn.Module):
    """How many classes the model predicts (outputs, for a regression head): the task's
    declared ``n_classes``, else its last linear layer's outputs."""
    if task.n_classes is not None:
        return task.n_classes
    heads = [m for m in module.modules() if isinstance(m, torch.nn.Linear)]
    return heads[-1].out_features if heads else None
