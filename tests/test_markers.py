"""Private marker genes: the bound of one cell, scanpy's format and statistics, the ledger."""

from __future__ import annotations

import warnings

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scanpy as sc
import scipy.sparse as sp

import dpsc
from dpsc.methods import markers as mechanism


@pytest.fixture
def grouped(small_adata):
    adata = small_adata.copy()
    rng = np.random.default_rng(0)
    adata.obs["group"] = pd.Categorical(rng.choice(["a", "b", "c"], adata.n_obs), categories=["a", "b", "c"])
    X = adata.X.toarray()
    X[adata.obs["group"] == "a", :5] += 30  # genes 0-4 mark group a
    adata.X = sp.csr_matrix(X)
    return adata


EXTREME_CELLS = [
    np.eye(50)[0] * 1e9,  # every count in one gene
    np.ones(50),  # counts spread evenly
    np.zeros(50),  # no counts
    np.r_[np.full(25, np.nan), np.full(25, 3.0)],  # not finite values read as 0
    -np.ones(50),
    np.random.default_rng(3).poisson(50.0, 50).astype(float),
]


@pytest.mark.parametrize("framed, focused", [(False, False), (True, False), (False, True), (True, True)])
def test_one_cell_moves_the_table_by_at_most_the_sensitivity(framed, focused):
    """Adding any one cell, however extreme, to any group changes the exact table by at most Δ, with the
    worst-case bounds and centre 0 or with a released centre and small bounds, over every gene or over
    a focused few (each cell's log expression from all of its counts)."""
    rng = np.random.default_rng(1)
    columns = np.sort(rng.choice(50, 12, replace=False)) if focused else None
    n_genes = 50 if columns is None else len(columns)
    frame = mechanism.MarkerFrame(rng.uniform(0, 3, n_genes), 2.0, 5.0) if framed else None
    table = mechanism.MarkerTable(3, n_genes, frame, columns=columns)
    base = rng.poisson(2.0, size=(40, 50)).astype(float)
    groups = rng.integers(0, 3, 40)
    before = mechanism.group_table(base, groups, table)
    for cell in EXTREME_CELLS:
        for group in range(3):
            after = mechanism.group_table(np.vstack([base, cell]), np.r_[groups, group], table)
            assert np.linalg.norm(after - before) <= table.sensitivity * (1 + 1e-9)
    outside = mechanism.group_table(np.vstack([base, EXTREME_CELLS[0]]), np.r_[groups, -1], table)
    np.testing.assert_array_equal(outside, before)  # a cell in no group adds nothing


def test_the_centre_and_the_bounds_are_released_with_their_stated_sensitivities():
    """One cell moves the centre's sums by at most 1 and the two histograms by exactly sqrt(2); each bound is
    its quantile bin's upper edge, below the worst case; the centre is the mean, shrunk by its noise."""
    rng = np.random.default_rng(2)
    base = rng.poisson(0.3, size=(200, 50)).astype(float)
    center_before = mechanism.center_sum(base)
    exact = mechanism.center_release(50, 0.0)
    center = mechanism.released_center(center_before, exact)
    np.testing.assert_allclose(center, mechanism._log_expression(base).mean(0), atol=1e-12)
    before = mechanism.norm_histograms(base, center)
    assert before.shape == (2 * mechanism.NORM_BINS,) and before.sum() == 400
    for cell in EXTREME_CELLS:
        grown = np.vstack([base, cell])
        assert np.linalg.norm(mechanism.center_sum(grown) - center_before) <= 1.0 + 1e-9
        after = mechanism.norm_histograms(grown, center)
        assert np.linalg.norm(after - before) == pytest.approx(np.sqrt(2.0))
    frame = mechanism.released_frame(before, center)
    y = frame.weights * (mechanism._log_expression(base) - center)
    for bound, norms, worst in zip(frame.bounds, (y, y**2), frame.worst, strict=True):
        norms = np.sqrt((norms**2).sum(1))
        edges = mechanism.norm_edges(worst)
        below = edges[np.searchsorted(edges, bound) - 1]  # the bin's lower edge
        assert np.mean(norms <= bound) >= mechanism.NORM_QUANTILE > np.mean(norms <= below)
        assert bound < 0.8 * worst  # below the worst case: less noise on the sums
    assert frame.bounds[0] < np.percentile(np.sqrt((mechanism._log_expression(base) ** 2).sum(1)), 95)
    noisy = mechanism.center_release(50, 1e6)  # a centre within its noise is shrunk to 0: no centring
    drawn = center_before + np.r_[noisy.noise_std * rng.normal(size=50), 0.0]  # the count kept exact
    assert not mechanism.released_center(drawn, noisy).any()
    assert mechanism.released_frame(-before, center).bounds == pytest.approx(frame.worst)


