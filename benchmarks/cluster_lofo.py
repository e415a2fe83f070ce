"""Leave one file out: choose `tl.cluster`'s constants on five labelled files, report the sixth.

For every candidate setting of the design's constants (``CANDIDATES``: the mean direction's
weight in the k-means points, the share of the trace a component must hold for the gene rule, and
a last Lloyd release of the k reduced centroids in the DP k-means)
``tl.cluster`` runs on each of the six labelled count files at each ε (secret noise, ``--runs``
runs) and once without noise. A fold holds one file out: the candidate with the best mean ARI
relative to scanpy over the other five files (every ε) is chosen, and the held-out file's figure
under that candidate is reported. The scanpy reference is the one of the clustering issue:
``filter_genes(min_counts=1)``, ``normalize_total``, ``log1p``, ``highly_variable_genes``
(seurat, ``min(2000, n_vars)`` genes, subset), ``scale``, PCA 32, ``KMeans(k, n_init=10,
random_state=0)``.

    OMP_NUM_THREADS=2 python benchmarks/cluster_lofo.py --data ../shared/data --runs 8 \
        --out benchmarks/results/cluster_lofo.jsonl.gz
    python benchmarks/cluster_lofo.py --report benchmarks/results/cluster_lofo.jsonl.gz
"""

from __future__ import annotations

import itertools
import math
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from cluster_benchmark import FILES, load, per_file_parser, score, write_per_file

from dpsc.methods.cluster_design import KMEANS_PLAN

FILES["cite_cbmc"] = "cite_cbmc_top2000.h5"  # the six labelled count files
CANDIDATES = {
    "refine": {"MEAN_WEIGHT": 0.5, "EDGE_SHARE": 0.02, "REFINE_ROUNDS": 1},  # the shipped design
    "no refine": {"MEAN_WEIGHT": 0.5, "EDGE_SHARE": 0.02, "REFINE_ROUNDS": 0},
    "mean weight 1": {"MEAN_WEIGHT": 1.0, "EDGE_SHARE": 0.02, "REFINE_ROUNDS": 0},
    "edge share 0.01": {"MEAN_WEIGHT": 0.5, "EDGE_SHARE": 0.01, "REFINE_ROUNDS": 0},
    "edge share 0.05": {"MEAN_WEIGHT": 0.5, "EDGE_SHARE": 0.05, "REFINE_ROUNDS": 0},
    # two rounds of the k centroids; between them an empty one re-seeds next to a populated one
    "refine 2": {"MEAN_WEIGHT": 0.5, "EDGE_SHARE": 0.02, "REFINE_ROUNDS": 2},
    # the same, at the shipped number of releases: one Lloyd round of the 4k centroids, two of the k
    "lloyd 1 refine 2": {
        "MEAN_WEIGHT": 0.5,
        "EDGE_SHARE": 0.02,
        "REFINE_ROUNDS": 2,
        "KMEANS_PLAN": {**KMEANS_PLAN, "n_lloyd_rounds": 1},
    },
    # 32 loadings (the reference's number of components) instead of 16
    "comps 32": {"MEAN_WEIGHT": 0.5, "EDGE_SHARE": 0.02, "REFINE_ROUNDS": 1, "N_COMPS": 32},
    # the gene selection ranking the same released statistics by normalised dispersion (seurat
    # flavour) or by variance instead of the second moment (post-processing: no other release)
    "dispersion genes": {
        "MEAN_WEIGHT": 0.5,
        "EDGE_SHARE": 0.02,
        "REFINE_ROUNDS": 1,
        "GENE_RANKING": "dispersion",
    },
    "variance genes": {
        "MEAN_WEIGHT": 0.5,
        "EDGE_SHARE": 0.02,
        "REFINE_ROUNDS": 1,
        "GENE_RANKING": "variance",
    },
}
SHIPPED = "refine"  # the candidate whose constants dpsc.methods.cluster_design holds
ONLY: list[str] = []  # --candidates: the candidates this run makes rows for (empty: all)


