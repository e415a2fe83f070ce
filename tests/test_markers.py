"""Private marker genes: the bound of one cell, scanpy's format and statistics, the ledger."""

from __future__ import annotations

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scanpy as sc
import scipy.sparse as sp

import dpsc
from dpsc.privacy import _markers as mechanism


@pytest.fixture
def grouped(small_adata):
    adata = small_adata.copy()
    rng = np.random.default_rng(0)
    adata.obs["group"] = pd.Categorical(rng.choice(["a", "b", "c"], adata.n_obs), categories=["a", "b", "c"])
    X = adata.X.toarray()
    X[adata.obs["group"] == "a", :5] += 30  # genes 0-4 mark group a
    adata.X = sp.csr_matrix(X)
    return adata


def test_one_cell_moves_the_table_by_at_most_the_sensitivity():
    """Adding any one cell, however extreme, to any group changes the exact table by at most Δ."""
    rng = np.random.default_rng(1)
    table = mechanism.MarkerTable(3, 50)
    base = rng.poisson(2.0, size=(40, 50)).astype(float)
    groups = rng.integers(0, 3, 40)
    before = mechanism.group_table(base, groups, table)
    extremes = [
        np.eye(50)[0] * 1e9,  # every count in one gene
        np.ones(50),  # counts spread evenly
        np.zeros(50),  # no counts
        np.r_[np.full(25, np.nan), np.full(25, 3.0)],  # not finite values read as 0
        -np.ones(50),
        rng.poisson(50.0, 50).astype(float),
    ]
    for cell in extremes:
        for group in range(3):
            after = mechanism.group_table(np.vstack([base, cell]), np.r_[groups, group], table)
            assert np.linalg.norm(after - before) <= table.sensitivity * (1 + 1e-9)
    outside = mechanism.group_table(np.vstack([base, extremes[0]]), np.r_[groups, -1], table)
    np.testing.assert_array_equal(outside, before)  # a cell in no group adds nothing


def test_the_expression_bound_is_released_from_a_histogram_of_the_norms():
    """One cell moves the histogram by exactly 1; the bound is the quantile bin's upper edge, at most B2."""
    rng = np.random.default_rng(2)
    base = rng.poisson(0.3, size=(200, 50)).astype(float)
    before = mechanism.norm_histogram(base)
    assert before.sum() == 200 and before.shape == (mechanism.NORM_BINS,)
    extremes = [
        np.eye(50)[0] * 1e9,
        np.ones(50),
        np.zeros(50),
        -np.ones(50),
        np.r_[np.full(25, np.nan), [3.0] * 25],
    ]
    for cell in extremes:
        after = mechanism.norm_histogram(np.vstack([base, cell]))
        assert np.linalg.norm(after - before) == pytest.approx(1.0)
    norms = np.sqrt((mechanism._log_expression(base) ** 2).sum(1))
    edges = mechanism.norm_edges(50)
    bound = mechanism.released_sum_bound(before, 50)
    below = edges[np.searchsorted(edges, bound) - 1]  # the bin's lower edge
    assert np.mean(norms <= bound) >= mechanism.NORM_QUANTILE > np.mean(norms <= below)
    assert bound < 0.8 * mechanism.expression_bound(50)  # below the worst case: less noise on the sums
    assert mechanism.released_sum_bound(-before, 50) == pytest.approx(mechanism.expression_bound(50))
    for hostile in (float("inf"), float("nan"), 0.0, -1.0, 1e9, True, "3"):
        with pytest.raises(mechanism.BoundError):
            mechanism.MarkerTable(3, 50, hostile)


def test_without_noise_it_is_scanpys_t_test(grouped):
    ours = grouped.copy()
    dpsc.tl.rank_genes_groups(ours, "group", epsilon=None, n_genes=20)
    ref = grouped.copy()
    sc.pp.normalize_total(ref, target_sum=1e4)
    sc.pp.log1p(ref)
    sc.tl.rank_genes_groups(ref, "group", method="t-test", n_genes=20)
    for group in ("a", "b", "c"):
        assert list(ours.uns["rank_genes_groups"]["names"][group]) == list(
            ref.uns["rank_genes_groups"]["names"][group]
        )
        np.testing.assert_allclose(
            ours.uns["rank_genes_groups"]["scores"][group],
            ref.uns["rank_genes_groups"]["scores"][group],
            rtol=1e-3,
        )
        np.testing.assert_allclose(
            ours.uns["rank_genes_groups"]["logfoldchanges"][group],
            ref.uns["rank_genes_groups"]["logfoldchanges"][group],
            rtol=1e-3,
            atol=1e-3,
        )