def test_gene_weights_grow_with_the_released_mean_and_keep_every_cell_within_the_worst_case():
    """The weights are a map of the centre (1 for a centre of zeros, root mean square 1, growing with the
    mean); no cell, however extreme, exceeds the frame's worst-case norms under them."""
    np.testing.assert_allclose(mechanism.gene_weights(np.zeros(50)), 1.0)
    center = np.r_[np.zeros(45), np.linspace(0.5, mechanism.MAX_LOG_EXPRESSION, 5)]  # a skewed centre
    weights = mechanism.gene_weights(center)
    assert np.sqrt(np.mean(weights**2)) == pytest.approx(1.0)
    assert np.all(np.diff(weights[44:]) > 0) and weights[-1] > 2 * weights[0]
    frame = mechanism.MarkerFrame(center)
    worst_sum, worst_square = frame.worst
    for cell in [*EXTREME_CELLS, np.r_[np.zeros(49), 1e9], np.r_[1e9, np.zeros(49)]]:
        y = weights * (mechanism._log_expression(cell[None, :]) - center)
        assert np.linalg.norm(y) <= worst_sum and np.linalg.norm(y**2) <= worst_square


@pytest.mark.parametrize(
    "hostile",
    [
        {"sum_bound": float("inf")},
        {"sum_bound": float("nan")},
        {"sum_bound": 0.0},
        {"square_bound": -1.0},
        {"square_bound": 1e9},
        {"sum_bound": True},
        {"sum_bound": "3"},
        {"center": np.full(50, -1.0)},
        {"center": np.full(50, 20.0)},
        {"center": np.full(49, 1.0)},
        {"center": np.r_[np.nan, np.ones(49)]},
    ],
)
def test_a_frame_outside_the_proofs_bounds_is_refused(hostile):
    frame = {"center": np.ones(50), "sum_bound": 3.0, "square_bound": 4.0, **hostile}
    with pytest.raises(mechanism.BoundError):
        mechanism.MarkerTable(3, 50, mechanism.MarkerFrame(**frame))


def test_without_epsilon_the_plan_holds_no_norm_release_and_no_focused_table():
    from dpsc.tl._rank_genes_groups import CENTER, FOCUS_NORMS, FOCUS_TABLE, NORMS, TABLE, markers_plan

    assert [r.name for r in markers_plan(None, 1e-5).releases] == [CENTER, TABLE]
    assert [r.name for r in markers_plan(2.0, 1e-5).releases] == [
        CENTER,
        NORMS,
        TABLE,
        FOCUS_NORMS,
        FOCUS_TABLE,
    ]


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
    # seeded: the two bounds below are read from two noisy histograms, and about one secret draw in
    # ten reads the focused one above the first (focused_frame's docstring)
    dpsc.tl.rank_genes_groups(adata, "group", epsilon=8, n_genes=10, noise_seed=0)
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
    assert record["sensitivity"] == pytest.approx(mechanism.SENSITIVITY)  # the table's Δ is recorded
    assert record["max_grad_norm"] == 0.0  # no DP-SGD clip norm in a sum release
    assert (
        len(record["history"]) == 5
    )  # centre, norms, table, then the focused norms and table: all accounted
    params = adata.uns["dpsc"]["rank_genes_groups"]["params"]
    assert 0 < params["expression_bound"] < mechanism.expression_bound(adata.n_vars)
    assert 0 < params["focus_expression_bound"] < params["expression_bound"]  # shorter cells over U
    assert mechanism.FOCUS_GENES <= params["focus_genes"] < adata.n_vars
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
        dpsc.tl.rank_genes_groups(plain, "dp_cluster")
    assert "rank_genes_groups" not in plain.uns


