"""A newcomer's first hour: check first, charge second; true hints; a word where one is needed."""

from __future__ import annotations

import copy
import re
import warnings
from pathlib import Path

import anndata as ad
import matplotlib
import numpy as np
import pytest
import scanpy as sc
import scipy.sparse as sp

import dpsc

matplotlib.use("Agg")


@pytest.fixture
def standard(small_adata):
    """scanpy's standard layout: raw counts in layers['counts'], log1p(CP10k) in X."""
    adata = small_adata.copy()
    adata.layers["counts"] = adata.X.copy()
    sc.pp.normalize_total(adata)
    sc.pp.log1p(adata)
    dpsc.privacy.set_budget(adata, epsilon=50.0)
    return adata


def uns_snapshot(adata: ad.AnnData) -> dict:
    return copy.deepcopy({k: adata.uns[k] for k in adata.uns.keys()})


def assert_same_uns(adata: ad.AnnData, before: dict) -> None:
    assert sorted(adata.uns.keys()) == sorted(before)
    assert repr(adata.uns.get("dpsc")) == repr(before.get("dpsc"))


CALLS = {
    "tl.cluster": lambda a, **k: dpsc.tl.cluster(a, 3, **k),
    "tl.rank_genes_groups": lambda a, **k: dpsc.tl.rank_genes_groups(a, "cell_type", **k),
    "pp.highly_variable_genes": lambda a, **k: dpsc.pp.highly_variable_genes(a, n_top_genes=50, **k),
    "pp.pca": lambda a, **k: dpsc.pp.pca(a, n_comps=5, **k),
    "tl.fit": lambda a, **k: dpsc.tl.fit(a, n_clusters=3, progress_bar=False, max_epochs=2, **k),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_log_normalised_x_is_refused_with_a_hint_that_runs_and_costs_nothing(standard, name):
    before = uns_snapshot(standard)
    with pytest.raises(ValueError, match="layer='counts'") as refused:
        CALLS[name](standard)
    assert "log_normalize=False" not in str(refused.value) or name.startswith("pp.")
    assert dpsc.privacy.spent(standard).epsilon == 0.0
    assert_same_uns(standard, before)
    hint = re.search(r"layer='(\w+)'", str(refused.value)).group(1)
    if name != "tl.fit":  # the slow path is the layer test below
        CALLS[name](standard, layer=hint)
        assert dpsc.privacy.spent(standard).epsilon > 0


def test_the_fit_reads_the_counts_layer_of_the_standard_layout(standard):
    dpsc.tl.fit(standard, layer="counts", n_clusters=3, progress_bar=False, max_epochs=2)
    assert "dp_cluster" in standard.obs and 0 < dpsc.privacy.spent(standard).epsilon <= 8.0 * (1 + 1e-9)


def test_a_call_that_fails_before_its_first_release_books_nothing(small_adata, monkeypatch):
    """A crash inside the booking but before any noise is drawn: no ledger entry, ``uns`` as it was."""
    import dpsc.tl._cluster as cluster_module

    adata = small_adata.copy()
    dpsc.privacy.set_budget(adata, epsilon=20.0)
    before = uns_snapshot(adata)

    def broken(*args, **kwargs):
        raise RuntimeError("a bug before the first release")

    monkeypatch.setattr(cluster_module, "run_clustering", broken)
    with pytest.raises(RuntimeError, match="a bug"):
        dpsc.tl.cluster(adata, 3)
    assert dpsc.privacy.spent(adata).epsilon == 0.0
    assert_same_uns(adata, before)


def test_a_call_that_fails_after_a_release_keeps_its_booking(small_adata, monkeypatch):
    import dpsc.tl._cluster as cluster_module

    adata = small_adata.copy()
    original = cluster_module.run_clustering

    def fails_late(plan, release_sum, *args, **kwargs):
        calls = {"n": 0}

        def counted(request):
            calls["n"] += 1
            if calls["n"] == 2:
                raise RuntimeError("a bug after the first release")
            return release_sum(request)

        return original(plan, counted, *args, **kwargs)

    monkeypatch.setattr(cluster_module, "run_clustering", fails_late)
    with pytest.raises(RuntimeError, match="after the first release"):
        dpsc.tl.cluster(adata, 3)
    assert dpsc.privacy.spent(adata).epsilon > 0  # what was released before the failure stays booked


def test_backed_with_copy_and_sparse_dask_chunks_work(small_adata, tmp_path):
    path = tmp_path / "cells.h5ad"
    small_adata.write_h5ad(path)
    backed = ad.read_h5ad(path, backed="r")
    with pytest.warns(UserWarning, match=r"copy=True reads the backed file's X \(300 × \d+\) into memory"):
        out = dpsc.tl.cluster(backed, 3, copy=True)
    assert "dp_cluster" in out.obs and "dp_cluster" not in backed.obs
    da = pytest.importorskip("dask.array")
    lazy = small_adata.copy()
    lazy.X = da.from_array(sp.csr_matrix(small_adata.X), chunks=(100, small_adata.n_vars), asarray=False)
    dpsc.tl.cluster(lazy, 3, noise_seed=1)
    dense = small_adata.copy()
    dpsc.tl.cluster(dense, 3, noise_seed=1)
    np.testing.assert_allclose(lazy.obsm["X_dp_cluster"], dense.obsm["X_dp_cluster"], rtol=1e-6, atol=1e-8)


def test_non_finite_values_are_refused_up_front_and_cost_nothing(small_adata):
    adata = small_adata.copy()
    X = (adata.X.toarray() if sp.issparse(adata.X) else np.array(adata.X)).astype(np.float32)
    X[3, 5] = np.nan
    adata.X = sp.csr_matrix(X)
    for name in ("tl.cluster", "pp.pca", "tl.rank_genes_groups"):
        with pytest.raises(ValueError, match="1 cells of the expression matrix hold NaN"):
            CALLS[name](adata)
    assert dpsc.privacy.spent(adata).epsilon == 0.0


def test_duplicate_gene_names_and_an_overwritten_key_each_get_a_word(small_adata):
    adata = small_adata.copy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        adata.var_names = [adata.var_names[0], *adata.var_names[:-1]]
    with pytest.warns(UserWarning, match="duplicate gene names"):
        dpsc.tl.cluster(adata, 3)
    with pytest.warns(UserWarning, match="already stored under key 'dp_cluster'"):
        dpsc.tl.cluster(adata, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        adata.var_names_make_unique()
        try:
            dpsc.tl.cluster(adata, 3, key_added="second")
        except UserWarning as warning:
            assert "already stored" not in str(warning) and "duplicate" not in str(warning)


def test_embedding_takes_what_scanpy_takes_and_names_epsilon_on_private_outputs_only(small_adata):
    adata = small_adata.copy()
    dpsc.tl.cluster(adata, 3)
    adata.obsm["X_umap"] = adata.obsm["X_dp_cluster"][:, :2]
    ax = dpsc.pl.embedding(adata, color="dp_cluster", show=False)
    assert "ε" in ax.get_title() and ax.get_xlabel() == "UMAP1"
    ax = dpsc.pl.embedding(adata, color="cell_type", show=False)
    assert "ε" not in ax.get_title()
    axes = dpsc.pl.embedding(adata, color=["dp_cluster", "cell_type"], show=False)
    titles = [a.get_title() for a in axes]
    assert "ε" in titles[0] and titles[1] == "cell_type"
    assert "ε" in dpsc.pl.embedding(adata, show=False).get_title()  # color=None: the clusters dpsc wrote
    assert dpsc.pl.embedding(adata, "umap", color="cell_type", show=False).get_xlabel() == "UMAP1"
    with pytest.raises(KeyError, match="second argument is the basis"):  # scanpy's order, a clear hint
        dpsc.pl.embedding(adata, "cell_type", show=False)


PUBLIC = {
    "tl.cluster": lambda a, **k: dpsc.tl.cluster(a, 3, **k),
    "tl.fit": lambda a, **k: dpsc.tl.fit(a, n_clusters=3, progress_bar=False, max_epochs=1, **k),
    "tl.rank_genes_groups": lambda a, **k: dpsc.tl.rank_genes_groups(a, "cell_type", **k),
    "tl.kmeans": lambda a, **k: dpsc.tl.kmeans(a, 3, use_rep="X_pca", **k),
    "tl.annotate": lambda a, **k: dpsc.tl.annotate(a, a.copy(), "cell_type", **k),
    "tl.cluster_federated": lambda a, **k: dpsc.tl.cluster_federated(a, "site", 3, **k),
    "pp.highly_variable_genes": lambda a, **k: dpsc.pp.highly_variable_genes(a, n_top_genes=50, **k),
    "pp.pca": lambda a, **k: dpsc.pp.pca(a, n_comps=5, **k),
}
BAD = {
    "an unknown layer": {"layer": "nope"},
    "a negative epsilon": {"epsilon": -1.0},
    "a delta of 1": {"delta": 1.0},
}
NO_LAYER = ("tl.kmeans", "an unknown layer")  # tl.kmeans reads obsm, not a layer
CASES = [(name, bad) for name in sorted(PUBLIC) for bad in sorted(BAD) if (name, bad) != NO_LAYER]


@pytest.mark.parametrize(("name", "bad"), CASES)
def test_every_public_function_refuses_bad_input_before_booking_anything(small_adata, name, bad):
    adata = small_adata.copy()
    adata.obs["site"] = np.where(np.arange(adata.n_obs) % 2 == 0, "a", "b")
    adata.obsm["X_pca"] = np.random.default_rng(0).normal(size=(adata.n_obs, 5))
    dpsc.privacy.set_budget(adata, epsilon=30.0)
    before = uns_snapshot(adata)
    with pytest.raises((ValueError, KeyError, TypeError)):
        PUBLIC[name](adata, **BAD[bad])
    assert dpsc.privacy.spent(adata).epsilon == 0.0
    assert_same_uns(adata, before)


@pytest.mark.slow
def test_the_readme_snippets_total_spend_is_what_the_ledger_composes():
    """The scanpy snippet's comments state the composed (ε, δ) after the markers and after the fit."""

    readme = (Path(__file__).parents[1] / "README.md").read_text()
    stated = [(float(e), float(d)) for e, d in re.findall(r"\((\d+\.\d+), (\de-0\d)\)", readme)]
    adata = dpsc.datasets.pbmc4k()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dpsc.tl.cluster(adata, n_clusters=8, epsilon=6)
        dpsc.tl.rank_genes_groups(adata, "dp_cluster", epsilon=2)
        after_markers = dpsc.privacy.spent(adata)
        dpsc.tl.fit(adata, epsilon=8, progress_bar=False)
    composed = [after_markers, dpsc.privacy.spent(adata)]
    assert [(round(e, 2), d) for e, d in stated] == [(round(e, 2), pytest.approx(d)) for e, d in composed]
