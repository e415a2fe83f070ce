"""Command line: ``dpsc fit [INPUT.h5ad] --epsilon 8 [--output OUT.h5ad]`` and friends."""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
import textwrap
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import __version__

if TYPE_CHECKING:
    import anndata as ad

#: Exit code for input the user can fix (bad file, bad option, budget exceeded).
BAD_INPUT = 2

#: Python arguments that the command line spells as flags.
ARGUMENTS = (
    "epsilon",
    "delta",
    "n_clusters",
    "scope",
    "layer",
    "likelihood",
    "batch_size",
    "max_epochs",
    "noise_seed",
    "reference_key",
    "reference_model",
    "reference",
    "donor_key",
)


def speak_cli(message: str) -> str:
    """Rewrite a Python-API error message in the command line's words (flags, not arguments)."""
    names = "|".join(ARGUMENTS)
    message = message.replace("epsilon=None", "--non-private").replace("reference=...", "--reference FILE")
    message = message.replace("overwrite=True", "--overwrite")
    message = re.sub(rf"\bPass ({names})=None\b", lambda m: f"Leave out --{m[1].replace('_', '-')}", message)
    message = re.sub(rf"\b({names})=None\b", lambda m: f"no --{m[1].replace('_', '-')}", message)
    message = re.sub(rf"\b({names})='([\w.-]+)'", lambda m: f"--{m[1].replace('_', '-')} {m[2]}", message)
    message = re.sub(rf"\b({names})=(\w+)", lambda m: f"--{m[1].replace('_', '-')} {m[2]}", message)
    return re.sub(rf"^({names}) ", lambda m: f"--{m[1].replace('_', '-')} ", message)


#: A server's TLS files (``--ssl-*``), as Flower's SuperLink names them.
TLS_FILES = ("ssl-certfile", "ssl-keyfile", "ssl-ca-certfile")


def _task_argument(role: argparse.ArgumentParser) -> None:
    """``--task``: the federated task a server runs or a site serves, by name."""
    from .federated import TASKS

    role.add_argument(
        "--task",
        choices=list(TASKS),
        default="pipeline",
        help="; ".join(f"{name}: {task.description}" for name, task in TASKS.items())
        + " (default: pipeline).",
    )