def test_after_tl_cluster_within_one_budget(small_adata):
    adata = small_adata.copy()
    dpsc.tl.cluster(adata, 3, epsilon=6)
    dpsc.tl.rank_genes_groups(adata, epsilon=2)  # groupby defaults to the clusters
    released = adata.uns["dpsc"]["rank_genes_groups"]["params"]["groups"]
    assert released == ["0", "1", "2"]  # the clustering's record: every cluster, with cells or not
    shown = set(adata.uns["rank_genes_groups"]["names"].dtype.names)
    assert shown == set(adata.obs["dp_cluster"].cat.categories) and shown <= set(released)
    assert dpsc.privacy.spent(adata).epsilon <= 8.0


def test_tl_cluster_releases_the_clusters_markers_inside_its_epsilon(small_adata):
    adata = small_adata.copy()
    dpsc.tl.cluster(adata, 3, epsilon=8, markers=True, noise_seed=1)
    assert dpsc.privacy.spent(adata).epsilon == pytest.approx(8.0, rel=0.01)  # one budget, five releases
    result = adata.uns["dp_cluster_markers"]
    assert result["params"]["groupby"] == "dp_cluster" and set(result["names"].dtype.names) == {"0", "1", "2"}
    record = dpsc.privacy.get_record(adata, "dp_cluster")
    assert "marker" in record["statement"] and record["guarantee"] == "proven"
    without = small_adata.copy()
    dpsc.tl.cluster(without, 3, epsilon=8, noise_seed=1)
    plan = dpsc.methods.cluster_plan.plan_clustering(
        8.0, 1e-5, n_vars=200, n_clusters=3, n_obs=300, markers=True
    )
    # the k-means' releases are one history entry of kmeans_steps steps
    kinds = [r.kind for r in plan.schedule()][-5:]
    assert kinds == ["marker_center", "marker_norms", "markers", "marker_focus_norms", "marker_focus"]
    assert plan.n_releases == len(plan.history()) + plan.kmeans_steps - 1
    written = adata.uns["dpsc"]["dp_cluster"]["markers"]
    assert 0 < written["focus_genes"] <= 3 * dpsc.methods.markers.FOCUS_GENES
    assert "dp_cluster_markers" not in without.uns


def test_a_clustering_without_epsilon_gives_its_clusters_exact_markers(small_adata):
    adata = small_adata.copy()
    dpsc.tl.cluster(adata, 3, epsilon=None, markers=True)  # refused its own marker request before
    plan = dpsc.methods.cluster_plan.plan_clustering(None, 1e-5, n_vars=200, n_clusters=3, markers=True)
    assert [r.kind for r in plan.schedule()][-2:] == ["marker_center", "markers"]  # no histogram to release
    exact = adata.copy()
    dpsc.tl.rank_genes_groups(exact, "dp_cluster", epsilon=None, n_genes=20)
    ours, reference = adata.uns["dp_cluster_markers"], exact.uns["rank_genes_groups"]
    for group in ours["names"].dtype.names:
        assert list(ours["names"][group][:20]) == list(reference["names"][group])
        np.testing.assert_allclose(ours["scores"][group][:20], reference["scores"][group], rtol=1e-3)


