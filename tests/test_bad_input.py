import numpy as np
import pytest
import scipy.sparse as sp

import dpsc


def snapshot(adata):
    x = adata.X.toarray() if sp.issparse(adata.X) else np.array(adata.X)
    return (
        x.copy(),
        set(adata.obs.columns),
        set(adata.obsm.keys()),
        set(adata.uns.keys()),
        set(adata.layers.keys()),
    )


def assert_unchanged(adata, snap):
    x, obs, obsm, uns, layers = snap
    now = adata.X.toarray() if sp.issparse(adata.X) else np.asarray(adata.X)
    np.testing.assert_array_equal(now, x)
    assert (
        set(adata.obs.columns),
        set(adata.obsm.keys()),
        set(adata.uns.keys()),
        set(adata.layers.keys()),
    ) == (obs, obsm, uns, layers)


def _set(adata, value, where=(0, 0)):
    x = adata.X.toarray().astype(np.float32)
    x[where] = value
    adata.X = sp.csr_matrix(x)
    return adata


# Bad values in the cells are refused by a non-private fit (nothing to protect: the message helps);
# a DP fit never refuses because of what a cell contains (test_dp_fit_reads_bad_values_per_cell).
NON_PRIVATE = {"epsilon": None}
CASES = {
    "non-integer": (lambda a: _set(a, 0.5), NON_PRIVATE, "non-integer"),
    "negative": (lambda a: _set(a, -1.0), NON_PRIVATE, "negative"),
    "nan": (lambda a: _set(a, np.nan), NON_PRIVATE, "NaN"),
    "inf": (lambda a: _set(a, np.inf), NON_PRIVATE, "NaN or infinite"),
    "zero cell": (lambda a: _zero_row(a), NON_PRIVATE, "filter_cells"),
    "zero gene": (lambda a: _zero_col(a), NON_PRIVATE, "filter_genes"),
    "epsilon text": (lambda a: a, {"epsilon": "8"}, "epsilon must be a number"),
    "epsilon 0": (lambda a: a, {"epsilon": 0.0}, "epsilon must be"),
    "epsilon negative": (lambda a: a, {"epsilon": -1.0}, "epsilon must be"),
    "delta 0": (lambda a: a, {"delta": 0.0}, "delta must satisfy"),
    "delta too big": (lambda a: a, {"delta": 0.01}, "delta must satisfy"),
    "n_clusters 1": (lambda a: a, {"n_clusters": 1}, "n_clusters must be"),
    "n_clusters > n": (lambda a: a, {"n_clusters": 10_000}, "n_clusters must be"),
    "unknown layer": (lambda a: a, {"layer": "counts"}, "Unknown layer"),
    "unknown scope": (lambda a: a, {"scope": "decoder"}, "Unknown scope"),
    "batch too big": (lambda a: a, {"batch_size": 10_000}, "batch_size must be"),
    "unknown likelihood": (lambda a: a, {"likelihood": "poisson"}, "Unknown likelihood"),
    "too few cells": (lambda a: a[:5].copy(), {"n_clusters": 2, "delta": 1e-3}, "at least 10 cells"),
}


def _zero_row(a):
    x = a.X.toarray()
    x[3] = 0
    a.X = sp.csr_matrix(x)
    return a


def _zero_col(a):
    x = a.X.toarray()
    x[:, 4] = 0
    a.X = sp.csr_matrix(x)
    return a


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_fails_fast_and_leaves_adata_alone(small_adata, case):
    make, kwargs, message = CASES[case]
    adata = make(small_adata)
    snap = snapshot(adata)
    with pytest.raises((ValueError, TypeError), match=message):
        dpsc.tl.fit(adata, **{"epsilon": 8.0, "n_clusters": 3, **kwargs})
    assert_unchanged(adata, snap)


