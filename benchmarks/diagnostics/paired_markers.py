"""The frame of the paired marker diagnostics: one release per run, ranked several ways.

``paired_rows`` runs ``dpsc.tl.rank_genes_groups`` once per grouping, ε and run on one labelled
file (groups: the true labels and ``tl.cluster``'s clusters at ε = 8), hands each release to the
diagnostic's ``score_variants`` (the first table, over every gene; the results in
``benchmarks/results`` ran before the focused second table existed) and scores every variant by
the overlap of each group's top 10 genes with scanpy's t-test (groups of at least 2 % of the
cells). ``variant_tables`` writes the per-file and mean tables of such rows.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cluster_benchmark import load
from markers_benchmark import SMALL, compare, reference

#: score_variants(released, table, release, cells, codes) -> {variant: groups × genes scores}
ScoreVariants = Callable[..., dict[str, np.ndarray]]


def paired_rows(
    data: Path, name: str, epsilons: list[float], runs: int, commit: str, score_variants: ScoreVariants
) -> list[dict]:
    """Rows of one file: the top-10 overlap per grouping, ε, run and variant (one release per run)."""
    import dpsc
    from dpsc.methods import _markers

    warnings.filterwarnings("ignore")
    adata = load(data, name)
    adata.obs["labels"] = adata.obs["label"].astype("category")
    dpsc.tl.cluster(adata, adata.obs["label"].nunique(), epsilon=8.0, noise_seed=0)
    captured, statistics_of = {}, _markers.group_statistics

    def capture(*args):
        captured.setdefault("args", args)  # the first table's (over every gene), not the focused one's
        return statistics_of(*args)

    rows = []
    for grouping in ("labels", "dp_cluster"):
        sizes = adata.obs[grouping].value_counts()
        cells = adata[adata.obs[grouping].isin(sizes.index[sizes >= 2])].copy()
        cells.obs[grouping] = cells.obs[grouping].cat.remove_unused_categories()
        shares = cells.obs[grouping].value_counts() / cells.n_obs
        ref = reference(cells, grouping)
        names, genes = [str(c) for c in cells.obs[grouping].cat.categories], np.asarray(cells.var_names)
        codes = cells.obs[grouping].cat.codes.to_numpy().astype(np.int64)
        for epsilon in epsilons:
            for r in range(runs):
                captured.clear()
                _markers.group_statistics = capture
                dpsc.tl.rank_genes_groups(cells.copy(), grouping, epsilon=epsilon, n_genes=None)
                _markers.group_statistics = statistics_of
                for variant, scores in score_variants(*captured["args"], cells, codes).items():
                    order = np.argsort(-scores, axis=1, kind="stable")
                    ours = {
                        "names": {g: genes[order[k]] for k, g in enumerate(names)},
                        "scores": {g: scores[k][order[k]] for k, g in enumerate(names)},
                    }
                    kept = [row for row in compare(ours, ref) if shares.get(row["group"], 0.0) >= SMALL]
                    rows.append(
                        {
                            "dataset": name,
                            "grouping": grouping,
                            "epsilon": epsilon,
                            "run": r,
                            "variant": variant,
                            "top10": float(np.mean([row["top10"] for row in kept])),
                            "source": commit,
                        }
                    )
    return rows


def variant_tables(path: Path, variants: list[str], digits: int = 3) -> list[str]:
    """The per-file table (groups, ε, file × variant) and the mean over the files, as markdown lines."""
    table = pd.read_json(path, lines=True)
    cells = table.groupby(["grouping", "epsilon", "dataset", "variant"], sort=False).top10.mean()
    wide = cells.unstack("variant")[variants]
    figures = lambda values: " | ".join(f"{v:.{digits}f}" for v in values)  # noqa: E731
    lines = ["| groups | ε | file | " + " | ".join(variants) + " |", "|" + "---|" * (len(variants) + 3)]
    for (grouping, epsilon, name), values in wide.iterrows():
        lines.append(f"| {grouping} | {epsilon:g} | {name} | {figures(values)} |")
    means = wide.groupby(level=["grouping", "epsilon"]).mean()
    lines += ["", "Mean over the files:", "", "| groups | ε | " + " | ".join(variants) + " |"]
    lines.append("|" + "---|" * (len(variants) + 2))
    for (grouping, epsilon), values in means.iterrows():
        lines.append(f"| {grouping} | {epsilon:g} | {figures(values)} |")
    return lines