def test_sparse_counts_give_the_dense_tables_without_densifying():
    """The sparse path (each sum expanded around the centre) gives the dense rows' values."""
    rng = np.random.default_rng(4)
    dense = rng.poisson(0.5, (300, 40)).astype(float)
    dense[3], dense[4, 5], dense[6, 7] = 0.0, np.nan, -2.0
    counts = sp.csr_matrix(dense)
    center = rng.uniform(0, 2, 40)
    codes = rng.integers(-1, 4, 300)
    np.testing.assert_array_equal(mechanism.center_sum(counts), mechanism.center_sum(dense))
    np.testing.assert_array_equal(
        mechanism.norm_histograms(counts, center), mechanism.norm_histograms(dense, center)
    )
    for frame in (None, mechanism.MarkerFrame(center, 3.0, 6.0)):
        table = mechanism.MarkerTable(4, 40, frame)
        np.testing.assert_allclose(
            mechanism.group_table(counts, codes, table),
            mechanism.group_table(dense, codes, table),
            atol=1e-10,
        )


def test_a_focused_table_reads_whole_cells_restricted_to_its_genes():
    """Over genes U the exact table holds the full table's values at U in the data's units (log1p(CP10k)
    of whole cells), sparse or dense, and the histograms count every cell once from its norm over U."""
    rng = np.random.default_rng(5)
    dense = rng.poisson(0.7, (200, 40)).astype(float)
    counts = sp.csr_matrix(dense)
    codes = rng.integers(-1, 3, 200)
    genes = np.array([1, 4, 9, 22, 30, 39])
    whole = mechanism.MarkerTable(3, 40)
    full = mechanism.group_table(dense, codes, whole).reshape(3, -1)
    for matrix in (dense, counts):
        table = mechanism.MarkerTable(3, 6, columns=genes)
        focused = mechanism.group_table(matrix, codes, table).reshape(3, -1)
        for k, part in enumerate(("sum", "squares", "detected")):  # in the data's units, at U
            at_genes = full[:, k * 40 + genes] * whole.scale(part)
            np.testing.assert_allclose(
                focused[:, k * 6 : (k + 1) * 6] * table.scale(part), at_genes, atol=1e-9
            )
        np.testing.assert_allclose(focused[:, -1], full[:, -1])
        histograms = mechanism.norm_histograms(matrix, np.zeros(6), genes)
        assert histograms[: mechanism.NORM_BINS].sum() == histograms[mechanism.NORM_BINS :].sum() == 200
    with pytest.raises(mechanism.BoundError, match="distinct gene indices"):
        mechanism.MarkerTable(3, 3, columns=np.array([1, 1, 2]))


def test_the_focused_ranking_lists_its_genes_first_with_their_focused_statistics():
    """U (each group's best genes in the first table) is ranked by the focused table's scores and comes
    first; the other genes follow in the first table's order; adjusted p-values are recomputed."""
    rng = np.random.default_rng(6)

    def result(n_genes):
        scores = rng.normal(size=(2, n_genes))
        pvals = rng.uniform(size=(2, n_genes))
        fields = {name: rng.uniform(size=(2, n_genes)) for name in ("logfoldchanges", "pts", "pts_rest")}
        order = np.argsort(-scores, axis=1)
        return mechanism.MarkerResult(order, scores, pvals, pvals, counts=np.array([10.0, 20.0]), **fields)

    first = result(30)
    genes = mechanism.focus_genes(first, 4)
    assert set(genes) == set(first.order[:, :4].ravel()) and np.all(np.diff(genes) > 0)
    focused = result(len(genes))
    joined = mechanism.focused_result(first, focused, genes)
    for k in range(2):
        assert list(joined.order[k, : len(genes)]) == list(genes[focused.order[k]])
        assert sorted(joined.order[k]) == list(range(30))
        rest = [g for g in first.order[k] if g not in set(genes)]
        assert list(joined.order[k, len(genes) :]) == rest
    np.testing.assert_array_equal(joined.scores[:, genes], focused.scores)
    outside = np.setdiff1d(np.arange(30), genes)
    np.testing.assert_array_equal(joined.pts[:, outside], first.pts[:, outside])
    assert np.all(joined.pvals_adj >= joined.pvals) and np.all(joined.pvals_adj <= 1)


