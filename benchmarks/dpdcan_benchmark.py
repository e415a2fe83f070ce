"""DP-DCAN benchmark: clustering quality, privacy spent, wall time and memory.

Every fit runs in its own subprocess (peak RSS is that fit's). Results are appended to a JSON
lines file as they finish; ``--report`` turns them into markdown (``compare_runs.py`` sets two
results files side by side). Each row records the git commit its code came from. The final
model is scored; labels are used for scoring only.

Usage (from the repo root)::

    # the main job on count matrices as they come (all genes, no filtering), secret noise
    python benchmarks/dpdcan_benchmark.py --data ../shared/data --seeds 0 1 2 \
        --datasets bladder_all bladder paul pancreas --configs "DP-DCAN eps=8" \
        "DPE-DCAN eps=8 (full)" "DP-DCAN eps=4" "DPE-DCAN eps=4 (full)" "scanpy PCA+KMeans" \
        --noise secret --out benchmarks/results/raw_matrix.jsonl

    python benchmarks/dpdcan_benchmark.py --data ../shared/data --seeds 0 1 2 \
        --datasets pbmc goolam biase yan bladder --out benchmarks/results/dpdcan.jsonl
    python benchmarks/dpdcan_benchmark.py --report benchmarks/results/dpdcan.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import subprocess
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import numpy as np

DATASETS = {
    # name: (file, likelihood, preprocessing)
    "pbmc": ("pbmc_10x_4k_top2000.h5", "zinb", "counts"),
    "bladder": ("mouse_bladder_top2000.h5", "zinb", "counts"),
    "goolam": ("goolam_hvg2000_lognorm.h5", "gaussian", "as given (log-normalised)"),
    "biase": ("biase_hvg2000_lognorm.h5", "gaussian", "as given (log-normalised)"),
    "yan": ("yan_rpkm.h5", "gaussian", "log1p(RPKM), top 2000 genes by variance"),
    "bladder_all": ("mouse_bladder_2100cells_allgenes.h5", "zinb", "counts, all genes as they come"),
    "paul": ("paul15_bone_marrow_counts.h5ad", "zinb", "counts, all genes as they come"),
    "pancreas": ("pancreas_endocrinogenesis_counts.h5ad", "zinb", "counts as they come"),
    "bladder_2100": (
        "mouse_bladder_top2000.h5",
        "zinb",
        "counts, 2100 random cells (as many as bladder_all)",
    ),
}
#: Data sets that are a random subset of another's cells (drawn once, fixed seed, labels unread):
#: the top-2000 bladder file at the all-genes file's 2100 cells, so that the all-genes ratio
#: compares gene sets at one n.
SUBSAMPLED = {"bladder_2100": 2100}
AS_THEY_COME = {"bladder_all", "paul", "pancreas", "bladder_2100"}  # no filter before the fit
TOP_GENES_OF = {"bladder_all": ["bladder", "bladder_2100"]}  # all-genes file: its top-2000 versions
# Settings that rows of the committed tables ran with, named by what they are. A row's label is
# its configuration's name: no suffix = the package defaults; a suffix names what differs.
PLAIN_KMEANS_START = {  # k centroids, no oversampling: 20 sketch + 4 x 10 Lloyd releases
    "n_sketch_steps": 20,
    "steps_per_round": 10,
    "kmeans_kwargs": {"n_bits": 5, "oversampling": 1, "count_scale": 1.0},
}
UNIFORM_TARGET = {"target_frequency": "uniform"}  # DEC target without cluster frequencies (f = 1)
PLAIN_START_UNIFORM_TARGET = {**PLAIN_KMEANS_START, **UNIFORM_TARGET}
OVERSAMPLED_KMEANS = {  # the default start: 3k Lloyd centroids reduced to k, 200 releases
    "n_sketch_steps": 40,
    "steps_per_round": 40,
    "kmeans_kwargs": {"n_bits": 6, "oversampling": 3, "count_scale": 0.3},
}
FROZEN = {"cluster_train_encoder": False}  # cluster stage trains centroids (and decoder) only
CLUSTER_LR_01 = {"cluster_private_lr": 0.1}  # private cluster-stage learning rate 0.1 (default 0.01)
PRIVATE_CONFIGS = {
    "DP-DCAN eps=8": {"epsilon": 8.0, "scope": "encoder"},
    "DP-DCAN eps=6": {"epsilon": 6.0, "scope": "encoder"},
    "DP-DCAN eps=4": {"epsilon": 4.0, "scope": "encoder"},
    "DPE-DCAN eps=8 (full)": {"epsilon": 8.0, "scope": "full"},
}
VARIANTS = {  # label suffix: settings that differ from the defaults
    "plain start, uniform target": PLAIN_START_UNIFORM_TARGET,
    "plain start, uniform target, cluster lr 0.1": {**PLAIN_START_UNIFORM_TARGET, **CLUSTER_LR_01},
    "uniform target": UNIFORM_TARGET,
    "plain k-means start": PLAIN_KMEANS_START,
    "plain start, uniform target, frozen encoder": {**PLAIN_START_UNIFORM_TARGET, **FROZEN},
    "uniform target, frozen encoder": {**UNIFORM_TARGET, **FROZEN},
}
CONFIGS = {
    "DCAN (non-private)": {"epsilon": None, "scope": "encoder"},
    "DCAN (non-private), uniform target": {"epsilon": None, "scope": "encoder", **UNIFORM_TARGET},
    **PRIVATE_CONFIGS,
    **{
        f"{name}, {suffix}": {**cfg, **extra}
        for suffix, extra in VARIANTS.items()
        for name, cfg in PRIVATE_CONFIGS.items()
    },
}
DIAGNOSTIC_CONFIGS = {  # where the loss is: the private instance stage + DP k-means start alone
    f"DP-DCAN eps={eps:g}, no cluster stage": {"epsilon": eps, "scope": "encoder", "cluster_epochs": 0}
    for eps in (8.0, 4.0)
} | {
    "DP-DCAN eps=8, plain k-means start, no cluster stage": {
        "epsilon": 8.0,
        "scope": "encoder",
        "cluster_epochs": 0,
        **PLAIN_KMEANS_START,
    }
}
SIGN_CONFIGS = {  # update rule of the private parameters (same sigma, q, steps for all)
    f"DP-DCAN eps={eps:g} {opt}": {"epsilon": eps, "scope": "encoder", "optimizer": opt}
    for eps in (8.0, 6.0, 4.0)
    for opt in ("adam", "dpsignsgd", "dpsignadam")
} | {  # the full grid, run with the plain start and uniform target (SGD at cluster lr 0.1)
    f"DP-DCAN eps={eps:g} {opt}, plain start, uniform target"
    + (", cluster lr 0.1" if opt == "sgd" else ""): {
        "epsilon": eps,
        "scope": "encoder",
        "optimizer": opt,
        **PLAIN_START_UNIFORM_TARGET,
        **(CLUSTER_LR_01 if opt == "sgd" else {}),
    }
    for eps in (8.0, 4.0, 2.0, 1.0)
    for opt in ("sgd", "adam", "dpsignsgd", "dpsignadam")
}
RAW_MATRIX_CONFIGS = {"DPE-DCAN eps=4 (full)": {"epsilon": 4.0, "scope": "full"}}
ALL_CONFIGS = {**CONFIGS, **DIAGNOSTIC_CONFIGS, **SIGN_CONFIGS, **RAW_MATRIX_CONFIGS}
PAPER = {  # DP-DCAN paper, Table 2/5 (PBMC), best-epoch selection against labels
    ("pbmc", "DP-DCAN eps=8"): "70.87 / 72.53",
    ("pbmc", "DP-DCAN eps=6"): "68.12 / 72.53",
    ("pbmc", "DP-DCAN eps=4"): "59.78 / 67.93",
}


def train_defaults() -> dict:
    """What a fit without options uses: ``DPDCAN.train``'s arguments, plan and k-means options, flat."""
    import inspect

    from dpsc.model import DEFAULT_KMEANS_OPTIONS, DEFAULT_PLAN_OPTIONS, DPDCAN
    from dpsc.model._dcan_privacy import TrainSettings

    arguments = {name: p.default for name, p in inspect.signature(DPDCAN.train).parameters.items()}
    arguments["instance_epochs"], arguments["cluster_epochs"] = TrainSettings().epochs()  # 50 + 40
    return {**arguments, **DEFAULT_PLAN_OPTIONS, **DEFAULT_KMEANS_OPTIONS}