def _parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    # --debug is accepted before or after the subcommand: main() takes it out of argv first
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", help="Show the full traceback of an error.")
    parser = argparse.ArgumentParser(
        prog="dpsc", description="Differentially private single-cell analysis.", parents=[common]
    )
    parser.add_argument("--version", action="version", version=f"dpsc {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    fit = sub.add_parser("fit", help="Cluster and embed cells with DP-DCAN.", parents=[common])
    fit.add_argument(
        "input", nargs="?", help="Counts as .h5ad or zarr store (default: the embedded PBMC 4k data set)."
    )
    fit.add_argument(
        "--epsilon", type=float, default=8.0, help="Privacy budget ε of the whole fit (default 8)."
    )
    fit.add_argument("--non-private", action="store_true", help="Train without DP (ignores --epsilon).")
    fit.add_argument(
        "--delta", type=float, default=None, help="δ (default 1e-5, or 1/(10 n) above 10^4 cells; < 1/n)."
    )
    fit.add_argument(
        "--n-clusters", type=int, default=None, help="Number of clusters (default 8; never estimated)."
    )
    fit.add_argument(
        "--scope",
        choices=["encoder", "full", "paper"],
        default="encoder",
        help="DP on the encoder with the decoder fixed (proven), on everything (DPE-DCAN, proven), "
        "or the DP-DCAN paper's partial perturbation (decoder trained without noise; heuristic).",
    )
    fit.add_argument("--layer", default=None, help="Layer holding the raw counts (default: X).")
    fit.add_argument(
        "--filter-genes",
        action="store_true",
        help="Drop genes with no count in any cell first (reads the cells: not covered by ε). Not needed: "
        "genes no cell expresses are simply never selected.",
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
    fit.add_argument("--batch-size", type=int, default=None, help="Expected Poisson batch (default 10 %%).")
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
    fit.add_argument(
        "--reference",
        default=None,
        help="A public reference of the same tissue (.h5ad of raw counts, not containing these cells): the "
        "model is pretrained on it (no ε) and only its encoder is trained on these cells.",
    )
    fit.add_argument(
        "--reference-key",
        default=None,
        help="obs column of the reference's cell types: the k-means starts from their means unless a "
        "released count finds most cells outside them; names the clusters.",
    )
    fit.add_argument(
        "--donor-key",
        default=None,
        help="obs column naming each cell's donor (patient): the ε is then per donor, with all of "
        "their cells (default: per cell).",
    )
    fit.add_argument(
        "--reference-model",
        default=None,
        help="Directory for the model pretrained on --reference: reused from there, else saved there.",
    )
    fit.add_argument("--output", "-o", default=None, help="Write the annotated AnnData here (.h5ad).")
    fit.add_argument(
        "--export", default=None, help="Directory to write the shareable encoder + centroids to."
    )
    fit.add_argument("--no-progress", action="store_true", help="Hide the progress bar.")
    fit.add_argument("--verbose", "-v", action="store_true", help="Print the full privacy statement.")
    cluster = sub.add_parser(
        "cluster",
        help="Cluster cells with the proven private pipeline (gene selection, PCA, k-means) in one ε.",
        parents=[common],
    )
    cluster.add_argument(
        "input",
        nargs="?",
        help="Raw counts as .h5ad, or a zarr store read out of core (default: the embedded PBMC 4k).",
    )
    cluster.add_argument("--epsilon", type=float, default=8.0, help="ε of the whole clustering (default 8).")
    cluster.add_argument("--non-private", action="store_true", help="The same pipeline without noise.")
    cluster.add_argument(
        "--delta", type=float, default=None, help="δ (default 1e-5, or 1/(10 n) above 10^4)."
    )
    cluster.add_argument("--n-clusters", type=int, default=8, help="Number of clusters (default 8).")
    cluster.add_argument(
        "--markers", action="store_true", help="Also release each cluster's marker genes inside the same ε."
    )
    cluster.add_argument("--layer", default=None, help="Layer holding the raw counts (default: X).")
    cluster.add_argument(
        "--reference",
        default=None,
        help="A public reference of the same tissue (.h5ad of raw counts, not containing these cells, or "
        "the folder of dpsc prepare-reference): its genes and components cost no ε.",
    )
    cluster.add_argument(
        "--reference-key",
        default=None,
        help="obs column of the reference's cell types: the k-means starts from their means unless a "
        "released count finds most cells outside them; names the clusters.",
    )
    cluster.add_argument(
        "--donor-key",
        default=None,
        help="obs column naming each cell's donor (patient): the ε is then per donor, with all of "
        "their cells (default: per cell).",
    )
    cluster.add_argument(
        "--noise-seed",
        type=int,
        default=None,
        help="Make the DP noise repeatable (tests only: no guarantee against whoever knows it).",
    )
    cluster.add_argument(
        "--label-key", default=None, help="obs column with known labels, for ARI/NMI (default: cell_type)."
    )
    cluster.add_argument("--output", "-o", default=None, help="Write the annotated AnnData here (.h5ad).")
    cluster.add_argument("--verbose", "-v", action="store_true", help="Print the full privacy statement.")
    _prepare_parser(sub, common)
    federate = sub.add_parser(
        "federate",
        help="Run or join a federated task: the private clustering (SecAgg+) or FedSC (--task).",
        parents=[common],
    )
    roles = federate.add_subparsers(dest="role", required=True)
    server = roles.add_parser(
        "server", help="Start the SuperLink and run the task over the sites.", parents=[common]
    )
    server.add_argument("--sites", type=int, required=True, help="Number of sites that will join.")
    _task_argument(server)
    server.add_argument("--rounds", type=int, default=None, help="FedSC: training rounds (default 250).")
    server.add_argument(
        "--noise-multiplier",
        type=float,
        default=None,
        help="FedSC: every site's DP-SGD noise multiplier; a site refuses one below its own calibration "
        "for its epsilon (without it, only non-private sites serve the run).",
    )
    server.add_argument(
        "--kmeans-noise-multiplier",
        type=float,
        default=None,
        help="FedSC: every site's noise multiplier of the final k-means (default: --noise-multiplier).",
    )
    server.add_argument(
        "--mode", choices=["secure", "plain"], default="secure", help="SecAgg+ (default) or plain."
    )
    server.add_argument(
        "--threshold", type=int, default=0, help="Sites assumed honest / SecAgg+ threshold (default: all)."
    )
    server.add_argument("--epsilon", type=float, default=8.0, help="Each site's ε for the run (default 8).")
    server.add_argument(
        "--non-private", action="store_true", help="A run without noise (sites must allow it)."
    )
    server.add_argument("--delta", type=float, default=1e-5, help="δ of the run (default 1e-5).")
    server.add_argument("--n-clusters", type=int, default=8, help="Number of clusters (default 8).")
    server.add_argument(
        "--markers",
        action="store_true",
        help="Also release each cluster's marker genes inside the same ε; every site receives them.",
    )
    server.add_argument(
        "--donor-unit",
        action="store_true",
        help="Plan a run that protects each donor with all of their cells (every site needs --donor-key).",
    )
    server.add_argument(
        "--reference",
        default=None,
        help="A public reference (.h5ad of raw counts) every site holds a copy of: the run is on its genes, "
        "scales and components; each site checks its own copy's sha256 fingerprint against this one's.",
    )
    server.add_argument(
        "--n-vars",
        type=int,
        default=0,
        help=(
            "Genes every site holds. The clustering asks the sites when it is 0 (the default) and checks "
            "it otherwise; --task fedsc needs it (its server builds the network before any site answers)."
        ),
    )
    server.add_argument(
        "--host", default="127.0.0.1", help="Address the SuperLink listens on (default loopback)."
    )
    server.add_argument("--port", type=int, default=8000, help="Port of the SuperLink (default 8000).")
    server.add_argument("--out", default="dpsc-federation", help="Folder for the result and logs.")
    server.add_argument("--timeout", type=float, default=600.0, help="Stop after this many seconds.")
    for name in TLS_FILES:
        server.add_argument(
            f"--{name}", default=None, help="TLS file (without them: --insecure, loopback only)."
        )
    site = roles.add_parser(
        "site", help="Join a federation with this site's own data and settings.", parents=[common]
    )
    site.add_argument("--settings", default=None, help="The site's settings file (TOML).")
    site.add_argument(
        "--data", default=None, help="The site's .h5ad (raw counts), when no --settings is given."
    )
    site.add_argument("--superlink", required=True, help="HOST:PORT of the federation's SuperLink.")
    _task_argument(site)
    site.add_argument("--epsilon", type=float, default=8.0, help="The largest ε this site spends on a run.")
    site.add_argument("--non-private", action="store_true", help="Serve non-private runs only.")
    site.add_argument("--delta", type=float, default=None, help="This site's δ (default 1e-5).")
    site.add_argument(
        "--budget",
        type=float,
        default=None,
        help="The largest total ε of this site's ledger (default: one run's --epsilon or the stored one).",
    )
    site.add_argument(
        "--raise-budget", action="store_true", help="Allow --budget to raise the budget stored in the ledger."
    )
    site.add_argument(
        "--max-fallback-epsilon",
        type=float,
        default=None,
        help="The largest ε, over all runs, should the other sites of a secure sum collude "
        "(default 2 × --epsilon per run, 2 × --budget in all).",
    )
    site.add_argument("--honest-sites", type=int, default=None, help="Sites this site trusts to add noise.")
    site.add_argument("--max-rounds", type=int, default=1000, help="The most releases served in one run.")
    site.add_argument("--layer", default=None, help="Layer with the raw counts (default: X).")
    site.add_argument("--output", default=None, help="Where to write the labelled cells (.h5ad).")
    site.add_argument(
        "--ledger",
        default=None,
        help="This site's ledger file (default: <data>.dpsc-ledger.json). A new file starts a new study "
        "or trial; the old one keeps what was spent.",
    )
    site.add_argument(
        "--reference",
        default=None,
        help="This site's own copy of a public reference (.h5ad of raw counts): it serves runs on that "
        "reference only when the server names the same sha256 fingerprint.",
    )
    site.add_argument(
        "--reference-key",
        default=None,
        help="obs column of the cell types in --reference: the k-means starts from their means (when every "
        "site has them and a released count finds most cells within them); names this site's clusters.",
    )
    site.add_argument(
        "--donor-key",
        default=None,
        help="obs column naming each cell's donor: this site's ε is then per donor with all of their "
        "cells, and it serves donor-level runs only (default: per cell).",
    )
    site.add_argument(
        "--port", type=int, default=None, help="Local port of the SuperNode (default: a free one)."
    )
    site.add_argument("--timeout", type=float, default=600.0, help="Stop after this many seconds.")
    site.add_argument(
        "--root-certificates", default=None, help="CA file of the SuperLink's TLS (else --insecure)."
    )
    return parser, {"fit": fit, "cluster": cluster, "federate": federate, "server": server, "site": site}


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


def _wrap(text: str) -> str:
    return textwrap.fill(text, width=96, initial_indent="  ", subsequent_indent="  ")


def _print_spend(record: dict) -> None:
    """Print the record's numbers and what the count of accounted releases is made of."""
    from .model import RELEASE_KINDS

    details = {detail: int(record.get(detail, 0)) for detail in RELEASE_KINDS}
    one_off = int(record["steps"]) - sum(details.values())
    print(
        f"Privacy spent: epsilon = {record['epsilon']:.3f} (target {record['target_epsilon']:g}), "
        f"delta = {record['delta']:g}, sigma = {record['noise_multiplier']:.3f}, "
        f"q = {record['sample_rate']:.4f}, C = {record['max_grad_norm']:g}, "
        f"accountant = {record['accountant']}, guarantee = {record['guarantee']}"
    )
    parts = [f"{details[detail]} {words}" for detail, (_, words) in RELEASE_KINDS.items()]
    if one_off:
        parts.append(f"{one_off} release(s) of gene statistics or input loadings")
    print(f"  {record['steps']} accounted releases: " + ", ".join(parts))


def _fit(args: argparse.Namespace) -> int:
    adata, source = _load(args.input)
    from . import tl
    from .privacy import get_record
    from .tl import collapse_message

    key = _label_key(adata, args.label_key)  # checked before any work
    _check_budgeted_input(adata, args.input, args.output)
    if args.export and args.reference:  # refused before any work: it would fail after the fit spent ε
        raise ValueError(
            "--export writes an encoder that reads genes; a fit with --reference reads each cell's point "
            "in the reference's basis. Leave out --export, and share the reference and --reference-model."
        )
    if args.filter_genes:
        adata = _drop_empty_genes(adata, args.layer)
    epsilon = None if args.non_private else args.epsilon
    delta = "auto" if args.delta is None else args.delta
    print(f"dpsc fit: {source}; epsilon={epsilon}, delta={delta}, scope={args.scope}", flush=True)
    start = time.perf_counter()
    with warnings.catch_warnings():  # the collapse note is printed below, once
        warnings.filterwarnings("ignore", message=r"Only \d+ of the \d+ clusters hold")
        model = tl.fit(
            adata,
            epsilon=epsilon,
            delta=args.delta,
            n_clusters=args.n_clusters,
            scope=args.scope,
            layer=args.layer,
            likelihood=args.likelihood,
            max_epochs=args.max_epochs,
            batch_size=args.batch_size,
            accountant=args.accountant,
            optimizer=args.optimizer,
            random_state=args.seed,
            noise_seed=args.noise_seed,
            reference=args.reference,
            reference_key=args.reference_key,
            reference_model=args.reference_model,
            donor_key=args.donor_key,
            progress_bar=not args.no_progress,
            return_model=True,
        )
    wall = time.perf_counter() - start
    record = get_record(adata, "X_dpdcan")
    print()
    print(_wrap(_summary(record)))
    if args.verbose:
        if epsilon is not None:
            _print_spend(record)
        print("What this covers:")
        print(_wrap(record["statement"]))
    print(f"Wall time: {wall:.1f} s")
    result = adata.uns["dpsc"]["X_dpdcan"]
    asked, in_use = model.n_clusters, int(result["clusters_in_use"])
    print(
        f"Clusters: {in_use} of {asked} used (clusters whose released label count is above twice "
        "its noise; read from released values only)"
    )
    if in_use < asked / 2:
        print(_wrap(collapse_message(in_use, asked, epsilon, args.donor_key is not None)))
    partition = result["params"].get("partition")
    if partition is not None:
        source = {
            "clustering": "the private clustering the model started from (the model's partition did not "
            "score clearly better)",
            "model": "the trained model (it scored clearly better than the clustering it started from)",
        }[partition]
        print(_wrap(f"Labels from {source}; the embedding is the model's."))
    if args.reference_key:
        _print_names(adata, "dp_cluster", result["cluster_names"])
    _score(adata, key, "dp_cluster")
    if args.output:
        _write(adata, args.output)
        print(f"Wrote {args.output}")
    if args.export:
        path = model.export_shared(args.export, overwrite=True)
        print(f"Shareable encoder + centroids (no decoder) written to {path}")
    return 0


def _summary(record: dict) -> str:
    """One plain line on what was spent and what it covers (the full statement: --verbose)."""
    if record.get("guarantee") == "none" or record.get("epsilon") is None:
        return "Privacy: none (a run without noise): nothing here may be shared as private."
    kind = {"proven": "proven", "heuristic": "heuristic (not a proof)"}.get(
        record["guarantee"], record["guarantee"]
    )
    return (
        f"Privacy: epsilon {record['epsilon']:.2f} at delta {record['delta']:.0e}, {kind}, {_per(record)}. "
        f"Covered: {record.get('covered', 'the released values')}. The full statement: --verbose."
    )


def _per(record: dict) -> str:
    """Return the record's unit of privacy in plain words: per cell, or per donor (obs['donor'])."""
    if record.get("individual") == "donor":
        return f"per donor (obs[{record.get('donor_key')!r}], each with all of their cells)"
    return "per cell"


def _print_names(adata, cluster_key: str, named: dict[str, dict[str, Any]]) -> None:
    """Print each cluster's name, and how many cells lie outside their cluster's type (the user's own)."""
    print("Names from the reference: " + ", ".join(f"{c}: {v['name']}" for c, v in named.items()))
    unmatched = adata.obs[f"{cluster_key}_names"].astype(str) == "unmatched"
    of_cluster = adata.obs[cluster_key].astype(str).map({c: v["name"] for c, v in named.items()})
    outside = int((unmatched & (of_cluster != "unmatched")).sum())
    if outside:
        print(
            f"{outside} cells lie outside their cluster's reference type: named 'unmatched' in "
            f"obs['{cluster_key}_names']."
        )


def _score(adata, key: str | None, column: str) -> None:
    """Print ARI/NMI against known labels (an evaluation for the data owner, not a release)."""
    import numpy as np
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

    if key is None:
        print("No known labels (obs 'cell_type' or 'label'), so no ARI/NMI; pass --label-key to score.")
        return
    truth = np.asarray(adata.obs[key].astype(str))
    pred = np.asarray(adata.obs[column].astype(str))
    print(
        f"Against obs[{key!r}] (evaluation for the data owner, not a release: it compares the "
        f"cells' labels exactly): ARI = {adjusted_rand_score(truth, pred):.3f}, "
        f"NMI = {normalized_mutual_info_score(truth, pred):.3f}"
    )


def _cluster(args: argparse.Namespace) -> int:
    adata, source = _load(args.input)
    from . import tl
    from ._outputs import derived_key
    from .privacy import get_record
    from .tl import few_clusters_message

    key = _label_key(adata, args.label_key)  # checked before any work
    _check_budgeted_input(adata, args.input, args.output)
    epsilon = None if args.non_private else args.epsilon
    print(f"dpsc cluster: {source}; epsilon={epsilon}, {args.n_clusters} clusters", flush=True)
    start = time.perf_counter()
    with warnings.catch_warnings():  # the collapse note is printed below, once
        warnings.filterwarnings("ignore", message=r"Only \d+ of the \d+ clusters hold")
        tl.cluster(
            adata,
            args.n_clusters,
            epsilon=epsilon,
            delta=args.delta,
            layer=args.layer,
            markers=args.markers,
            reference=args.reference,
            reference_key=args.reference_key,
            donor_key=args.donor_key,
            noise_seed=args.noise_seed,
        )
    wall = time.perf_counter() - start
    record = get_record(adata, "dp_cluster")
    in_use = int(adata.uns["dpsc"]["dp_cluster"]["clusters_in_use"])
    print(_wrap(_summary(record)))
    print(
        f"Clusters: {in_use} of {args.n_clusters} in use (released counts above their noise), in "
        f"obs['dp_cluster']. Time: {wall:.1f} s."
    )
    if in_use < args.n_clusters / 2:
        print(_wrap(few_clusters_message(in_use, args.n_clusters)))
    if args.reference_key:
        _print_names(adata, "dp_cluster", adata.uns["dpsc"]["dp_cluster"]["cluster_names"])
    if args.markers:
        names = adata.uns[derived_key("dp_cluster", "markers")]["names"]
        for group in names.dtype.names:
            print(f"  cluster {group}: " + ", ".join(str(g) for g in names[group][:5]))
    _score(adata, key, "dp_cluster")
    if args.verbose:
        print("What this covers:")
        print(_wrap(record["statement"]))
    if args.output:
        _write(adata, args.output)
        print(f"Wrote {args.output}")
    return 0


def _check_budgeted_input(adata: ad.AnnData, path: str | None, output: str | None) -> None:
    """Refuse, before any work, a run that would leave a budget stored in the input file unspent.

    A budget set with ``dpsc.privacy.set_budget`` and saved lives in the file's own ledger. The run
    books there only if its ledger is a ledger file (``dpsc.privacy.attach_ledger``) or the result
    is written over the input (``--output`` the input's path); otherwise a second run on the same
    file would find its budget untouched.
    """
    dpsc_uns = adata.uns.get("dpsc", {})
    if path is None or "budget" not in dpsc_uns or dpsc_uns.get("ledger_file"):
        return
    if output is not None and Path(output).resolve() == Path(path).resolve():
        return
    raise ValueError(
        f"{path} stores a privacy budget (epsilon {float(dpsc_uns['budget']['epsilon']):g}) in its own "
        "ledger, which this run could not book: pass --output "
        f"{path} to write the result and its ledger back into it, or keep the ledger in a file beside the "
        "data (dpsc.privacy.attach_ledger(adata, 'cells.ledger.json'), then save the AnnData)."
    )


@contextlib.contextmanager
def _input_written_back(path: str | None, output: str | None) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` from before it is read until the result is written over it.

    With ``--output`` the input's own path, the run reads the file's ledger, books in it and writes
    it back: two such runs at once would each book on the ledger as it was before the other, and
    the second write would lose the first's booking. The lock (``fcntl.flock`` on ``<path>.lock``)
    makes the second run wait, then read the ledger the first wrote, so its budget check sees both.
    """
    if path is None or output is None or Path(output).resolve() != Path(path).resolve():
        yield
        return
    import fcntl

    with open(f"{Path(path).resolve()}.lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"Waiting for another dpsc run that writes {path} to finish…", file=sys.stderr, flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _load(path: str | None) -> tuple[ad.AnnData, str]:
    """Return the input AnnData and its name; the path is checked before anything heavy is imported."""
    if path is not None and Path(path).is_dir():
        from .datasets import read_zarr

        return read_zarr(path), path
    if path is not None and not Path(path).is_file():
        raise FileNotFoundError(f"No such file: {path}. Pass the path to an .h5ad file or a zarr store.")
    import anndata as ad

    from . import datasets

    if path is None:
        return datasets.pbmc4k(), "embedded PBMC 4k (4271 cells × 2000 genes)"
    try:
        return ad.read_h5ad(path), path
    except OSError as err:
        raise ValueError(f"{path} is not a readable .h5ad file ({err}).") from None


def _write(adata: ad.AnnData, output: str) -> None:
    """Write the result; of cells read lazily, the results only (obs, var, obsm, uns), not their matrix."""
    from ._blocks import is_dask

    if is_dask(adata.X):
        import anndata as ad

        obsm = {key: value for key, value in adata.obsm.items() if not is_dask(value)}
        lazy = [key for key in adata.obsm if key not in obsm]
        adata = ad.AnnData(obs=adata.obs, var=adata.var, obsm=obsm, uns=adata.uns)
        print(f"The cells stay in their store; {output} holds the results (not obsm {lazy}).")
    adata.write_h5ad(output)


def _reference_fingerprint(path: str) -> str:
    """Return the sha256 fingerprint of a public reference, as each site computes it of its own copy."""
    from ._prepared_reference import read_manifest
    from ._public_reference import file_fingerprint

    if Path(path).is_dir():
        return read_manifest(Path(path), "--reference")["fingerprint"]
    if not Path(path).is_file():
        raise FileNotFoundError(
            f"--reference {path} does not exist; give the reference's .h5ad file or prepared folder."
        )
    return file_fingerprint(path, "--reference")


#: Server options of one federated task only (``dpsc federate server --task``): given to the other
#: task, they stop the run before it starts instead of being ignored.
TASK_OPTIONS = {
    "pipeline": (
        "mode",
        "threshold",
        "epsilon",
        "non_private",
        "delta",
        "markers",
        "donor_unit",
        "reference",
    ),
    "fedsc": ("rounds", "noise_multiplier", "kmeans_noise_multiplier"),
}


def _federate(args: argparse.Namespace) -> int:
    return _federate_server(args) if args.role == "server" else _federate_site(args)


def _server_run_config(args: argparse.Namespace) -> dict[str, Any]:
    """Return the run configuration of ``--task`` from the server's flags (others' flags refused)."""
    import json

    _, parsers = _parser()
    for task, options in TASK_OPTIONS.items():
        given = [
            f"--{o.replace('_', '-')}"
            for o in options
            if getattr(args, o) != parsers["server"].get_default(o)
        ]
        if task != args.task and given:
            raise ValueError(
                f"{', '.join(given)} belong to --task {task}; the {args.task!r} task does not take them."
            )
    if args.task == "fedsc":
        config = {"n_clusters": args.n_clusters, "n_genes": args.n_vars}
        if args.rounds is not None:
            config["rounds"] = args.rounds
        if args.noise_multiplier is not None:  # one value for every site: each checks it against its own
            config["noise_multipliers"] = json.dumps([args.noise_multiplier])
            config["kmeans_noise_multipliers"] = json.dumps(
                [args.kmeans_noise_multiplier or args.noise_multiplier]
            )
        return config
    reference = ""
    if args.reference:
        reference = _reference_fingerprint(args.reference)
        print(
            f"On the public reference {args.reference} (sha256 {reference[:16]}…); "
            "each site checks its own copy."
        )
    return {
        "mode": args.mode,
        "threshold": args.threshold,
        "epsilon": -1.0 if args.non_private else args.epsilon,
        "delta": args.delta,
        "n_clusters": args.n_clusters,
        "n_vars": args.n_vars,
        "markers": int(args.markers),
        "donor_unit": int(args.donor_unit),
        "reference_fingerprint": reference,
    }


def _federate_server(args: argparse.Namespace) -> int:
    """``dpsc federate server``: submit ``--task``'s own app to the sites; print what the run released."""
    from .federated import app_fingerprint, read_result, run_server
    from .tl import few_clusters_message

    if not args.ssl_certfile and args.host not in ("127.0.0.1", "localhost"):
        print("Warning: no TLS certificates: messages travel unencrypted (use --ssl-* on a real network).")
    config = _server_run_config(args)
    fingerprint = app_fingerprint(args.task)
    print(
        f"Submitting dpsc's own {args.task!r} app (fingerprint {fingerprint}); each site checks it.",
        flush=True,
    )
    summary = run_server(
        n_sites=args.sites,
        out=args.out,
        task=args.task,
        host=args.host,
        port=args.port,
        timeout=args.timeout,
        certificates={name: getattr(args, name.replace("-", "_")) for name in TLS_FILES},
        **config,
    )
    result = Path(args.out) / "result"
    if args.task == "fedsc":
        print(
            f"FedSC over {summary['n_sites']} sites: {summary['rounds']} rounds and "
            f"{len(summary['releases'])} k-means releases in {summary['wall_s']:.1f} s; the global model "
            f"and centroids in {result}; each site's embedding and labels in its own output."
        )
        return 0
    print(
        f"Federated clustering over {summary['n_sites']} sites ({summary['mode']}, threshold "
        f"{summary['threshold']}): {len(summary['releases'])} releases in {summary['wall_s']:.1f} s; "
        f"result in {result}"
    )
    for row in summary["releases"]:
        print(
            f"  release {row['index']} ({row['kind']}): {row['contributors']} sites, "
            f"{row['bytes_per_site']} bytes per site"
        )
    in_use = read_result(result).clusters_in_use
    print(f"{in_use} of the {args.n_clusters} released centroids hold cells above their counts' noise.")
    if in_use < args.n_clusters / 2:
        print(_wrap(few_clusters_message(in_use, args.n_clusters)))
    return 0


def _federate_site(args: argparse.Namespace) -> int:
    """``dpsc federate site``: serve ``--task`` with this site's own app, settings and ledger."""
    from .federated import SiteSettings, run_site, write_site_settings

    if args.settings:
        settings_file = Path(args.settings)
    elif args.data:
        settings = SiteSettings(
            data=str(Path(args.data).resolve()),
            epsilon=None if args.non_private else args.epsilon,
            delta=args.delta,
            budget=args.budget,
            raise_budget=args.raise_budget,
            max_fallback_epsilon=args.max_fallback_epsilon,
            honest_sites=args.honest_sites,
            max_rounds=args.max_rounds,
            layer=args.layer,
            output=args.output,
            ledger=None if args.ledger is None else str(Path(args.ledger).resolve()),
            reference=None if args.reference is None else str(Path(args.reference).resolve()),
            reference_key=args.reference_key,
            donor_key=args.donor_key,
        )
        settings_file = write_site_settings(settings, Path(args.data).with_suffix(".dpsc-site.toml"))
    else:
        raise ValueError(
            "Give the site's settings file (--settings site.toml) or its data (--data site.h5ad)."
        )
    try:
        output = run_site(
            settings_file,
            superlink=args.superlink,
            task=args.task,
            port=args.port,
            timeout=args.timeout,
            root_certificates=args.root_certificates,
        )
    except ValueError as refusal:  # said in the site's own log too (stdout), naming the site
        print(_wrap(f"Site {args.data or args.settings}: {refusal}"), flush=True)
        raise
    print(f"This site's cells, labelled by the federation's released centroids, are in {output}")
    return 0


def _prepare_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    prepare = sub.add_parser(
        "prepare-reference",
        help="Read a public reference once and save what dpsc reads of it: a folder for --reference.",
        parents=[common],
    )
    prepare.add_argument("reference", help="The public reference (.h5ad of raw counts).")
    prepare.add_argument("cohort", help="An .h5ad of the cells it will serve (only its gene names are read).")
    prepare.add_argument("--output", "-o", required=True, help="The folder to write.")
    prepare.add_argument("--reference-key", default=None, help="obs column of the reference's cell types.")
    prepare.add_argument("--overwrite", action="store_true", help="Replace an existing prepared folder.")


def _prepare_reference(args: argparse.Namespace) -> int:
    """``dpsc prepare-reference``: :func:`dpsc.tl.prepare_reference` on the cohort's gene names."""
    import anndata as ad

    from . import tl

    if not Path(args.cohort).exists():
        raise FileNotFoundError(
            f"{args.cohort} does not exist; pass the .h5ad of the cells the reference serves."
        )
    cohort = ad.read_h5ad(args.cohort, backed="r")  # its gene names only; no cell is read
    tl.prepare_reference(
        args.reference, cohort, args.output, reference_key=args.reference_key, overwrite=args.overwrite
    )
    print(f"Prepared {args.reference} for the {cohort.n_vars} genes of {args.cohort} in {args.output}.")
    print(f"Pass --reference {args.output} to dpsc cluster, dpsc fit or a site.")
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "prepare-reference": _prepare_reference,
    "fit": _fit,
    "cluster": _cluster,
    "federate": _federate,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dpsc`` command: exit 0 on success, 2 on input the user can fix."""
    parser, subparsers = _parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    args, extra = parser.parse_known_args([a for a in argv if a != "--debug"])
    args.debug = debug
    if extra:  # answered with the subcommand's usage, not the top-level one
        name = getattr(args, "role", None) or args.command
        subparsers.get(name, parser).error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        output = getattr(args, "output", None)
        if args.command in ("fit", "cluster") and output and Path(output).is_dir():  # before any booking
            raise ValueError(f"--output {output} is a folder; write the results to an .h5ad file.")
        with _input_written_back(getattr(args, "input", None), output):
            return COMMANDS[args.command](args)
    except (
        ValueError,
        FileNotFoundError,
        KeyError,
        TypeError,
        RuntimeError,
        TimeoutError,
        ImportError,
    ) as err:
        if args.debug:
            raise
        message = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
        print(textwrap.fill(f"dpsc: error: {speak_cli(message)}", width=96), file=sys.stderr)
        print(f"(the full traceback: dpsc {args.command} ... --debug)", file=sys.stderr)
        return BAD_INPUT


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