def use_constants(constants: dict) -> None:
    """Set the design's constants (module attributes of ``dpsc.methods.cluster_design``) to these values."""
    from dpsc.methods import cluster_design

    for attribute, value in constants.items():
        setattr(cluster_design, attribute, value)


def shipped_constants() -> dict:
    """The shipped values of every constant a candidate sets."""
    from dpsc.methods import cluster_design

    return {name: getattr(cluster_design, name) for constants in CANDIDATES.values() for name in constants}


def scanpy_reference(adata, k: int, seed: int = 0) -> np.ndarray:
    """The non-private reference of the clustering issue (module docstring); ``seed``: k-means'."""
    import scanpy as sc
    from sklearn.cluster import KMeans

    cells = adata.copy()
    sc.pp.filter_genes(cells, min_counts=1)
    sc.pp.normalize_total(cells)
    sc.pp.log1p(cells)
    sc.pp.highly_variable_genes(cells, n_top_genes=min(2000, cells.n_vars), subset=True)
    sc.pp.scale(cells)
    sc.pp.pca(cells, n_comps=32)
    return KMeans(k, n_init=10, random_state=seed).fit_predict(cells.obsm["X_pca"])


def labelled_file(data: Path, name: str) -> tuple:
    """A labelled file, its labels, k (the number of labels) and scanpy's scores on it."""
    adata = load(data, name)
    truth = adata.obs["label"].to_numpy()
    k = len(np.unique(truth))
    return adata, truth, k, score(truth, scanpy_reference(adata, k))


def run(data: Path, name: str, epsilons: list[float], runs: int, commit: str) -> list[dict]:
    import dpsc

    adata, truth, k, reference = labelled_file(data, name)
    rows = []
    shipped = shipped_constants()
    for candidate, constants in CANDIDATES.items():
        if ONLY and candidate not in ONLY:
            continue
        use_constants({**shipped, **constants})
        for epsilon in [*epsilons, None]:
            for r in range(1 if epsilon is None else runs):
                cells = adata.copy()
                start = time.perf_counter()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    dpsc.tl.cluster(cells, k, epsilon=epsilon)
                row = score(truth, cells.obs["dp_cluster"].to_numpy())
                rows.append(
                    {
                        "dataset": name,
                        "candidate": candidate,
                        "epsilon": "none" if epsilon is None else epsilon,
                        "run": r,
                        **{f"{m}": row[m] for m in ("ari", "nmi", "clusters_used")},
                        "scanpy_ari": reference["ari"],
                        "scanpy_nmi": reference["nmi"],
                        "seconds": time.perf_counter() - start,
                        "source": commit,
                    }
                )
    use_constants(shipped)
    return rows


