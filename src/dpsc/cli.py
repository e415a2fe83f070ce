"""Command line: ``dpsc fit [INPUT.h5ad] --epsilon 8 [--output OUT.h5ad]``."""

from __future__ import annotations

import argparse
import sys
import textwrap
import time
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING

from . import __version__

if TYPE_CHECKING:
    import anndata as ad

#: Exit code for input the user can fix (bad file, bad option, budget exceeded).
BAD_INPUT = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dpsc", description="Differentially private single-cell analysis.")
    parser.add_argument("--version", action="version", version=f"dpsc {__version__}")
    parser.add_argument("--debug", action="store_true", help="Show the full traceback of an error.")
    sub = parser.add_subparsers(dest="command", required=True)
    fit = sub.add_parser("fit", help="Cluster and embed cells with DP-DCAN.")
    fit.add_argument("input", nargs="?", help="Counts as .h5ad (default: the embedded PBMC 4k data set).")
    fit.add_argument("--epsilon", type=float, default=8.0, help="Privacy budget ε (default 8).")
    fit.add_argument("--non-private", action="store_true", help="Train without DP (ignores --epsilon).")
    fit.add_argument(
        "--delta", type=float, default=None, help="δ (default 1e-5, or 1/(10 n) above 10^4 cells; < 1/n)."
    )
    fit.add_argument(
        "--n-clusters",
        type=int,
        default=None,
        help="Number of clusters (default 8; never estimated from the data).",
    )
    fit.add_argument(
        "--scope",
        choices=["encoder", "full"],
        default="encoder",
        help="DP on the encoder (DP-DCAN) or on everything (DPE-DCAN).",
    )
    fit.add_argument("--layer", default=None, help="Layer holding the raw counts (default: X).")
    fit.add_argument(
        "--filter-genes",
        action="store_true",
        help="Drop genes with no count in any cell first (reads the cells: not covered by ε).",
    )
    fit.add_argument(
        "--likelihood",
        choices=["zinb", "gaussian"],
        default="zinb",
        help="zinb for raw counts (default), gaussian for log-normalised data.",
    )
    fit.add_argument(
        "--max-epochs", type=int, default=None, help="Total epochs of both stages (default 50 + 40)."
    )
    fit.add_argument("--accountant", choices=["rdp", "prv"], default="rdp")
    fit.add_argument(
        "--optimizer",
        choices=["sgd", "adam", "dpsignsgd", "dpsignadam"],
        default="sgd",
        help="Update rule of the private parameters (default sgd).",
    )
    fit.add_argument(
        "--seed", type=int, default=0, help="Seed of initialisation and masks (not of the noise)."
    )
    fit.add_argument(
        "--noise-seed",
        type=int,
        default=None,
        help="Make the DP noise repeatable (tests only: no guarantee against whoever knows it).",
    )
    fit.add_argument(
        "--label-key",
        default=None,
        help="obs column with known labels, for ARI/NMI (default: cell_type or label if present).",
    )
    fit.add_argument("--output", "-o", default=None, help="Write the annotated AnnData here (.h5ad).")
    fit.add_argument(
        "--export", default=None, help="Directory to write the shareable encoder + centroids to."
    )
    fit.add_argument("--no-progress", action="store_true", help="Hide the progress bar.")
    return parser


def _drop_empty_genes(adata: ad.AnnData, layer: str | None) -> ad.AnnData:
    """``--filter-genes``: keep the genes with a count in some cell, and say what that choice covers."""
    import numpy as np

    from ._validation import get_matrix

    kept = np.asarray(abs(get_matrix(adata, layer)).sum(axis=0)).ravel() > 0
    print(
        f"--filter-genes: dropped {int((~kept).sum())} gene(s) with no count in any cell; which genes "
        "are dropped depends on the cells, so this choice is not covered by the ε."
    )
    return adata[:, kept].copy()


def _label_key(adata: ad.AnnData, requested: str | None) -> str | None:
    if requested is not None:
        if requested not in adata.obs:
            raise ValueError(f"--label-key {requested!r} is not a column of obs ({list(adata.obs.columns)}).")
        return requested
    return next((k for k in ("cell_type", "label") if k in adata.obs), None)


