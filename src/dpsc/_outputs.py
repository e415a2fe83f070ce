"""Where released results land in an AnnData: one naming rule and the writers that follow it.

scanpy's rule, applied to every output: a tool's ``key_added`` names what it writes. The main
result takes ``key_added`` itself (an ``obs`` column of labels, an ``obsm`` embedding, an ``uns``
table); each further output takes the stem of ``key_added`` (the name without scanpy's ``X_``
embedding prefix) and a suffix saying what it holds, so two runs with different keys never
overwrite each other and a user's own scanpy results (``obsm["X_pca"]``, ``varm["PCs"]``,
``var["highly_variable"]``, ``uns["rank_genes_groups"]``) stay untouched unless a function
writing exactly those is called with its default key (:func:`dpsc.pp.pca`,
:func:`dpsc.pp.highly_variable_genes`, :func:`dpsc.tl.rank_genes_groups`).

Everything here is post-processing of released values (and of each cell's own row for its label
and projection, written to that cell's own AnnData): no privacy cost. The central tools and the
federated site (:mod:`dpsc.federated._site`) share these writers, so both write the same keys.
"""

from __future__ import annotations

import anndata as ad
import numpy as np
import pandas as pd

from .methods import markers as mechanism
from .methods.cluster_plan import ClusterPlan
from .methods.clustering import ClusterResult, first_marker_ranking, scheduled


def stem(key_added: str) -> str:
    """Return ``key_added`` without scanpy's ``X_`` embedding prefix (``"X_dpdcan"`` → ``"dpdcan"``)."""
    return key_added[2:] if key_added.startswith("X_") and len(key_added) > 2 else key_added


def derived_key(key_added: str, what: str) -> str:
    """Return the name of a further output of the tool run under ``key_added``: ``f"{stem}_{what}"``."""
    return f"{stem(key_added)}_{what}"


def embedding_key(key_added: str) -> str:
    """Return the ``obsm`` key of an embedding written under ``key_added``: ``f"X_{stem}"``.

    ``sc.pl.embedding(adata, basis=stem)`` and ``sc.pp.neighbors(adata, use_rep=...)`` read it.
    """
    return f"X_{stem(key_added)}"


def write_clustering(
    target: ad.AnnData, matrix, result: ClusterResult, key_added: str, n_clusters: int
) -> None:
    """Write a released clustering and each cell's projection and label into ``target``.

    ``obs[key_added]`` (labels), ``obsm[f"X_{key_added}"]`` (the k-means points' projections),
    ``varm[f"{key_added}_loadings"]`` (zero rows for genes not read), ``var[f"{key_added}_gene"]``
    (the genes read) and, when the genes were selected privately, the noisy
    ``var[f"{key_added}_means"]`` and ``var[f"{key_added}_variances"]``.
    """
    n_vars = target.n_vars
    loadings = np.zeros((n_vars, result.loadings.shape[1]))
    loadings[result.genes] = result.loadings
    read = np.zeros(n_vars, dtype=bool)
    read[result.genes] = True
    target.obsm[embedding_key(key_added)] = result.projections(matrix)
    target.varm[derived_key(key_added, "loadings")] = loadings
    target.var[derived_key(key_added, "gene")] = read
    if result.gene_means is not None:
        target.var[derived_key(key_added, "means")] = result.gene_means
        target.var[derived_key(key_added, "variances")] = result.gene_variances
    target.obs[key_added] = cluster_labels(result.labels(matrix), n_clusters)


def cluster_labels(labels: np.ndarray, n_clusters: int) -> pd.Categorical:
    """Each cell's cluster (integers ``0 … n_clusters-1``) as ``obs`` holds it: clusters with cells only.

    Categories ``"0"`` … in cluster order, those no cell is nearest left out, as scanpy's own
    clusterings are (its plots read one group per category). Which clusters hold a cell is read
    from the labels written for these cells, which no ε covers; every release keeps all
    ``n_clusters`` rows (the record's ``n_clusters`` names them).
    """
    codes = np.asarray(labels, dtype=np.int64)
    categorical = pd.Categorical.from_codes(codes, categories=[str(i) for i in range(n_clusters)])
    return categorical.remove_unused_categories()


