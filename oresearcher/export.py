"""``python -m oresearcher.export DIR``: load a model exported by ``python -m oresearcher.run
... --export DIR``, verify its weights and say what it is. The format, saving and loading
are :mod:`oresearcher.tasks.export`."""
from __future__ import annotations

import sys

from .errors import UserError, cli_main
from .tasks.export import load_model


def main(argv=None) -> int:
    """``python -m oresearcher.export DIR``: load the export and describe it."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args in (["-h"], ["--help"]):
        print("usage: python -m oresearcher.export DIR\n\nLoad the model exported to DIR by "
              "`python -m oresearcher.run ... --export DIR`, verify its weights and describe it.")
        return 0
    if len(args) != 1 or args[0].startswith("-"):
        raise UserError("usage: python -m oresearcher.export DIR (a directory written by run --export)")
    module, meta = load_model(args[0])
    n = sum(p.numel() for p in module.parameters())
    acc = meta.get("metrics", {}).get("student_test_accuracy")
    print(f"{args[0]}: {meta['architecture']} for {meta['task']}, {n:,} parameters, weights verified"
          + (f", test accuracy {acc:.4f}" if isinstance(acc, float) else ""))
    return 0


if __name__ == "__main__":
    sys.exit(cli_main(main))
