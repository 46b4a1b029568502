"""Train (or refresh) the cached Fashion-MNIST models.

    python -m fortis.adapters.torch_models.train_fmnist [--out DIR] [--kind target|surrogate|all]
                                                        [--force]

Without ``--out`` the models go to the default cache (``$FORTIS_CACHE/models``, default
``~/.cache/fortis/models``), where :func:`fmnist.load_fmnist_model` finds them. Prints one
JSON line of metrics per model.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .fmnist import KINDS, default_cache_dir, load_fmnist_model, model_paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fortis.adapters.torch_models.train_fmnist",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None,
                        help=f"cache folder (default {default_cache_dir()})")
    parser.add_argument("--kind", choices=(*KINDS, "all"), default="all")
    parser.add_argument("--force", action="store_true",
                        help="retrain even if a cached model exists")
    args = parser.parse_args(argv)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    kinds = KINDS if args.kind == "all" else (args.kind,)
    for kind in kinds:
        _model, metrics = load_fmnist_model(kind, cache_dir=args.out, log=log, force=args.force)
        weights, _ = model_paths(kind, args.out)
        print(json.dumps({**metrics, "weights": str(weights)}, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