def _fit(args: argparse.Namespace) -> int:
    import anndata as ad
    import numpy as np
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

    from . import datasets, tl
    from .tl._fit import empty_clusters_message

    if args.input is None:
        adata = datasets.pbmc4k()
        source = "embedded PBMC 4k (4271 cells × 2000 genes)"
    else:
        adata = _read(ad, args.input)
        source = args.input
    key = _label_key(adata, args.label_key)  # checked before any work
    if args.filter_genes:
        adata = _drop_empty_genes(adata, args.layer)
    epsilon = None if args.non_private else args.epsilon
    delta = "auto" if args.delta is None else args.delta
    print(f"dpsc fit: {source}; epsilon={epsilon}, delta={delta}, scope={args.scope}", flush=True)
    start = time.perf_counter()
    with warnings.catch_warnings():  # the empty-cluster note is printed below, once
        warnings.filterwarnings("ignore", message=r"\d+ of the \d+ clusters hold cells")
        model = tl.fit(
            adata,
            epsilon=epsilon,
            delta=args.delta,
            n_clusters=args.n_clusters,
            scope=args.scope,
            layer=args.layer,
            likelihood=args.likelihood,
            max_epochs=args.max_epochs,
            accountant=args.accountant,
            optimizer=args.optimizer,
            random_state=args.seed,
            noise_seed=args.noise_seed,
            progress_bar=not args.no_progress,
            return_model=True,
        )
    wall = time.perf_counter() - start
    from .privacy import get_record

    record = get_record(adata, "X_dpdcan")
    print()
    if epsilon is not None:
        print(
            f"Privacy spent: epsilon = {record['epsilon']:.3f} (target {record['target_epsilon']:g}), "
            f"delta = {record['delta']:g}, sigma = {record['noise_multiplier']:.3f}, "
            f"q = {record['sample_rate']:.4f}, steps = {record['steps']}, C = {record['max_grad_norm']:g}, "
            f"accountant = {record['accountant']}, guarantee = {record['guarantee']}"
        )
    print("What this covers:")
    print(textwrap.fill(record["statement"], width=96, initial_indent="  ", subsequent_indent="  "))
    print(f"Wall time: {wall:.1f} s")
    counts = adata.obs["dp_cluster"].value_counts()
    asked = model.n_clusters
    print(f"Clusters: {len(counts)} of {asked} used ({', '.join(f'{k}: {v}' for k, v in counts.items())})")
    if len(counts) < asked:
        print(
            textwrap.fill(
                empty_clusters_message(len(counts), asked, epsilon),
                width=96,
                initial_indent="  ",
                subsequent_indent="  ",
            )
        )
    if key is None:
        print("No known labels (obs 'cell_type' or 'label'), so no ARI/NMI; pass --label-key to score.")
    else:
        truth = np.asarray(adata.obs[key].astype(str))
        pred = np.asarray(adata.obs["dp_cluster"].astype(str))
        print(
            f"Against obs[{key!r}] (evaluation only, not used in training): "
            f"ARI = {adjusted_rand_score(truth, pred):.3f}, "
            f"NMI = {normalized_mutual_info_score(truth, pred):.3f}"
        )
    if args.output:
        adata.write_h5ad(args.output)
        print(f"Wrote {args.output}")
    if args.export:
        path = model.export_shared(args.export, overwrite=True)
        print(f"Shareable encoder + centroids (no decoder) written to {path}")
    return 0


def _read(ad, path: str):
    """Read an .h5ad file, with an error that names the problem instead of h5py's traceback."""
    from pathlib import Path

    if not Path(path).is_file():
        raise FileNotFoundError(f"No such file: {path}. Pass the path to an .h5ad file.")
    try:
        return ad.read_h5ad(path)
    except OSError as err:
        raise ValueError(f"{path} is not a readable .h5ad file ({err}).") from None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dpsc`` command: exit 0 on success, 2 on input the user can fix."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "fit":
            return _fit(args)
    except (ValueError, FileNotFoundError, KeyError, TypeError) as err:
        if args.debug:
            raise
        message = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
        print(textwrap.fill(f"dpsc: error: {message}", width=96), file=sys.stderr)
        print("(run with --debug for the full traceback)", file=sys.stderr)
        return BAD_INPUT
    return BAD_INPUT  # pragma: no cover - argparse rejects other commands


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
