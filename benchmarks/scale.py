"""Scale: simulated atlases of growing size — generation time and memory, fit time per epoch and ARI.

Cells come from ``dpsc.datasets.simulate`` (negative-binomial model fitted on the embedded
PBMC 4k; synthetic). Every measurement runs in its own process so that its peak RSS
(``ru_maxrss``) is its own. ``fit`` runs DP and non-private fits of one simulated atlas in the
same process, one after the other, with the same schedule, and records seconds per epoch, the
process's peak RSS after each fit and the ARI against the simulated types.

    python benchmarks/scale.py simulate --cells 10000 100000 1000000 --out benchmarks/results/scale.jsonl
    python benchmarks/scale.py fit --cells 10000 --epochs 10 --epsilons 8 1 0 \
        --out benchmarks/results/scale.jsonl
    python benchmarks/scale.py --report benchmarks/results/scale.jsonl [--figure scale.png]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pandas as pd


def _peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2  # Linux: KiB


def _accelerator() -> str:
    """What ``tl.fit``'s default ``accelerator="auto"`` trains on here: a CUDA device's name, or "cpu"."""
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def _write(path: str, row: dict) -> None:
    row.update(cpu=platform.machine(), threads=int(os.environ.get("OMP_NUM_THREADS", 2)))
    row.update(accelerator=_accelerator())
    with open(path, "a") as fh:
        fh.write(json.dumps(row) + "\n")
    print(json.dumps(row), flush=True)


def one_simulation(n_cells: int, out: str) -> None:
    import dpsc

    model = dpsc.datasets.fit_atlas_model(dpsc.datasets.pbmc4k())
    before = _peak_rss_gb()
    start = time.perf_counter()
    adata = dpsc.datasets.simulate(n_cells, model=model, random_state=0, n_jobs=2)
    wall = time.perf_counter() - start
    X = adata.X
    _write(
        out,
        {
            "stage": "simulate",
            "cells": n_cells,
            "genes": adata.n_vars,
            "wall_s": wall,
            "nnz": int(X.nnz),
            "sparse_gb": (X.data.nbytes + X.indices.nbytes + X.indptr.nbytes) / 1024**3,
            "peak_rss_gb": _peak_rss_gb(),
            "rss_before_gb": before,
        },
    )


def _reset_peak_rss() -> None:
    """Reset the kernel's peak-RSS mark of this process (Linux ``clear_refs``), if allowed."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def _peak_rss_since_reset_gb() -> float:
    """Peak RSS since the last reset (``VmHWM``); the process peak where unavailable."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024**2
    except OSError:
        pass
    return _peak_rss_gb()


def _write_simulated(n_cells: int, path: str, source: str | None) -> None:
    """Simulate the atlas and write it to ``path`` (run in a child process; see ``one_fit_series``)."""
    import dpsc

    dpsc.datasets.simulate(n_cells, model=_atlas_model(source), random_state=0, n_jobs=2).write_h5ad(path)


def _open_backed(n_cells: int, out: str, source: str | None):
    """The simulated atlas written by a child process, opened here with ``backed="r"``.

    The child does the simulating, so this process's heap never held the cells: the fit's peak
    RSS is then the fit's own, not memory the allocator kept from the simulation.
    """
    import multiprocessing

    import anndata as ad

    path = Path(out).with_suffix(f".{n_cells}.h5ad")
    context = multiprocessing.get_context("spawn")
    child = context.Process(target=_write_simulated, args=(n_cells, str(path), source))
    child.start()
    child.join()
    if child.exitcode != 0:
        raise RuntimeError(f"simulating {n_cells} cells failed (exit {child.exitcode})")
    adata = ad.read_h5ad(path, backed="r")
    sizes = [adata.file["X"][part].nbytes for part in ("data", "indices", "indptr")]
    return adata, path, sum(sizes) / 1024**3


def _atlas_model(source: str | None):
    """Atlas model fitted on ``source`` (an ``.h5`` with ``obs["label"]``), or on the embedded PBMC 4k."""
    import dpsc

    if source is None:
        return None  # simulate's default: fitted on the embedded PBMC 4k
    import scanpy as sc

    cells = dpsc.datasets.read_h5(source)
    sc.pp.filter_genes(cells, min_counts=1)  # a public source; genes with no count stay out
    return dpsc.datasets.fit_atlas_model(cells, labels_key="label")


def _warm_up(**fit_options) -> None:
    """One tiny private and one non-private fit with the series' options, untimed, so that no timed
    fit pays the first call's costs (importing the training stack, first kernel calls)."""
    import dpsc

    cells = dpsc.datasets.pbmc4k()
    for eps in (8, None):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dpsc.tl.fit(cells, epsilon=eps, max_epochs=2, progress_bar=False, **fit_options)