def report(path: Path) -> str:
    table = pd.read_json(path, lines=True)
    table["epsilon"] = table["epsilon"].astype(str)
    table["ratio"] = table["ari"] / table["scanpy_ari"]
    means = table.groupby(["dataset", "candidate", "epsilon"])[["ari", "ratio", "nmi"]].mean()
    noisy = table[table["epsilon"] != "none"]
    runs = int(noisy.groupby(["dataset", "candidate", "epsilon"]).size().min())
    files = list(dict.fromkeys(table["dataset"]))
    columns = [e for e in ("1.0", "2.0", "4.0", "8.0", "none") if e in set(table["epsilon"])]
    lines = [
        "# `tl.cluster` by leave-one-file-out",
        "",
        "Each row is one fold: the candidate constants chosen on the other five files (best mean",
        "ARI relative to scanpy over them, every ε and no noise), reported on the held-out file.",
        f"Cells: ARI / scanpy's ARI (the held-out file's ARI in brackets), mean over {runs} runs with",
        "secret noise (1 run without noise); the candidates' constants are listed below the tables.",
        "The scanpy reference scales the genes and clusters 32 PCs (the clustering issue's).",
        *noise_rule_text(SHIPPED),
        "",
        *report_commands("cluster_lofo", f" --runs {runs}"),
        "",
        "| held-out file | chosen on the other five | scanpy ARI | "
        + " | ".join(f"ε = {c[:-2]}" if c != "none" else "no noise" for c in columns)
        + " |",
        "|---|---|---|" + "---|" * len(columns),
    ]

    def chosen_for(name: str) -> str:
        others = table[table["dataset"] != name]
        per_run = others[others["epsilon"] != "none"].groupby(["candidate", "run"])["ratio"].mean()
        return fold_choice(others.groupby("candidate")["ratio"].mean(), per_run, SHIPPED)

    held = {}
    for name in files:
        chosen = chosen_for(name)
        cells = []
        for eps in columns:
            value = means.loc[(name, chosen, eps)]
            cells.append(f"{value['ratio']:.2f} ({value['ari']:.3f})")
            held.setdefault(eps, []).append(value["ratio"])
        scanpy = table[table["dataset"] == name]["scanpy_ari"].iloc[0]
        lines.append(f"| {name} | {chosen} | {scanpy:.3f} | " + " | ".join(cells) + " |")
    lines.append(
        "| **mean (lowest)** | | | "
        + " | ".join(f"{np.mean(v):.2f} ({np.min(v):.2f})" for v in held.values())
        + " |"
    )
    chosen = {name: chosen_for(name) for name in files}
    short = [
        name
        for name in files
        if "none" in columns
        and means.loc[(name, chosen[name], "none"), "ari"]
        < table[table["dataset"] == name]["scanpy_ari"].iloc[0] - 0.03
    ]
    choices = sorted(set(chosen.values()))
    noisy_eps = [e for e in columns if e != "none"]
    nmi = noisy.groupby(["dataset", "candidate", "epsilon"])["nmi"].agg(["mean", "std"])
    falls = [
        f"{name} (ε {low[:-2]} → {high[:-2]})"
        for name in files
        for low, high in itertools.pairwise(noisy_eps)
        if nmi.loc[(name, chosen[name], high), "mean"]
        < nmi.loc[(name, chosen[name], low), "mean"]
        - max(nmi.loc[(name, chosen[name], low), "std"], nmi.loc[(name, chosen[name], high), "std"])
    ]
    lines += [
        "",
        (f"Every fold chose {choices[0]!r}." if len(choices) == 1 else f"The folds chose {choices}.")
        + f" Without noise the chosen design is more than 0.03 below scanpy's ARI on {len(short)} of the"
        + f" {len(files)} files{': ' + ', '.join(short) if short else ''}. The held-out NMI is"
        + (
            " non-decreasing in ε on every file (within one sd of the runs)."
            if not falls
            else f" lower at the larger ε by more than one sd of the runs in {', '.join(falls)}."
        ),
        "",
        "Every candidate on every file (ARI / scanpy, mean over runs):",
        "",
    ]
    lines += candidate_table(means["ratio"], columns, columns)
    lines += constants_table(CANDIDATES, table)
    return "\n".join(lines) + "\n"


#: A fold leaves the shipped candidate only for one whose mean on the other five files is higher by
#: more than this many standard errors of the difference (each mean's run-to-run standard error):
#: a constant does not move on noise.
NOISE_MARGIN = 2.0


def fold_choice(mean: pd.Series, per_run: pd.Series, shipped: str) -> str:
    """The candidate a fold chooses: the best ``mean`` (by candidate, on the other five files), unless
    the ``shipped`` one is within :data:`NOISE_MARGIN` standard errors of it (``per_run``: the same
    mean for each candidate and run)."""
    best = mean.idxmax()
    if best == shipped or shipped not in mean:
        return best
    error = per_run.groupby("candidate").std() / np.sqrt(per_run.groupby("candidate").size())
    margin = NOISE_MARGIN * math.hypot(error[best], error[shipped])
    return best if mean[best] - mean[shipped] > margin else shipped


def noise_rule_text(shipped: str) -> list[str]:
    """The report's sentence on :func:`fold_choice`."""
    return [
        f"A fold leaves the shipped candidate ({shipped}) only for one whose mean on the other five files",
        f"is higher by more than {NOISE_MARGIN:g} standard errors of the difference (the run-to-run noise",
        "of the two means): a constant does not move on noise.",
    ]