def test_a_noise_only_group_gets_finite_fold_changes_without_overflow():
    """An empty cluster's noisy sums (count clipped to 1) can give means far above any log expression;
    its fold changes stay finite and nothing overflows (the mean is capped at log(1 + 10^4))."""
    import warnings

    genes = 5
    stats = mechanism.GroupStatistics(
        counts=np.array([0.2, 400.0]),
        sums=np.array([[900.0, -50.0, 3.0, 0.0, 2000.0], [400.0] * genes]),
        squares=np.array([[1e5, 10.0, 9.0, 0.0, 4e6], [800.0] * genes]),
        detected=np.array([[1.0, 0.0, 1.0, 0.0, 1.0], [200.0] * genes]),
        sum_noise_sd=np.full(genes, 5.0),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        result = mechanism.rank_markers(stats)
    assert np.isfinite(result.logfoldchanges).all()
    assert result.logfoldchanges[0, 4] == pytest.approx(result.logfoldchanges[0, 0])  # both at the cap


def test_noisy_variances_move_toward_their_trend_and_exact_ones_stay():
    """The shrinkage is post-processing that lowers the error of noisy variances (Gaussian noise of
    known sd around a smooth mean–variance trend) and leaves variances without noise untouched."""
    rng = np.random.default_rng(0)
    genes = 2000
    mean = np.sort(rng.uniform(0.0, 3.0, genes))[None, :]
    true = 0.5 * mean + rng.gamma(4.0, 0.05, (1, genes))  # a trend plus gene-to-gene spread
    noise_sd = np.full((1, genes), 0.6)
    noisy = true + rng.normal(0.0, 1.0, true.shape) * noise_sd
    shrunk = mechanism.shrunk_variances(noisy, mean, noise_sd**2)
    assert np.mean((shrunk - true) ** 2) < 0.5 * np.mean((np.maximum(noisy, 0) - true) ** 2)
    np.testing.assert_array_equal(mechanism.shrunk_variances(true, mean, np.zeros_like(true)), true)


def test_the_noise_of_a_group_variance_is_what_the_released_sums_give_it():
    """Monte Carlo over many draws of the table's noise: the variance computed from the noisy sums
    (measured from a centre, shifted back as `group_statistics` does) varies as `variance_noise` says,
    for a gene near the centre and one far from it."""
    rng = np.random.default_rng(2)
    n, draws, s1, s2 = 300.0, 200_000, 4.0, 6.0
    for mean, center in ((1.0, 0.9), (3.0, 0.5)):
        x = rng.normal(mean, 0.7, int(n))
        y1, y2 = (x - center).sum(), ((x - center) ** 2).sum()
        e1, e2 = rng.normal(0, s1, draws), rng.normal(0, s2, draws)
        sums = y1 + e1 + n * center
        squares = y2 + e2 + 2 * center * (y1 + e1) + n * center**2
        variance = (squares / n - (sums / n) ** 2) * n / (n - 1)
        expected = mechanism.variance_noise(n, x.mean(), center, s1, s2)
        assert variance.var() == pytest.approx(expected, rel=0.05)


def test_the_projection_keeps_the_directions_above_the_noise_and_lowers_the_error():
    """Released sums of rank 3 (12 groups × 2,000 genes) under unit noise: the projection keeps
    exactly the three directions standing above the noise's spectrum, removes most of the noise,
    and leaves sums without noise as they are."""
    rng = np.random.default_rng(3)
    groups, genes = 12, 2000
    signal = rng.normal(0, 1, (groups, 3)) @ rng.normal(0, 3, (3, genes))
    noisy = signal + rng.normal(0, 1, signal.shape)
    projected, covariance = mechanism.projected_sums(noisy, 1.0)
    assert np.trace(covariance) == pytest.approx(3.0)
    np.testing.assert_allclose(covariance @ covariance, covariance, atol=1e-10)  # a projector
    assert np.mean((projected - signal) ** 2) < 0.4 * np.mean((noisy - signal) ** 2)
    unchanged, identity = mechanism.projected_sums(signal, 0.0)
    np.testing.assert_array_equal(unchanged, signal)
    np.testing.assert_array_equal(identity, np.eye(groups))


def test_the_noise_shares_of_a_group_and_its_rest_follow_the_projector():
    """For a fixed projector P, the noise left in a group's sums (P E) and in the sum of the other
    groups' has the variances `_noise_shares` gives; the identity gives 1 and K − 1."""
    rng = np.random.default_rng(4)
    groups = 6
    left = np.linalg.qr(rng.normal(size=(groups, 3)))[0]
    projector = left @ left.T
    noise = projector @ rng.normal(0, 1, (groups, 100_000))
    own, others = mechanism._noise_shares(projector, groups)
    rest = noise.sum(0, keepdims=True) - noise
    np.testing.assert_allclose(noise.var(1), own, rtol=0.03)
    np.testing.assert_allclose(rest.var(1), others, rtol=0.03, atol=0.01)
    own, others = mechanism._noise_shares(None, groups)
    np.testing.assert_array_equal(own, np.ones(groups))
    np.testing.assert_array_equal(others, np.full(groups, groups - 1.0))


def test_a_lone_marker_below_the_noise_edge_survives_the_projection():
    """A group set apart by five genes only (each 7 noise sds: too little energy for a direction of
    its own above the noise's spectrum, so the first step mostly drops it) keeps those five genes
    at the top of its row: the residual's entries that stand out of its noise are added back.
    Over 40 draws of the noise; the first step alone keeps fewer than half of them."""
    groups, genes, found, directions_only = 12, 2000, [], []
    for seed in range(40):
        rng = np.random.default_rng(seed)
        signal = rng.normal(0, 1, (groups, 3)) @ rng.normal(0, 3, (3, genes))
        signal[0] = 0.0
        signal[0, :5] = 7.0
        noisy = signal + rng.normal(0, 1, signal.shape)
        projected, projector = mechanism.projected_sums(noisy, 1.0)
        found.append(len(set(np.argsort(-projected[0])[:5]) & set(range(5))) / 5)
        directions_only.append(len(set(np.argsort(-(projector @ noisy)[0])[:5]) & set(range(5))) / 5)
    assert np.mean(found) >= 0.95
    assert np.mean(directions_only) < 0.5


def test_scanpy_plots_read_a_clustering_with_empty_clusters_and_the_release_keeps_every_group(pbmc_full):
    import matplotlib
    import scanpy as sc

    matplotlib.use("Agg")
    cells = pbmc_full.copy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dpsc.tl.cluster(cells, 16, epsilon=1, noise_seed=3)
        dpsc.tl.rank_genes_groups(cells, "dp_cluster", epsilon=1, noise_seed=3)
    labels = cells.obs["dp_cluster"]
    assert (labels.value_counts() > 0).all() and len(labels.cat.categories) < 16
    params = cells.uns["dpsc"]["rank_genes_groups"]["params"]
    assert params["groups"] == [str(i) for i in range(16)]  # the release's groups: the record's count
    assert list(cells.uns["rank_genes_groups"]["names"].dtype.names) == list(labels.cat.categories)
    sc.pl.rank_genes_groups_dotplot(cells, n_genes=2, show=False)
    sc.pl.dotplot(cells, list(cells.var_names[:3]), groupby="dp_cluster", show=False)
    sc.pl.embedding(cells, basis="X_dp_cluster", color="dp_cluster", show=False)  # as sc.pl.umap draws