def test_dp_fit_refuses_values_that_are_not_counts_before_booking(small_adata, tiny_fit):
    """Non-integer, negative and non-finite values are refused up front, with the fix: the caller holds
    the cells, so that local check is not a release and books nothing (docs/privacy.md; a federated
    site reads such cells as 0 instead). Empty cells and genes read per cell."""
    fresh = small_adata.copy()
    for value, where in ((0.5, (0, 0)), (-1.0, (1, 1))):
        adata = _set(fresh.copy(), value, where)
        with pytest.raises(ValueError, match=r"non-integer values.*likelihood='gaussian'.*Nothing was spent"):
            dpsc.tl.fit(adata, epsilon=8.0, **tiny_fit)
        assert dpsc.privacy.spent(adata).epsilon == 0.0 and "X_dpdcan" not in adata.obsm
    adata = _zero_col(_zero_row(fresh.copy()))
    with pytest.warns(UserWarning):  # 300 cells are few at epsilon = 8
        dpsc.tl.fit(adata, epsilon=8.0, **tiny_fit)
    assert np.isfinite(adata.obsm["X_dpdcan"]).all()
    assert dpsc.privacy.get_record(adata, "X_dpdcan")["guarantee"] == "proven"
    with_nan = _set(fresh, np.nan, (2, 2))
    with pytest.raises(ValueError, match="NaN or infinite"):
        dpsc.tl.fit(with_nan, epsilon=8.0, **tiny_fit)
    assert dpsc.privacy.spent(with_nan).epsilon == 0.0


@pytest.mark.parametrize("epsilon", [8.0, None])
@pytest.mark.parametrize("dense", [False, True])
def test_the_nan_refusals_fix_runs_on_sparse_and_dense_x(small_adata, tiny_fit, dense, epsilon):
    import re

    adata = _set(small_adata.copy(), np.nan, (2, 2))
    if dense:
        adata.X = adata.X.toarray() if sp.issparse(adata.X) else adata.X
    with pytest.raises(ValueError, match="NaN or infinite") as refused:
        dpsc.tl.fit(adata, epsilon=epsilon, **tiny_fit)
    fix = re.search(r"e\.g\. adata = (adata\[.*?\]\.copy\(\))", str(refused.value)).group(1)
    kept = eval(fix, {"np": np, "adata": adata})  # the line the message gives, as a user pastes it
    assert kept.n_obs == adata.n_obs - 1
    assert np.isfinite(kept.X.toarray() if sp.issparse(kept.X) else kept.X).all()


def test_log_normalised_input_is_refused_from_public_metadata(small_adata):
    adata = small_adata.copy()
    adata.uns["log1p"] = {"base": None}  # what scanpy's sc.pp.log1p writes
    for call in (
        lambda: dpsc.tl.fit(adata, epsilon=8.0, n_clusters=3),
        lambda: dpsc.pp.pca(adata, epsilon=4.0),
        lambda: dpsc.pp.highly_variable_genes(adata, 50, epsilon=1.0),
    ):
        with pytest.raises(ValueError, match="log"):
            call()
    assert "dpsc" not in adata.uns


def test_log_data_without_metadata_is_refused_before_booking_with_the_fix(small_adata):
    """X log-normalised by another tool (no uns['log1p']): every path that reads counts refuses it,
    names the fix, books nothing and leaves the AnnData untouched."""
    import scanpy as sc

    logged = small_adata.copy()
    logged.layers["counts"] = logged.X.copy()
    sc.pp.normalize_total(logged)
    sc.pp.log1p(logged)
    del logged.uns["log1p"]  # another tool's log data carries no scanpy metadata
    before = logged.copy()
    for call in (
        lambda a: dpsc.tl.cluster(a, 3, epsilon=8.0),
        lambda a: dpsc.tl.rank_genes_groups(a, "cell_type", epsilon=2.0),
        lambda a: dpsc.pp.pca(a, epsilon=4.0),
        lambda a: dpsc.pp.highly_variable_genes(a, 50, epsilon=1.0),
        lambda a: dpsc.tl.fit(a, epsilon=8.0, n_clusters=3),
    ):
        with pytest.raises(ValueError, match=r"non-integer values .*layer='counts'.*Nothing was spent"):
            call(logged)
        assert "dpsc" not in logged.uns and dpsc.privacy.spent(logged).epsilon == 0.0
    assert (logged.X != before.X).nnz == 0 and set(logged.obs) == set(before.obs)
    dpsc.pp.pca(logged, epsilon=4.0, log_normalize=False)  # transformed data where the tool takes it