def constants_table(candidates: dict, table: pd.DataFrame) -> list[str]:
    """The candidates with rows in ``table``, as Markdown: one row each, one column per constant."""
    candidates = {name: candidates[name] for name in dict.fromkeys(table["candidate"])}
    constants = list(dict.fromkeys(name for values in candidates.values() for name in values))

    def shown(value) -> str:
        if isinstance(value, dict):
            return ", ".join(f"{key} {shown(item)}" for key, item in value.items())
        return f"{value:.3g}" if isinstance(value, float) else str(value)

    lines = ["| candidate | " + " | ".join(f"`{c}`" for c in constants) + " |"]
    lines.append("|---|" + "---|" * len(constants))
    for candidate, values in candidates.items():
        cells = [shown(values[c]) if c in values else "—" for c in constants]
        lines.append(f"| {candidate} | " + " | ".join(cells) + " |")
    return ["", "The candidates' constants:", "", *lines]


def held_out_header(epsilons: list) -> list[str]:
    """Markdown header rows of a held-out table with one column per ε."""
    return [
        "| held-out file | chosen on the other five | " + " | ".join(f"ε = {e:g}" for e in epsilons) + " |",
        "|---|---|" + "---|" * len(epsilons),
    ]


def report_commands(script: str, options: str = "") -> list[str]:
    """Markdown lines of the two commands that make a leave-one-file-out report (run, then report)."""
    return [
        "```",
        f"OMP_NUM_THREADS=2 python benchmarks/{script}.py --data ../shared/data{options} \\",
        f"    --out benchmarks/results/{script}.jsonl.gz",
        f"python benchmarks/{script}.py --report benchmarks/results/{script}.jsonl.gz",
        "```",
    ]


def held_out_rows(files: list[str], epsilons: list, chosen_for, cell) -> list[str]:
    """Markdown rows of a leave-one-file-out table, its mean (lowest) row and what the folds chose.

    ``chosen_for(name)``: the candidate chosen without file ``name``; ``cell(name, candidate, eps)``:
    the held-out value and its text.
    """
    held: dict = {}
    choices = set()
    lines = []
    for name in files:
        chosen = chosen_for(name)
        choices.add(chosen)
        cells = []
        for eps in epsilons:
            value, text = cell(name, chosen, eps)
            cells.append(text)
            held.setdefault(eps, []).append(value)
        lines.append(f"| {name} | {chosen} | " + " | ".join(cells) + " |")
    lines.append(
        "| **mean (lowest)** | | "
        + " | ".join(f"{np.mean(v):.2f} ({np.min(v):.2f})" for v in held.values())
        + " |"
    )
    agree = (
        f"Every fold chose {choices.pop()!r}." if len(choices) == 1 else f"The folds chose {sorted(choices)}."
    )
    return [*lines, "", agree]


def candidate_table(ratio: pd.Series, columns: list, headers: list[str]) -> list[str]:
    """Markdown rows of every candidate on every file: ``ratio`` indexed (file, candidate, ε)."""
    pivot = ratio.unstack("epsilon")[columns]
    lines = ["| file | candidate | " + " | ".join(headers) + " |", "|---|---|" + "---|" * len(columns)]
    for (name, candidate), values in pivot.iterrows():
        lines.append(f"| {name} | {candidate} | " + " | ".join(f"{v:.2f}" for v in values) + " |")
    return lines


def lofo_main(doc: str, out: str, report, run, only: list[str]) -> None:
    """Command line of a leave-one-file-out run: ``--report``, or the rows of ``--candidates`` (all)."""
    parser = per_file_parser(doc, out)
    parser.add_argument(
        "--candidates", nargs="+", default=None, help="Run only these candidates (add rows with --append)."
    )
    args = parser.parse_args()
    only.extend(args.candidates or [])
    if args.report:
        print(report(args.report), end="")
        return
    warnings.filterwarnings("ignore")
    write_per_file(args, run)


def main() -> None:
    lofo_main(__doc__, "benchmarks/results/cluster_lofo.jsonl.gz", report, run, ONLY)


if __name__ == "__main__":
    main()