def test_private_markers_in_scanpys_format_plots_and_ledger(grouped, tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    adata = grouped.copy()
    dpsc.tl.rank_genes_groups(adata, "group", epsilon=8, n_genes=10)
    top = list(adata.uns["rank_genes_groups"]["names"]["a"][:5])
    assert len(set(top) & set(adata.var_names[:5])) >= 4  # the planted markers of group a
    frame = sc.get.rank_genes_groups_df(adata, group="a")
    assert list(frame.columns[:5]) == ["names", "scores", "logfoldchanges", "pvals", "pvals_adj"]
    assert len(frame) == 10 and frame["pvals_adj"].between(0, 1).all()
    assert adata.uns["rank_genes_groups"]["pts"].shape == (adata.n_vars, 3)
    sc.pl.rank_genes_groups_dotplot(adata, n_genes=3, show=False)
    sc.pl.rank_genes_groups(adata, n_genes=5, show=False)
    record = dpsc.privacy.get_record(adata, "rank_genes_groups")
    assert record["guarantee"] == "proven" and record["epsilon"] == pytest.approx(8.0, rel=0.01)
    assert record["max_grad_norm"] == pytest.approx(mechanism.SENSITIVITY)  # the table's Δ is recorded
    assert len(record["history"]) == 2  # the histogram of the norms, then the table: both accounted
    params = adata.uns["dpsc"]["rank_genes_groups"]["params"]
    assert 0 < params["expression_bound"] < mechanism.expression_bound(adata.n_vars)
    assert dpsc.privacy.spent(adata).epsilon == pytest.approx(record["epsilon"])
    adata.write_h5ad(tmp_path / "markers.h5ad")  # h5ad-safe
    assert ad.read_h5ad(tmp_path / "markers.h5ad").uns["rank_genes_groups"]["params"]["groupby"] == "group"


def test_scanpys_return_rule_budget_and_bad_input(grouped):
    adata = grouped.copy()
    copied = dpsc.tl.rank_genes_groups(adata, "group", epsilon=2, copy=True, key_added="markers")
    assert "markers" in copied.uns and "markers" not in adata.uns
    assert dpsc.privacy.spent(adata).epsilon > 0  # the original's cells were read: its ledger knows
    dpsc.privacy.set_budget(adata, 2.5)
    before = dict(adata.uns)
    with pytest.raises(dpsc.privacy.BudgetExceededError):
        dpsc.tl.rank_genes_groups(adata, "group", epsilon=2)
    assert "rank_genes_groups" not in adata.uns and set(adata.uns) == set(before)
    plain = grouped.copy()
    plain.obs["text"] = plain.obs["group"].astype(str)
    with pytest.raises(ValueError, match="not categorical"):
        dpsc.tl.rank_genes_groups(plain, "text")
    with pytest.raises(KeyError, match=r"tl\.cluster"):
        dpsc.tl.rank_genes_groups(plain, "dp_kmeans")
    assert "rank_genes_groups" not in plain.uns


def test_after_tl_cluster_within_one_budget(small_adata):
    adata = small_adata.copy()
    dpsc.tl.cluster(adata, 3, epsilon=6)
    dpsc.tl.rank_genes_groups(adata, epsilon=2)  # groupby defaults to the clusters
    assert set(adata.uns["rank_genes_groups"]["names"].dtype.names) == {"0", "1", "2"}
    assert dpsc.privacy.spent(adata).epsilon <= 8.0


def test_tl_cluster_releases_the_clusters_markers_inside_its_epsilon(small_adata):
    adata = small_adata.copy()
    dpsc.tl.cluster(adata, 3, epsilon=8, markers=True, noise_seed=1)
    assert dpsc.privacy.spent(adata).epsilon == pytest.approx(8.0, rel=0.01)  # one budget, five releases
    result = adata.uns["dp_kmeans_markers"]
    assert result["params"]["groupby"] == "dp_kmeans" and set(result["names"].dtype.names) == {"0", "1", "2"}
    record = dpsc.privacy.get_record(adata, "dp_kmeans")
    assert "marker" in record["statement"] and record["guarantee"] == "proven"
    without = small_adata.copy()
    dpsc.tl.cluster(without, 3, epsilon=8, noise_seed=1)
    plan = dpsc.privacy._clustering.plan_clustering(
        8.0, 1e-5, n_vars=200, n_clusters=3, n_obs=300, markers=True
    )
    # the k-means' releases are one history entry of kmeans_steps steps
    assert (
        plan.schedule()[-1].kind == "markers"
        and plan.n_releases == len(plan.history()) + plan.kmeans_steps - 1
    )
    assert "dp_kmeans_markers" not in without.uns