def train_options(config: dict) -> dict:
    """``tl.fit`` keywords from a flat config: plan and k-means options grouped as ``train`` takes them."""
    from dpsc.model import DEFAULT_KMEANS_OPTIONS, DEFAULT_PLAN_OPTIONS

    out, plan, kmeans = {}, {}, dict(config.get("kmeans_kwargs", {}))
    for key, value in config.items():
        if key in DEFAULT_PLAN_OPTIONS:
            plan[key] = value
        elif key in DEFAULT_KMEANS_OPTIONS:
            kmeans[key] = value
        elif key != "kmeans_kwargs":
            out[key] = value
    return {**out, **({"plan_kwargs": plan} if plan else {}), **({"kmeans_kwargs": kmeans} if kmeans else {})}


def load(name: str, data_dir: Path):
    """AnnData for a benchmark data set: labels in ``obs["label"]``; cells with no signal and
    all-zero genes removed, except for the files of :data:`AS_THEY_COME`."""
    import anndata as ad
    import scanpy as sc
    import scipy.sparse as sp

    import dpsc

    file, _, _ = DATASETS[name]
    if file.endswith(".h5ad"):
        adata = ad.read_h5ad(data_dir / file)
        adata.obs["label"] = adata.obs.pop("cell_type").astype(str)
    else:
        adata = dpsc.datasets.read_h5(data_dir / file)
    if name in SUBSAMPLED:
        keep = np.random.default_rng(0).choice(adata.n_obs, SUBSAMPLED[name], replace=False)
        adata = adata[np.sort(keep)].copy()
    if name in AS_THEY_COME:
        return adata
    if name == "yan":
        x = np.log1p(adata.X.toarray())
        top = np.sort(np.argsort(-x.var(0))[:2000])
        adata = adata[:, top].copy()
        adata.X = sp.csr_matrix(x[:, top])
    sc.pp.filter_genes(adata, min_counts=1e-9)
    sc.pp.filter_cells(adata, min_counts=1e-9)
    return adata


