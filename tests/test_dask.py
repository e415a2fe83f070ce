"""The private releases on a Dask-backed AnnData: blockwise sums where the chunks are, the same answer."""

from __future__ import annotations

import time

import anndata as ad
import numpy as np
import pytest
import scipy.sparse as sp

import dpsc
from dpsc import _blocks

da = pytest.importorskip("dask.array")


def lazy_copy(adata: ad.AnnData, sparse: bool, rows: int = 70) -> ad.AnnData:
    out = adata.copy()
    X = sp.csr_matrix(adata.X) if sparse else np.asarray(adata.X.toarray(), dtype=np.float32)
    out.X = da.from_array(X, chunks=(rows, adata.n_vars), asarray=False)
    return out


@pytest.mark.parametrize("sparse", [True, False])
def test_every_release_on_dask_equals_the_in_memory_one(small_adata, sparse):
    """tl.cluster (with markers), pp.highly_variable_genes, pp.pca, tl.kmeans, tl.rank_genes_groups."""
    lazy, memory = lazy_copy(small_adata, sparse), small_adata.copy()
    for adata in (lazy, memory):
        dpsc.tl.cluster(adata, 3, markers=True, noise_seed=5)
        dpsc.pp.highly_variable_genes(adata, n_top_genes=50, noise_seed=6)
        dpsc.pp.pca(adata, n_comps=5, noise_seed=7)
        dpsc.tl.kmeans(adata, 3, noise_seed=8, key_added="pca_kmeans")
        dpsc.tl.rank_genes_groups(adata, "dp_cluster", noise_seed=9, key_added="again")
    assert (lazy.obs["dp_cluster"] == memory.obs["dp_cluster"]).all()
    assert (lazy.obs["pca_kmeans"] == memory.obs["pca_kmeans"]).all()
    np.testing.assert_allclose(
        lazy.varm["dp_cluster_loadings"], memory.varm["dp_cluster_loadings"], atol=1e-9
    )
    np.testing.assert_allclose(np.asarray(lazy.obsm["X_dp_cluster"]), memory.obsm["X_dp_cluster"], atol=1e-6)
    np.testing.assert_allclose(lazy.varm["PCs"], memory.varm["PCs"], atol=1e-9)
    assert (lazy.var["highly_variable"] == memory.var["highly_variable"]).all()
    for key in ("dp_cluster_markers", "again"):
        for part in ("names", "scores"):
            assert (lazy.uns[key][part] == memory.uns[key][part]).all()
    assert dpsc.privacy.spent(lazy) == pytest.approx(dpsc.privacy.spent(memory))
    assert _blocks.is_dask(lazy.obsm["X_dp_cluster"])  # the projections stay lazy
    for key in ("dp_cluster", "highly_variable", "X_pca", "again"):  # who saw un-noised sums is stated
        assert "Dask workers" in lazy.uns["dpsc"][key]["privacy"]["statement"], key
        assert "Dask workers" not in memory.uns["dpsc"][key]["privacy"]["statement"], key


def test_only_partial_sums_reach_the_caller(small_adata):
    lazy = lazy_copy(small_adata, True, rows=50)
    seen = []

    def block_sum(block):
        seen.append(block.shape[0])
        return np.asarray(block.sum(0)).ravel()

    total = _blocks.blockwise_sum(lazy.X, block_sum)
    np.testing.assert_allclose(total, np.asarray(small_adata.X.sum(0)).ravel(), rtol=1e-6)
    assert max(seen) <= 50 and sum(seen) == small_adata.n_obs


def test_a_matrix_chunked_across_genes_is_refused_with_the_fix(small_adata):
    adata = small_adata.copy()
    adata.X = da.from_array(sp.csr_matrix(small_adata.X), chunks=(100, 50), asarray=False)
    with pytest.raises(ValueError, match=r"rechunk\(\{1: -1\}\)"):
        dpsc.tl.cluster(adata, 3)
    assert dpsc.privacy.spent(adata).epsilon == 0.0


def test_long_local_work_shows_dask_progress(small_adata, capsys, monkeypatch):
    monkeypatch.setattr(_blocks, "PROGRESS_AFTER_S", 0.0)
    dpsc.tl.cluster(lazy_copy(small_adata, True), 3, noise_seed=1)
    assert "Completed" in capsys.readouterr().out  # dask's ProgressBar line


