"""Every tool's results and the ledger survive write_h5ad / read_h5ad."""

import anndata as ad
import numpy as np
import pandas as pd
import pytest

import dpsc


def _round_trip(adata, tmp_path):
    path = tmp_path / "x.h5ad"
    adata.write_h5ad(path)
    back = ad.read_h5ad(path)
    assert dpsc.privacy.spent(back) == pytest.approx(dpsc.privacy.spent(adata))
    return back


def test_pipeline_tools_write_and_read_back(small_adata, tmp_path):
    adata = small_adata.copy()
    dpsc.pp.highly_variable_genes(adata, 100, epsilon=1.0, subset=True)
    dpsc.pp.pca(adata, n_comps=4, epsilon=2.0, n_genes=None)
    dpsc.tl.kmeans(adata, 3, epsilon=2.0)
    dpsc.tl.cluster(adata, 3, epsilon=2.0, key_added="one_call")
    back = _round_trip(adata, tmp_path)
    assert list(dpsc.privacy.ledger_frame(back)["key"]) == [
        "highly_variable",
        "X_pca",
        "dp_cluster",
        "one_call",
    ]


def test_regression_and_annotation_write_and_read_back(small_adata, tmp_path):
    rng = np.random.default_rng(0)
    samples = ad.AnnData(rng.normal(size=(60, 8)).astype(np.float32))
    samples.var_names = [f"g{i}" for i in range(8)]
    samples.obs["response"] = samples.X[:, 0] + 0.1 * rng.normal(size=60)
    dpsc.tl.private_regression(
        samples, "response", epsilon=2.0, genes=["g0", "g1"], y_center=0.0, y_scale=1.0
    )
    back = _round_trip(samples, tmp_path)
    assert dpsc.privacy.get_record(back, "response_dp_pred")["relation"] == "replace-one"
    ref, query = small_adata[:200].copy(), small_adata[200:].copy()
    ref.obs["cell_type"] = pd.Categorical(ref.obs["cell_type"].astype(str))
    dpsc.tl.annotate(query, ref, "cell_type", epsilon=2.0, epochs=2)
    _round_trip(ref, tmp_path)
    _round_trip(query, tmp_path)


def test_audit_reports_write_and_read_back(small_adata, tmp_path):
    quick_fit = {"n_clusters": 3, "accelerator": "cpu", "progress_bar": False}
    for options in (
        {"method": "one_run", "epochs": 1, "n_canaries": 100},
        {"method": "one_run", "canaries": "input", "n_canaries": 50, "max_epochs": 3, **quick_fit},
        {"method": "shadow", "instance_epochs": 1, "cluster_epochs": 1, **quick_fit},
    ):
        adata = small_adata.copy()
        table = dpsc.tl.audit(adata, epsilon=2.0, **options)
        back = _round_trip(adata, tmp_path)
        assert set(back.uns["dpsc"]["audit"]["table"]) == set(table.columns)
