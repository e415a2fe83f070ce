"""DP gene selection (``dpsc.pp.highly_variable_genes``): sensitivity, selection, record, ledger."""

import anndata as ad
import numpy as np
import pytest
import scipy.sparse as sp

import dpsc
from dpsc.methods.hvg import SENSITIVITY, per_cell_contributions
from dpsc.privacy import get_record, spent


def marker_data(n_cells=1200, n_markers=40, n_flat=400, seed=0):
    """Two cell groups that differ in ``n_markers`` genes; the other genes have one rate for all."""
    rng = np.random.default_rng(seed)
    group = rng.integers(0, 2, n_cells)
    rate = np.full((n_cells, n_markers + n_flat), 0.5)
    half = n_markers // 2
    rate[group == 0, :half] = 8.0
    rate[group == 1, half:n_markers] = 8.0
    adata = ad.AnnData(sp.csr_matrix(rng.poisson(rate).astype(np.float32)))
    adata.X[:, -1] = 0  # one gene no cell expresses
    adata.X.eliminate_zeros()
    return adata, np.arange(n_markers)


def test_one_cell_contributes_at_most_the_sensitivity():
    rng = np.random.default_rng(1)
    cells = np.vstack(
        [
            rng.poisson(3.0, size=(50, 30)) + 1.0,
            np.eye(30)[:5] * 100,  # all counts in one gene: squared norm 1, clipped to c
            rng.poisson(0.1, size=(20, 30)) + np.eye(30)[:20] * 5,
        ]
    )
    for clip in (0.05, 0.2, 1.0):
        Z, W = per_cell_contributions(sp.csr_matrix(cells), True, clip)
        norms = np.sqrt(
            np.asarray(Z.multiply(Z).sum(1)).ravel() + np.asarray(W.multiply(W).sum(1)).ravel() + 1.0
        )
        assert np.all(norms <= SENSITIVITY + 1e-9)
        assert np.all(np.asarray(W.multiply(W).sum(1)).ravel() <= 1 + 1e-9)


def test_selects_the_marker_genes_and_writes_scanpy_columns():
    found = {}
    for flavor in ("second_moment", "mean", "variance"):
        hits = []
        for seed in range(5):
            adata, markers = marker_data()
            dpsc.pp.highly_variable_genes(adata, n_top_genes=40, epsilon=1.0, flavor=flavor, noise_seed=seed)
            selected = np.flatnonzero(adata.var["highly_variable"])
            assert len(selected) == 40
            hits.append(len(np.intersect1d(selected, markers)))  # 40 markers among 440 genes
        found[flavor] = np.mean(hits)
    # the figures of the module docstring: variance is the weakest statistic under noise
    assert found["second_moment"] >= 34 and found["mean"] >= 38 and found["variance"] < 25
    assert not adata.var["highly_variable"].iloc[-1]  # the unexpressed gene is never picked
    for column in ("means", "variances", "highly_variable_rank"):
        assert column in adata.var
    assert np.isnan(adata.var["highly_variable_rank"][~adata.var["highly_variable"]]).all()
    record = get_record(adata, "highly_variable")
    assert record["guarantee"] == "proven" and 0 < record["epsilon"] <= 1.0
    assert spent(adata)[0] == pytest.approx(record["epsilon"])


def test_noise_is_secret_unless_seeded():
    runs = []
    for seed in (None, None, 3, 3):
        adata, _ = marker_data(n_cells=300)
        dpsc.pp.highly_variable_genes(adata, n_top_genes=20, epsilon=1.0, noise_seed=seed)
        runs.append(adata.var["variances"].to_numpy())
    assert not np.allclose(runs[0], runs[1])
    np.testing.assert_array_equal(runs[2], runs[3])


def test_copy_subset_and_composition_with_pca():
    adata, _ = marker_data(n_cells=400)
    out = dpsc.pp.highly_variable_genes(adata, n_top_genes=50, epsilon=1.0, subset=True, copy=True)
    assert out.n_vars == 50 and adata.n_vars == 440 and "highly_variable" not in adata.var
    assert len(adata.uns["dpsc"]["ledger"]) == 1  # the original's cells were read
    dpsc.pp.pca(out, n_comps=4, epsilon=2.0, n_genes=None)
    total, _ = spent(out)
    assert total > max(get_record(out, "highly_variable")["epsilon"], get_record(out, "X_pca")["epsilon"])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_top_genes": 1000}, "n_top_genes"),
        ({"n_top_genes": 10, "square_clip": 0.0}, "square_clip"),
        ({"n_top_genes": 10, "epsilon": -1.0}, "epsilon"),
        ({"n_top_genes": 10, "flavor": "seurat"}, "flavor"),
    ],
)
def test_bad_input_fails_before_touching_adata(kwargs, message):
    adata, _ = marker_data(n_cells=100)
    before = adata.copy()
    with pytest.raises(ValueError, match=message):
        dpsc.pp.highly_variable_genes(adata, **kwargs)
    assert list(adata.var.columns) == list(before.var.columns) and "dpsc" not in adata.uns


def test_dispersion_ranks_within_bins_of_the_mean():
    from dpsc.methods.hvg import dispersion_scores

    rng = np.random.default_rng(0)
    means = np.exp(rng.uniform(-6, 0, 2000))
    ratio = np.exp(rng.normal(0.0, 0.3, 2000))  # variance / mean, the same spread at every mean
    variances = means * ratio
    variances[:10] = -1e-6  # noise can make a released variance negative
    eligible = np.ones(2000, bool)
    eligible[-5:] = False
    scores = dispersion_scores(means, variances, eligible)
    assert np.isneginf(scores[-5:]).all() and np.isfinite(scores[:-5]).all()
    assert abs(scores[:-5].mean()) < 1e-9  # z-scored in every bin
    # within a bin of the mean the order is the order of var / mean; across bins the mean plays no part
    assert np.corrcoef(scores[10:-5], np.log(ratio[10:-5]))[0, 1] > 0.95
    assert abs(np.corrcoef(scores[10:-5], np.log(means[10:-5]))[0, 1]) < 0.1
    assert scores[:10].max() < np.quantile(scores[10:-5], 0.1)  # a non-positive variance ranks low