def one_fit_series(
    n_cells: int,
    epochs: int,
    epsilons: list[float],
    out: str,
    backed: bool = False,
    source: str | None = None,
    private_lrs: tuple[float | None, float | None] = (None, None),
    **fit_options,
) -> None:
    """DP and non-private fits of one simulated atlas; ``fit_options`` go to ``dpsc.tl.fit``
    (``scope``, ``optimizer``); ``private_lrs`` are the plan's ``private_lr`` and
    ``cluster_private_lr`` (``None``: the optimizer's default rates)."""
    import torch
    from sklearn.metrics import adjusted_rand_score

    import dpsc

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", 2)))
    plan = dict(zip(("private_lr", "cluster_private_lr"), private_lrs, strict=True))
    if any(rate is not None for rate in private_lrs):
        fit_options["plan_kwargs"] = {key: rate for key, rate in plan.items() if rate is not None}
    _warm_up(**fit_options)
    if backed:  # the fit reads the file where it lies
        adata, path, sparse_gb = _open_backed(n_cells, out, source)
    else:
        adata = dpsc.datasets.simulate(n_cells, model=_atlas_model(source), random_state=0, n_jobs=2)
        X = adata.X
        sparse_gb = (X.data.nbytes + X.indices.nbytes + X.indptr.nbytes) / 1024**3
    after_simulate = _peak_rss_gb()
    delta = min(1e-5, 0.1 / n_cells)  # tl.fit requires delta < 1/n
    for eps in epsilons:
        _reset_peak_rss()
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dpsc.tl.fit(
                adata,
                epsilon=None if eps == 0 else eps,
                delta=delta,
                max_epochs=epochs,
                n_clusters=adata.obs["cell_type"].nunique(),
                progress_bar=False,
                **fit_options,
            )
        wall = time.perf_counter() - start
        record = dpsc.privacy.get_record(adata, "X_dpdcan")
        _write(
            out,
            {
                "stage": "fit",
                "cells": n_cells,
                "epsilon": None if eps == 0 else eps,
                "delta": delta,
                "epochs": epochs,
                "batch_size": int(adata.uns["dpsc"]["X_dpdcan"]["params"]["batch_size"]),
                "wall_s": wall,
                "s_per_epoch": wall / epochs,
                "ari": adjusted_rand_score(adata.obs["cell_type"], adata.obs["dp_cluster"]),
                "clusters_used": int(adata.obs["dp_cluster"].nunique()),
                "guarantee": record["guarantee"],
                "noise_multiplier": record.get("noise_multiplier"),
                "sparse_gb": sparse_gb,
                "rss_after_simulate_gb": after_simulate,
                "peak_rss_gb": _peak_rss_gb(),
                "fit_peak_rss_gb": _peak_rss_since_reset_gb(),
                "backed": backed,
                "source": Path(source).stem if source else "pbmc4k",
                "scope": fit_options.get("scope", "encoder"),
                "input_pcs": int(adata.uns["dpsc"]["X_dpdcan"]["params"].get("input_pcs", -1)),
                "optimizer": fit_options.get("optimizer", "sgd"),
                "warmed_up": True,
                **plan,
            },
        )
    if backed:
        adata.file.close()
        path.unlink()