def test_error_messages_name_the_fix(small_adata):
    with pytest.raises(ValueError, match="likelihood='gaussian'"):
        dpsc.tl.fit(_set(small_adata, 0.5), epsilon=None)


def test_not_an_anndata():
    with pytest.raises(TypeError, match="AnnData"):
        dpsc.tl.fit(np.ones((20, 5)), epsilon=8.0)


def test_max_epochs_too_small(small_adata):
    with pytest.raises(ValueError, match="max_epochs"):
        dpsc.tl.fit(small_adata, epsilon=8.0, max_epochs=1)


def test_small_data_rule_reads_only_the_plan():
    import re

    from dpsc.tl._small_data import MIN_BATCH_PER_NOISE, batch_per_noise, small_data_message

    sigma = 2.3  # a default fit at ε = 8
    few = int(MIN_BATCH_PER_NOISE * sigma / 0.1) - 10
    message = small_data_message(few, 0.1, sigma, 8.0)
    assert message is not None and f"{few} cells" in message and "larger epsilon" in message
    assert batch_per_noise(few, 0.1, sigma) < MIN_BATCH_PER_NOISE
    assert small_data_message(4271, 0.1, sigma, 8.0) is None  # PBMC 4k at ε = 8
    # more noise (a smaller ε) needs more cells
    assert small_data_message(4271, 0.1, 4 * sigma, 1.0) is not None
    # each model's warning names the model; no measured figure in a user message
    full = small_data_message(few, 0.1, sigma, 8.0, reads_pcs=True)
    assert "principal-component model" in full and "gene-reading model" in message
    assert not re.search(r"ARI|0\.\d\d\b", full + message)


def test_large_n_defaults_read_only_the_number_of_cells():
    """δ stays 10x below 1/n and the default batch stops growing at 4096 cells, so q falls with n."""
    from dpsc._validation import check_fit_args, check_privacy_args, default_batch_size, resolve_delta
    from dpsc.model._dcan_privacy import TrainSettings, plan_fit

    assert resolve_delta(None, 4271) == 1e-5 and resolve_delta(3e-6, 10**6) == 3e-6
    for n in (10**4, 10**5, 10**6):
        delta = resolve_delta(None, n)
        assert delta <= 0.1 / n + 1e-18 and delta <= 1e-5
        check_privacy_args(8.0, delta, n)  # the default is always accepted
    assert default_batch_size(4271) == 427 and default_batch_size(10**6) == 4096
    assert check_fit_args(n_obs=10**6, n_clusters=8, scope="encoder", batch_size=None) == 4096
    plan = plan_fit(TrainSettings(epsilon=8.0), 10**6, n_clusters=8, input_pcs=None, latent_scale=3.0)
    assert plan.sample_rate == 4096 / 10**6 and plan.settings.noise_multiplier < 2.3
    assert plan.delta == resolve_delta(None, 10**6)
    # the model's own train() takes the same default delta at any n (it used to reject 1e-5 at 10^5)
    plan_fit(
        TrainSettings(epsilon=8.0, delta=None), 2 * 10**5, n_clusters=8, input_pcs=None, latent_scale=3.0
    )


def test_checks_read_backed_matrices_in_row_blocks(small_adata, tmp_path, monkeypatch):
    """Validation streams a backed matrix block by block and still finds a bad value in any block."""
    import anndata as ad

    from dpsc import _blocks, _validation

    monkeypatch.setattr(_blocks, "ROW_CHUNK", 64)
    bad = small_adata.copy()
    counts = bad.X.astype(np.float32).tolil()
    counts[250, counts[250].nonzero()[1][0]] = 0.5  # a non-integer in a later block
    bad.X = sp.csr_matrix(counts)
    bad.write_h5ad(tmp_path / "bad.h5ad")
    small_adata.write_h5ad(tmp_path / "good.h5ad")
    good = ad.read_h5ad(tmp_path / "good.h5ad", backed="r")
    _validation.check_matrix(good.X, "zinb")
    with pytest.raises(ValueError, match="non-integer"):
        _validation.check_matrix(ad.read_h5ad(tmp_path / "bad.h5ad", backed="r").X, "zinb")