def source_commit(package: Path) -> str:
    """The git commit a fit's dpsc package and this script came from (``+modified`` when either
    differs from it), or ``unknown`` outside a git checkout; rows of several commits stay apart."""
    git = ["git", "-C", str(package)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False)
    if head.returncode != 0:
        return "unknown"
    paths = [str(package), str(Path(__file__).resolve())]
    changed = subprocess.run(
        [*git, "status", "--porcelain", "--", *paths], capture_output=True, text=True, check=False
    )
    return head.stdout.strip() + ("+modified" if changed.stdout.strip() else "")


def run_one(args: argparse.Namespace) -> dict:
    """One fit, in this process; returns the result row."""
    import torch
    from sklearn.cluster import KMeans
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

    import dpsc

    torch.set_num_threads(args.threads)
    adata = load(args.dataset, Path(args.data))
    k = adata.obs["label"].nunique()
    truth = adata.obs["label"].astype(str).to_numpy()
    row = {
        "dataset": args.dataset,
        "config": args.config,
        "seed": args.seed,
        "n_obs": adata.n_obs,
        "n_vars": adata.n_vars,
        "k": k,
        "host": f"{platform.node()} ({os.cpu_count()} CPUs), torch {torch.__version__}",
        "threads": args.threads,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "source": source_commit(Path(dpsc.__file__).parent),
    }
    start = time.perf_counter()
    if args.config.startswith("scanpy"):
        import scanpy as sc

        sc.pp.filter_genes(adata, min_counts=1e-9)  # scanpy's usual first step (no-op when filtered)

        if DATASETS[args.dataset][1] == "zinb":
            sc.pp.normalize_total(adata, target_sum=1e4)
            sc.pp.log1p(adata)
        sc.pp.pca(adata, n_comps=min(32, adata.n_obs - 1, adata.n_vars - 1), random_state=args.seed)
        if "Leiden" in args.config:
            sc.pp.neighbors(adata, random_state=args.seed)
            sc.tl.leiden(adata, random_state=args.seed, flavor="igraph", n_iterations=2)
            pred = adata.obs["leiden"].astype(str).to_numpy()
        else:
            pred = KMeans(k, n_init=10, random_state=args.seed).fit_predict(adata.obsm["X_pca"]).astype(str)
        row.update(epsilon=None, wall_s=time.perf_counter() - start)
    else:
        cfg = ALL_CONFIGS[args.config]
        noise = {"noise_seed": args.seed} if args.noise == "seeded" else {}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            dpsc.tl.fit(
                adata,
                epsilon=cfg["epsilon"],
                scope=cfg["scope"],
                optimizer=cfg.get("optimizer", "sgd"),
                **train_options(
                    {key: value for key, value in cfg.items() if key not in ("epsilon", "scope", "optimizer")}
                ),
                n_clusters=k,
                likelihood=DATASETS[args.dataset][1],
                random_state=args.seed,
                progress_bar=False,
                **noise,  # seeded: repeatable tables, the guarantee does not hold against the seed
            )
        row["wall_s"] = time.perf_counter() - start
        row["noise"] = args.noise
        row["genes_selected"] = adata.uns["dpsc"]["X_dpdcan"]["params"]["genes_selected"]
        row["collapse_warning"] = any("clusters hold" in str(w.message) for w in caught)
        row["clusters_in_use"] = int(adata.uns["dpsc"]["X_dpdcan"]["clusters_in_use"])  # released
        pred = adata.obs["dp_cluster"].astype(str).to_numpy()
        rec = adata.uns["dpsc"]["X_dpdcan"]["privacy"]
        row.update(
            epsilon=None if np.isnan(rec["epsilon"]) else rec["epsilon"],
            target_epsilon=cfg["epsilon"],
            noise_multiplier=rec["noise_multiplier"],
            steps=rec["steps"],
            sample_rate=rec["sample_rate"],
        )
    row["ari"] = float(adjusted_rand_score(truth, pred))
    row["nmi"] = float(normalized_mutual_info_score(truth, pred))
    row["n_clusters_found"] = len(set(pred))
    row["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return row


def _place(row) -> str:
    """Where one fit ran: its GPU's model name, or "<n> CPUs" (rows written before the host was
    recorded came from the 2-CPU development machine)."""
    device = row.get("device")
    if isinstance(device, str) and device != "cpu":
        return device.split()[1] if device.startswith("NVIDIA") else device
    host = row.get("host")
    match = re.search(r"\((\d+) CPUs\)", host) if isinstance(host, str) else None
    return f"{match.group(1)} CPUs" if match else "2 CPUs"


def _ran_on(group) -> str:
    """Count of fits per place; wall times are only comparable within one place."""
    places = group.apply(_place, axis=1)
    return "; ".join(f"{name} ×{n}" for name, n in places.value_counts(sort=False).items())


def _config_order(config: str) -> int:
    order = list(ALL_CONFIGS)
    return order.index(config) if config in order else len(order)


def report(path: Path) -> str:
    """Markdown tables (mean ± sd over seeds) from a results file."""
    import pandas as pd

    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    df = pd.DataFrame(rows)
    out = [
        "# DP-DCAN benchmark results",
        "",
        "Final model of each fit (no label-based epoch or checkpoint selection). "
        "ARI/NMI: mean ± sd over seeds (n = seeds run).",
        "Paper column: DP-DCAN Table 2/5 (ARI / NMI ×100), whose scripts report the best epoch "
        "against the true labels.",
        "",
    ]
    for name, group in df.groupby("dataset", sort=False):
        g0 = group.iloc[0]
        out += [
            f"## {name} ({g0['n_obs']} cells × {g0['n_vars']} genes, {g0['k']} types; {DATASETS[name][2]})",
            "",
            "| method | ARI | NMI | ε spent | seeds | wall s | peak RSS MB | ran on | paper ARI / NMI |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        configs = sorted(group["config"].unique(), key=_config_order)
        for cfg in configs:
            g = group[group["config"] == cfg]
            eps = g["epsilon"].dropna()
            ari = f"{g.ari.mean():.3f} ± {g.ari.std(ddof=0):.3f}"
            nmi = f"{g.nmi.mean():.3f} ± {g.nmi.std(ddof=0):.3f}"
            spent = f"{eps.max():.3f}" if len(eps) else "—"
            cost = f"{g.wall_s.mean():.0f} | {g.peak_rss_mb.max():.0f} | {_ran_on(g)}"
            out.append(
                f"| {cfg} | {ari} | {nmi} | {spent} | {len(g)} | {cost} | {PAPER.get((name, cfg), '')} |"
            )
        out += _collapse_line(group)
        timed = group[group.apply(_place, axis=1) == "2 CPUs"]  # sequential runs, one machine
        base = timed[timed.config == "DCAN (non-private), uniform target"].set_index("seed").wall_s
        # the learning rate does not change the cost; the cluster-lr-0.1 rows ran beside DCAN's
        dp = timed[timed.config == "DP-DCAN eps=8, plain start, uniform target, cluster lr 0.1"]
        dp = (dp if len(dp) else timed[timed.config == "DP-DCAN eps=8"]).set_index("seed").wall_s
        common = base.index.intersection(dp.index)
        if len(common):
            ratios = (dp[common] / base[common]).round(2).tolist()
            out += [
                "",
                "DP/non-DP wall-time ratio (DP-DCAN ε=8 vs DCAN, same epochs, same seed, 2-CPU "
                f"development machine, fits sharing it, so indicative only): {ratios}",
            ]
        out.append("")
    out += _all_genes_ratios(df)
    return "\n".join(out)


def _collapse_line(group) -> list[str]:
    """Fits that used fewer than half of the asked clusters, and how many of them said so.

    Rows with ``clusters_in_use`` had the note that reads the released label counts; rows without
    it, the note that read the soft cluster frequencies.
    """
    if "collapse_warning" not in group:
        return []
    fits = group[group["collapse_warning"].notna()]
    # rows whose note read the released counts (none before that note existed)
    counted = (
        fits["clusters_in_use"].notna().to_numpy() if "clusters_in_use" in fits else np.zeros(len(fits), bool)
    )
    lines = [""]
    for note, rows in (("released label counts", fits[counted]), ("soft frequencies", fits[~counted])):
        if len(rows):
            few = rows[rows["n_clusters_found"] < rows["k"] / 2]
            warned = rows["collapse_warning"].astype(bool)
            lines.append(
                f"Note on the {note}: fits using fewer than half of the asked clusters {len(few)} of "
                f"{len(rows)}, warned {int(warned[few.index].sum())}; warned in all {int(warned.sum())}."
            )
    return lines


def _all_genes_ratios(df) -> list[str]:
    """Mean ARI on an all-genes file over the same configuration's mean on its top-2000 version."""
    lines = []
    for all_genes, tops in TOP_GENES_OF.items():
        for top in tops:
            if not {all_genes, top} <= set(df["dataset"]):
                continue
            means = (
                df[df["dataset"].isin([all_genes, top])]
                .groupby(["config", "dataset"])["ari"]
                .mean()
                .unstack()
            )
            means = means.dropna()
            lines += [f"## {all_genes} / {top}: mean ARI ratio per configuration", ""]
            lines += [
                f"- {cfg}: {row[all_genes]:.3f} / {row[top]:.3f} = {row[all_genes] / row[top]:.2f}"
                for cfg, row in means.iterrows()
            ]
            lines.append("")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", default="../shared/data")
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS))
    parser.add_argument("--configs", nargs="+", default=[*CONFIGS, "scanpy PCA+KMeans", "scanpy PCA+Leiden"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--noise",
        choices=["secret", "seeded"],
        default="seeded",
        help="DP noise from the secret source, or seeded by the fit's seed (repeatable tables)",
    )
    parser.add_argument("--out", default="benchmarks/results/dpdcan.jsonl")
    parser.add_argument(
        "--jobs", type=int, default=1, help="fits run at the same time (wall times then share the CPU)"
    )
    parser.add_argument("--todo", help="file of fits to run, one 'dataset seed config' per line")
    parser.add_argument("--report")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dataset", help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.report:
        print(report(Path(args.report)))
        return
    if args.one:
        print("RESULT " + json.dumps(run_one(args)), flush=True)
        return
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    todo = [(d, seed, c) for d in args.datasets for seed in args.seeds for c in args.configs]
    if args.todo:  # an explicit list of fits, one "dataset seed config" per line
        todo = [
            (ln.split(maxsplit=2)[0], int(ln.split()[1]), ln.split(maxsplit=2)[2])
            for ln in Path(args.todo).read_text().splitlines()
            if ln.strip()
        ]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:  # each fit is its own subprocess
        futures = {pool.submit(_run_subprocess, args, *job): job for job in todo}
        for future in as_completed(futures):  # rows are written as fits finish
            dataset, seed, config = futures[future]
            proc = future.result()
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
            if proc.returncode != 0 or not lines:
                print(
                    f"FAILED {dataset} {config} {seed}:\n{proc.stderr[-2000:]}", file=sys.stderr, flush=True
                )
                continue
            row = json.loads(lines[-1][7:])
            with out.open("a") as fh:
                fh.write(json.dumps(row) + "\n")
            print(
                f"{dataset:8s} seed={seed} {config:24s} ARI={row['ari']:.3f} NMI={row['nmi']:.3f} "
                f"eps={row.get('epsilon')} t={row['wall_s']:.0f}s",
                flush=True,
            )


def _run_subprocess(
    args: argparse.Namespace, dataset: str, seed: int, config: str
) -> subprocess.CompletedProcess:
    """Run one fit in a fresh interpreter (so peak RSS and thread settings are its own)."""
    cmd = [sys.executable, __file__, "--one", "--data", args.data, "--dataset", dataset, "--config", config]
    cmd += ["--seed", str(seed), "--threads", str(args.threads), "--noise", args.noise]
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


if __name__ == "__main__":
    main()