def write_cluster_markers(
    target: ad.AnnData, result: ClusterResult, plan: ClusterPlan, key_added: str
) -> dict:
    """Write the clusters' released marker table as ``uns[f"{key_added}_markers"]`` (scanpy's format)."""
    names = [str(i) for i in range(plan.n_clusters)]
    ranking = first_marker_ranking(plan, result.marker_table, result.marker_frame)
    table = mechanism.MarkerTable(plan.n_clusters, plan.n_vars, result.marker_frame)
    count_noise = scheduled(plan, "markers").release().noise_std * table.scale("count")
    written = {}
    if result.marker_focus_table is not None:  # the focused table ranks its genes first
        genes = np.asarray(result.marker_focus_genes)
        focused = mechanism.MarkerTable(plan.n_clusters, len(genes), result.marker_focus_frame, columns=genes)
        release = scheduled(plan, "marker_focus").release(genes)
        stats = mechanism.group_statistics(result.marker_focus_table, focused, release)
        ranking = mechanism.focused_result(ranking, mechanism.rank_markers(stats), genes)
        written = {"focus_genes": len(genes), "focus_expression_bound": focused.bounds["sum"]}
    return {
        **write_marker_result(
            target,
            ranking,
            names,
            key_added,
            n_genes=100,
            pts=True,
            layer=None,
            key=derived_key(key_added, "markers"),
            count_noise=count_noise,
            bounds=table.bounds,
        ),
        **written,
    }


def _recarray(values: np.ndarray, names: list[str], dtype: str) -> np.recarray:
    return np.rec.fromarrays(list(values), dtype=[(name, dtype) for name in names])


def _scanpy_result(result, names, var_names, n_genes, groupby, layer, pts: bool, shown) -> dict:
    """Return what :func:`scanpy.tl.rank_genes_groups` writes (method ``"t-test"``, reference ``"rest"``).

    ``shown``: the indices of the groups written (those with cells in ``obs[groupby]``).
    """
    top = result.order[shown, :n_genes]
    names = [names[k] for k in shown]
    pick = lambda values: np.take_along_axis(values[shown], top, axis=1)  # noqa: E731
    out = {
        "params": {
            "groupby": groupby,
            "reference": "rest",
            "method": "t-test",
            "use_raw": False,
            "layer": layer,
            "corr_method": "benjamini-hochberg",
        },
        "names": _recarray(np.asarray(var_names)[top].astype(object), names, "O"),
        "scores": _recarray(pick(result.scores).astype(np.float32), names, "float32"),
        "pvals": _recarray(pick(result.pvals), names, "float64"),
        "pvals_adj": _recarray(pick(result.pvals_adj), names, "float64"),
        "logfoldchanges": _recarray(pick(result.logfoldchanges).astype(np.float32), names, "float32"),
    }
    if pts:
        out["pts"] = pd.DataFrame(result.pts[shown].T, index=var_names, columns=names)
        out["pts_rest"] = pd.DataFrame(result.pts_rest[shown].T, index=var_names, columns=names)
    return out


def write_marker_result(
    target: ad.AnnData,
    result: mechanism.MarkerResult,
    names: list[str],
    groupby: str,
    *,
    n_genes: int | None,
    pts: bool,
    layer: str | None,
    key: str,
    count_noise: float,
    bounds: dict[str, float],
) -> dict:
    """Write a ranked marker result to ``target.uns[key]`` in scanpy's format; return what to record.

    ``count_noise``: the noise sd of the group sizes; a group whose noisy size is below twice it
    has markers that are mostly noise (``groups_below_noise``). ``bounds``: the table's bounds.
    Scanpy's format holds the groups with cells in ``obs[groupby]`` (its plots read each group's
    cells); the record keeps every released group.
    """
    kept = target.n_vars if n_genes is None else min(int(n_genes), target.n_vars)
    shown = list(range(len(names)))
    if groupby in target.obs:
        present = set(target.obs[groupby].dropna().astype(str).unique())
        shown = [k for k, name in enumerate(names) if name in present] or shown
    target.uns[key] = _scanpy_result(result, names, target.var_names, kept, groupby, layer, pts, shown)
    below = [name for name, size in zip(names, result.counts, strict=True) if size < 2 * count_noise]
    return {
        "n_genes": kept,
        "group_sizes": result.counts.tolist(),
        "groups_below_noise": below,
        "expression_bound": bounds["sum"],
        "square_bound": bounds["squares"],
    }
