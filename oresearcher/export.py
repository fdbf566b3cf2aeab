"""``python -m oresearcher.export DIR``: load a model exported by ``python -m oresearcher.run
... --export DIR``, verify its weights and say what it is. The format, saving and loading
are :mod:`oresearcher.tasks.export`."""
from __future__ import annotations

import sys
from pathlib import Path

from .errors import UserError, cli_main
from .tasks.export import META, load_model, model_dirs


def main(argv=None) -> int:
    """``python -m oresearcher.export DIR``: load the export and describe it."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args in (["-h"], ["--help"]):
        print("usage: python -m oresearcher.export DIR\n\nLoad the model exported to DIR by "
              "`python -m oresearcher.run ... --export DIR` (each model, where DIR holds one per architecture; "
              "DIR/model.json names the same model), "
              "verify its weights and describe it.")
        return 0
    if len(args) != 1 or args[0].startswith("-"):
        raise UserError("usage: python -m oresearcher.export DIR (a directory written by run --export)")
    given = Path(args[0])
    if given.name == META and given.is_file():  # the description named instead of its directory
        given = given.parent
    parts = [] if (given / META).is_file() else model_dirs(given)
    for where in parts or [given]:
        module, meta = load_model(where)
        n = sum(p.numel() for p in module.parameters())
        m = meta.get("metrics", {})
        acc = m.get("student_test_accuracy", m.get("test_accuracy"))
        print(f"{where}: {meta['architecture']} for {meta['task']}, {n:,} parameters, weights verified"
              + (f", test accuracy {acc:.4f}" if isinstance(acc, float) else ""))
    return 0


if __name__ == "__main__":
    sys.exit(cli_main(main))