def _scope_label(row) -> str:
    """The scope, and for ``full`` what the encoder reads (rows without ``input_pcs`` read genes)."""
    if row["scope"] != "full":
        return row["scope"]
    pcs = row.get("input_pcs")
    return "full, genes in" if pd.isna(pcs) or pcs < 0 else f"full, {int(pcs)} DP PCs in"


def _fit_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The fit rows, with the options that rows written before a column existed ran with."""
    fits = df[df["stage"] == "fit"].copy()
    defaults = {"backed": False, "scope": "encoder", "optimizer": "sgd", "source": "pbmc4k"}
    for column, default in defaults.items():
        fits[column] = fits.get(column, pd.Series(default, index=fits.index)).fillna(default)
    fits["backed"] = fits["backed"].astype(bool)
    return fits


def report(path: str) -> str:
    df = pd.read_json(path, lines=True)
    lines = [
        "# Scale: simulated atlases",
        "",
        "Cells from `dpsc.datasets.simulate` (synthetic: negative-binomial model fitted on PBMC 4k, "
        "2000 genes). Each row is its own process; peak RSS is that process's `ru_maxrss`.",
        "",
    ]
    sim = df[df["stage"] == "simulate"]
    if len(sim):
        lines += [
            f"Command: `python benchmarks/scale.py simulate --cells … --out {path}`.",
            "",
            "| cells | seconds to simulate | nonzeros | sparse matrix (GB) | peak RSS (GB) |",
            "|---|---|---|---|---|",
        ]
        for _, r in sim.sort_values("cells").iterrows():
            lines.append(
                f"| {r['cells']:,} | {r['wall_s']:.1f} | {r['nnz']:,} | {r['sparse_gb']:.2f} | "
                f"{r['peak_rss_gb']:.2f} |"
            )
        lines.append("")
    fits = _fit_rows(df)
    if len(fits):
        sigma = fits.get("noise_multiplier", pd.Series(float("nan"), index=fits.index))
        private = fits["guarantee"] != "none"
        fits["sigma"] = [
            f"{v:.3g}" if p and not pd.isna(v) else "–" for v, p in zip(sigma, private, strict=True)
        ]
        missing = pd.Series(float("nan"), index=fits.index)
        lrs = [fits.get(column, missing) for column in ("private_lr", "cluster_private_lr")]
        fits["lrs"] = [
            "–" if r["guarantee"] == "none" else "default" if pd.isna(a) else f"{a:g} / {b:g}"
            for (_, r), a, b in zip(fits.iterrows(), *lrs, strict=True)
        ]
        lines += [
            f"Command: `python benchmarks/scale.py fit --cells … --epochs … [--scope S --optimizer O] "
            "[--private-lr A --cluster-private-lr B] [--source FILE] "
            f"[--backed] --out {path}`; default `dpsc.tl.fit` settings with `max_epochs` as given and "
            "δ = min(1e-5, 0.1/n). DP / non-private time divides by the non-private row of the same "
            "size, schedule and model (genes or DP principal components in), each process alone on the "
            "machine. Seconds per epoch include the "
            "fit's fixed costs (DP k-means releases, latent and label writing), so short schedules "
            "overstate them. Peak RSS is the fit's own: the kernel's peak mark is reset before each "
            "fit, so it counts the cells held in memory but not the simulation's temporary memory "
            "nor an earlier fit of the same process; rows marked † were written before the "
            "benchmark reset it and show the process's maximum so far. Repeated rows are "
            "independent fits (secret sampling and noise); the input column names the CUDA device "
            'when a fit trained on one (`tl.fit`\'s `accelerator="auto"`), else it ran on the CPU threads '
            "below. The epochs differ between sizes (an "
            "epoch is n / batch steps), so the ARI column compares ε within a size, not sizes with "
            "each other. `--backed` rows fit the simulated cells written to an `.h5ad` file by a "
            'child process and opened with `backed="r"`; their peak RSS is the fit\'s own (the '
            "kernel's peak mark is reset before the fit). A row at ε = 1000 is a diagnostic, not a "
            "guarantee anyone should use: the clipping and sampling of a private fit with almost no "
            "noise (see σ), which separates what the noise costs from what the DP-SGD recipe costs. "
            "Each process first runs an untimed tiny private and non-private fit, so that no timed fit "
            "pays the first call's costs (importing the training stack, about 4 s); rows marked ‡ were "
            "written before it did, and the first fit of their process (the first ε of the command) "
            "includes those costs. "
            "Private learning rates: `default` is the optimizer's row of `DEFAULT_PRIVATE_LRS` "
            "(instance / cluster stage). `--source` fits the atlas model on another labelled file "
            "(e.g. `../shared/data/mouse_bladder_top2000.h5`, 16 types); `n_clusters` is the number "
            "of simulated types.",
            "",
            "| atlas from | cells | input | scope | private optimizer | private lr | expected batch | "
            "ε | σ | epochs | s / epoch | DP / non-private time | ARI | clusters used | fit peak RSS (GB) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        # a private row's time divides by the non-private row of the same model (genes or DP PCs in)
        fits["model_input"] = fits.get("input_pcs", missing).fillna(-1)
        keys = ["source", "cells", "epochs", "batch_size", "backed", "model_input"]
        for (source, cells, epochs, _, backed, _), g in fits.groupby(keys, sort=False):
            base = g[g["epsilon"].isna()]["s_per_epoch"].mean()
            for _, r in g.sort_values("epsilon", ascending=False, na_position="last").iterrows():
                eps = "none" if pd.isna(r["epsilon"]) else f"{r['epsilon']:g}"
                ratio = "–" if pd.isna(base) else f"{r['s_per_epoch'] / base:.2f}"
                reset = "fit_peak_rss_gb" in r and not pd.isna(r["fit_peak_rss_gb"])
                peak = f"{r['fit_peak_rss_gb']:.2f}" if reset else f"{r['peak_rss_gb']:.2f} †"
                cold = "" if r.get("warmed_up") is True else " ‡"
                where = "backed file" if backed else "in memory"
                device = r.get("accelerator", "cpu")
                where += "" if pd.isna(device) or device == "cpu" else f", {device}"
                lines.append(
                    f"| {source} | {int(cells):,} | {where} | "
                    f"{_scope_label(r)} | "
                    f"{r['optimizer'] if r['guarantee'] != 'none' else '–'} | {r['lrs']} | "
                    f"{int(r['batch_size']):,} | {eps} | {r['sigma']} | {int(epochs)} | "
                    f"{r['s_per_epoch']:.2f}{cold} | {ratio} | {r['ari']:.3f} | {int(r['clusters_used'])} | "
                    f"{peak} |"
                )
    devices = df.get("accelerator", pd.Series("cpu", index=df.index)).fillna("cpu").unique()
    ran_on = f"{', '.join(sorted(df['cpu'].astype(str).unique()))}, 2 threads"
    return "\n".join(lines) + f"\n\nRan on: {ran_on}; trained on: {', '.join(sorted(devices))}.\n"


def plot(path: str, figure: str) -> None:
    """Seconds per epoch and ARI against the number of cells: one line per scope and ε, each
    point the mean of that size's repeated fits (the default optimizer, rates and PBMC atlas;
    the encoder scope's gene-reading model and the proven scope's default 16-PC model)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fits = _fit_rows(pd.read_json(path, lines=True))
    pcs = fits.get("input_pcs", pd.Series(float("nan"), index=fits.index)).fillna(-1)
    default_model = (fits["scope"] == "encoder") | (pcs > 0)  # full scope: its DP-PC model
    fits = fits[
        default_model
        & ~fits["backed"]
        & (fits["optimizer"] == "sgd")
        & (fits["source"] == "pbmc4k")
        & fits.get("private_lr", pd.Series(float("nan"), index=fits.index)).isna()
        & (fits["epsilon"].isna() | (fits["epsilon"] <= 8))  # not the diagnostic rows
    ]
    fits = fits[fits["batch_size"] == fits.groupby("cells")["batch_size"].transform("min")]
    fits["eps"] = fits["epsilon"].fillna(0)
    points = fits.groupby(["scope", "eps", "cells"])[["s_per_epoch", "ari"]].mean().reset_index()
    fig, axes = plt.subplots(1, 2, figsize=(9.5, 4.2))
    styles = {"encoder": ("-", "encoder (heuristic)"), "full": ("--", "full, DP PCs in (proven)")}
    for (scope, eps), g in points.groupby(["scope", "eps"]):
        line, name = styles[scope]
        label = f"{name}, " + ("non-private" if eps == 0 else f"ε = {eps:g}")
        colour = {0: "C0", 1: "C1", 8: "C2"}.get(eps)
        for ax, column in zip(axes, ("s_per_epoch", "ari"), strict=True):
            ax.plot(g["cells"], g[column], line, marker="o", color=colour, label=label)
    epochs = ", ".join(f"{int(c):,}: {int(e)}" for c, e in fits.groupby("cells")["epochs"].first().items())
    axes[0].set(xscale="log", yscale="log", xlabel="cells", ylabel="seconds per epoch (2 threads)")
    axes[1].set(xscale="log", xlabel="cells", ylabel="ARI vs simulated types", ylim=(0, 1))
    axes[1].set_title(f"mean of repeated fits; epochs per fit — {epochs}", fontsize=8)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.14, 1, 1))
    fig.savefig(figure, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stage", nargs="?", choices=["simulate", "fit", "_simulate_one", "_fit_one"])
    parser.add_argument("--cells", nargs="+", type=int, default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--epsilons", nargs="+", type=float, default=[8, 1, 0], help="0 = non-private")
    parser.add_argument("--backed", action="store_true", help="fit the file opened with backed='r'")
    parser.add_argument("--scope", default="encoder", choices=["encoder", "full"], help="tl.fit's scope")
    parser.add_argument("--optimizer", default="sgd", choices=["sgd", "adam"], help="tl.fit's optimizer")
    parser.add_argument("--private-lr", type=float, help="tl.fit's private_lr (instance stage)")
    parser.add_argument("--cluster-private-lr", type=float, help="tl.fit's cluster_private_lr")
    parser.add_argument("--source", help=".h5 with obs['label'] to fit the atlas model on (default PBMC 4k)")
    parser.add_argument("--out", default="benchmarks/results/scale.jsonl")
    parser.add_argument("--report")
    parser.add_argument("--figure", default=None, help="with --report: write the figure here")
    args = parser.parse_args()
    if args.report:
        if args.figure:
            plot(args.report, args.figure)
        print(report(args.report), end="")
        return
    if args.stage == "_simulate_one":
        one_simulation(args.cells[0], args.out)
        return
    if args.stage == "_fit_one":
        one_fit_series(
            args.cells[0],
            args.epochs,
            args.epsilons,
            args.out,
            args.backed,
            args.source,
            (args.private_lr, args.cluster_private_lr),
            scope=args.scope,
            optimizer=args.optimizer,
        )
        return
    env = {**os.environ, "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}
    for n in args.cells:
        command = [sys.executable, __file__, f"_{args.stage}_one", "--cells", str(n), "--out", args.out]
        if args.stage == "fit":
            command += ["--epochs", str(args.epochs), "--epsilons", *map(str, args.epsilons)]
            command += ["--backed"] if args.backed else []
            command += ["--scope", args.scope, "--optimizer", args.optimizer]
            for flag in ("private_lr", "cluster_private_lr", "source"):
                if getattr(args, flag) is not None:
                    command += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
        subprocess.run(command, check=True, env=env)


if __name__ == "__main__":
    main()