def test_a_zarr_backed_anndata_read_lazily(small_adata, tmp_path):
    pytest.importorskip("zarr")
    path = tmp_path / "cells.zarr"
    small_adata.write_zarr(path)
    lazy = dpsc.datasets.read_zarr(path, chunk=100)
    assert lazy.X.chunks[1] == (small_adata.n_vars,) and set(lazy.X.chunks[0][:-1]) == {100}
    memory = small_adata.copy()
    dpsc.tl.cluster(lazy, 3, noise_seed=2)
    dpsc.tl.cluster(memory, 3, noise_seed=2)
    assert (lazy.obs["dp_cluster"] == memory.obs["dp_cluster"]).all()


@pytest.mark.slow
def test_on_a_cluster_the_per_cell_work_stays_off_the_caller(small_adata):
    """A scheduler and 2 worker processes on 127.0.0.1 (stopped by the test); 10^5 and 3 × 10^5 cells.

    The scheduler runs in its own process, as on a real cluster (``LocalCluster`` would run it in
    the caller's, where its bookkeeping would count as the caller's work): distributed's
    ``SubprocessCluster``.
    """
    distributed = pytest.importorskip("distributed")
    from distributed.deploy.subprocess import SubprocessCluster

    cluster = SubprocessCluster(host="127.0.0.1", n_workers=2, threads_per_worker=1, dashboard_address=None)
    try:
        client = distributed.Client(cluster, timeout=60)
        client.wait_for_workers(2, timeout=60)
        lazy, memory = lazy_copy(small_adata, True), small_adata.copy()
        dpsc.tl.cluster(lazy, 3, noise_seed=4)  # on the cluster's workers
        dpsc.tl.cluster(memory, 3, noise_seed=4)
        assert (lazy.obs["dp_cluster"] == memory.obs["dp_cluster"]).all()
        cpu = {}
        for n in (100_000, 300_000):
            rng = da.random.default_rng(0)
            X = rng.poisson(0.5, size=(n, 200), chunks=(n // 4, 200)).astype(np.float32)
            adata = ad.AnnData(X=X)
            dpsc.tl.cluster(adata, 3)  # warm: imports and calibration caches
            start = time.process_time()
            dpsc.tl.cluster(adata, 3, key_added="timed")
            cpu[n] = time.process_time() - start
            assert adata.obs["timed"].notna().all()
        in_memory = ad.AnnData(X=X[:100_000].compute())
        start = time.process_time()
        dpsc.tl.cluster(in_memory, 3)
        cpu["in memory, 10^5"] = time.process_time() - start
        print(f"caller CPU s: {cpu}")
        # The caller still holds obs (the labels land there), so its work may grow a little; what
        # must not reach it is the per-cell arithmetic: 2 × 10^5 more cells cost the caller under a
        # tenth of what 10^5 cost in memory (measured: about a hundredth).
        assert cpu[300_000] - cpu[100_000] < 0.1 * cpu["in memory, 10^5"], cpu
        client.close(timeout=30)
    finally:
        cluster.close(timeout=30)


@pytest.mark.parametrize("sparse", [True, False])
def test_fit_reads_dask_chunks_as_in_memory(small_adata, sparse):
    """tl.fit on a Dask AnnData (CSR or dense row chunks) runs and gives the in-memory fit's result."""
    lazy, memory = lazy_copy(small_adata, sparse), small_adata.copy()
    for adata in (lazy, memory):
        dpsc.tl.fit(adata, epsilon=8, n_clusters=3, max_epochs=2, noise_seed=4, progress_bar=False)
    np.testing.assert_allclose(lazy.obsm["X_dpdcan"], memory.obsm["X_dpdcan"], atol=1e-4)
    assert (lazy.obs["dp_cluster"] == memory.obs["dp_cluster"]).all()
    assert dpsc.privacy.spent(lazy) == dpsc.privacy.spent(memory)


def test_a_donor_level_clustering_on_dask_equals_the_in_memory_one(small_adata):
    memory = small_adata.copy()
    memory.obs["donor"] = [f"d{i % 7}" for i in range(memory.n_obs)]
    lazy = lazy_copy(memory, sparse=True)
    for adata in (lazy, memory):
        dpsc.tl.cluster(adata, 3, epsilon=8.0, noise_seed=5, donor_key="donor")
    np.testing.assert_allclose(
        lazy.uns["dpsc"]["dp_cluster"]["centroids"], memory.uns["dpsc"]["dp_cluster"]["centroids"], atol=1e-6
    )
    assert dpsc.privacy.spent(lazy) == dpsc.privacy.spent(memory) and dpsc.privacy.spent(lazy).unit == "donor"
