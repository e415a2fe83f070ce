"""The donor unit: every release of ``tl.cluster(donor_key=...)`` is DP per donor with all their cells.

The sensitivity tests run every release of the clustering's schedule (gene statistics, cell sum,
second moment, k-means sketch and Lloyd tables, the type count, the marker releases) on cohorts with
donors of uneven sizes, and remove one donor — the largest, a one-cell donor, a donor whose cells are
all extreme, a donor whose cells are not finite — from the un-noised sum: it may move by at most the
release's stated sensitivity Δ, the bound its noise is calibrated to.
"""

from __future__ import annotations

import warnings

import anndata as ad
import numpy as np
import pytest
import scipy.sparse as sp

import dpsc
from dpsc.methods.cluster_plan import plan_clustering
from dpsc.methods.cluster_requests import Request
from dpsc.methods.clustering import contribution, run_clustering
from dpsc.privacy import donor_weights
from dpsc.tl._reference import reference_basis
from test_reference import reference_pair


def with_donors(adata: ad.AnnData, seed: int = 0) -> ad.AnnData:
    """Cells with uneven donors: one donor of a single cell, one of many extreme cells, the rest random."""
    out = adata.copy()
    rng = np.random.default_rng(seed)
    donors = rng.choice([f"d{i}" for i in range(12)], size=out.n_obs, p=np.r_[0.3, np.full(11, 0.7 / 11)])
    donors[0] = "single"
    extreme = np.arange(1, 21)
    donors[extreme] = "extreme"
    X = sp.lil_matrix(out.X)
    for row in extreme:  # all of one gene, at a count far above the others
        X[row, :] = 0
        X[row, row % out.n_vars] = 5000
    out.X = sp.csr_matrix(X)
    out.obs["donor"] = donors
    return out


def requests_of(plan, matrix, weights, basis=None) -> list[Request]:
    """Every request of an honest central run of ``plan`` on these cells (its own noise: public here)."""
    from dpsc.privacy import NoiseSource

    seen: list[Request] = []
    central = dpsc.methods.clustering.central_release_sum(matrix, NoiseSource(3), weights=weights)

    def record(request: Request) -> np.ndarray:
        seen.append(request)
        return central(request)

    run_clustering(plan, record, basis)
    return seen


def assert_each_donor_moves_each_release_by_at_most_delta(adata, plan, basis=None) -> None:
    weights = donor_weights(adata, "donor", "test")
    requests = requests_of(plan, adata.X, weights, basis)
    kinds = {r.kind for r in requests}
    sizes = adata.obs["donor"].value_counts()
    removed = {"largest": sizes.index[0], "one cell": "single", "extreme cells": "extreme"}
    for words, donor in removed.items():
        keep = (adata.obs["donor"] != donor).to_numpy()
        rest = adata[keep]
        rest_weights = donor_weights(rest, "donor", "test")
        np.testing.assert_allclose(rest_weights, weights[keep])  # the others' weights do not change
        for request in requests:
            delta = request.release(adata.n_vars).sensitivity
            full = contribution(request, adata.X, weights=weights)
            without = contribution(request, rest.X, weights=rest_weights)
            moved = float(np.linalg.norm(np.asarray(full) - np.asarray(without)))
            assert moved <= delta * (1 + 1e-9), (words, request.kind, moved, delta)
    return kinds


def test_every_release_of_the_clustering_moves_by_at_most_its_sensitivity_per_donor(small_adata):
    adata = with_donors(small_adata)
    plan = plan_clustering(8.0, 1e-5, n_vars=adata.n_vars, n_clusters=3, n_obs=12, n_genes=150, markers=True)
    kinds = assert_each_donor_moves_each_release_by_at_most_delta(adata, plan)
    assert {"genes", "sum", "pca", "kmeans", "marker_center", "markers", "marker_focus"} <= kinds


def test_every_release_on_a_reference_moves_by_at_most_its_sensitivity_per_donor(pbmc_full):
    reference, private = reference_pair(pbmc_full)
    adata = with_donors(private, seed=1)
    _, basis = reference_basis(reference, "cell_type", adata, "test", markers=True, n_clusters=6)
    plan = plan_clustering(8.0, 1e-5, n_vars=adata.n_vars, n_clusters=6, public_basis=basis, markers=True)
    kinds = assert_each_donor_moves_each_release_by_at_most_delta(adata, plan, basis)
    assert {"type_count", "kmeans", "markers"} <= kinds


def test_a_donor_whose_cells_are_not_finite_moves_no_release_past_its_sensitivity(small_adata):
    """A non-finite cell contributes zero to every sum (a site's rule), so its donor moves nothing more."""
    adata = with_donors(small_adata, seed=2)
    X = adata.X.toarray().astype(np.float32)
    X[adata.obs["donor"].to_numpy() == "extreme"] = np.inf
    adata.X = sp.csr_matrix(X)
    plan = plan_clustering(8.0, 1e-5, n_vars=adata.n_vars, n_clusters=3, n_obs=12, n_genes=150)
    clean = with_donors(small_adata, seed=2)
    requests = requests_of(plan, clean.X, donor_weights(clean, "donor", "t"))
    weights = donor_weights(adata, "donor", "t")
    keep = (adata.obs["donor"] != "extreme").to_numpy()
    for request in requests:
        if request.kind in (
            "genes",
        ):  # gene statistics clip each square; a non-finite cell is refused centrally
            continue
        full = np.nan_to_num(contribution(request, adata.X, weights=weights), nan=np.inf)
        without = contribution(request, adata[keep].X, weights=weights[keep])
        assert np.linalg.norm(full - without) <= request.release(adata.n_vars).sensitivity * (1 + 1e-9)


def test_cluster_per_donor_records_the_unit_and_one_cell_donors_equal_the_cell_level_call(small_adata):
    per_cell, per_donor = small_adata.copy(), small_adata.copy()
    per_donor.obs["patient"] = [f"p{i}" for i in range(per_donor.n_obs)]  # one cell per donor
    dpsc.tl.cluster(per_cell, 3, epsilon=4.0, noise_seed=7)
    dpsc.tl.cluster(per_donor, 3, epsilon=4.0, noise_seed=7, donor_key="patient")
    np.testing.assert_allclose(
        per_donor.uns["dpsc"]["dp_cluster"]["centroids"], per_cell.uns["dpsc"]["dp_cluster"]["centroids"]
    )
    record = dpsc.privacy.get_record(per_donor, "dp_cluster")
    assert record["individual"] == "donor" and record["donor_key"] == "patient"
    assert "one donor (obs['patient']) with all of their cells" in record["statement"]
    assert "each cell weighted by 1/(its donor's number of cells)" in record["statement"]
    assert "person who appears under two donor IDs" in record["statement"]
    spent = dpsc.privacy.spent(per_donor)
    assert spent.unit == "donor" and spent.epsilon == pytest.approx(dpsc.privacy.spent(per_cell).epsilon)
    assert dpsc.privacy.spent(per_cell).unit == "cell"
    assert dpsc.privacy.ledger_frame(per_donor)["unit"].tolist() == ["donor"]


def test_one_unit_per_ledger(small_adata):
    adata = small_adata.copy()
    adata.obs["donor"] = np.arange(adata.n_obs) % 5
    dpsc.tl.cluster(adata, 3, epsilon=2.0, donor_key="donor")
    ledger = dict(adata.uns["dpsc"]["ledger"])
    with pytest.raises(ValueError, match=r"ledger is per donor.*Pass donor_key=.*Nothing was spent"):
        dpsc.tl.cluster(adata, 3, epsilon=2.0, key_added="again")
    assert dict(adata.uns["dpsc"]["ledger"]).keys() == ledger.keys() and "again" not in adata.obs


@pytest.mark.parametrize(
    ("donors", "words"),
    [
        ("missing", "is not a column of adata.obs"),
        ("nan", "have no donor"),
        ("one", "names one donor only"),
    ],
)
def test_bad_donor_columns_are_refused_before_anything_is_booked(small_adata, donors, words):
    adata = small_adata.copy()
    adata.obs["donor"] = pd_series(adata.n_obs, donors)
    before = adata.copy()
    key = "absent" if donors == "missing" else "donor"
    with pytest.raises(ValueError, match=words):
        dpsc.tl.cluster(adata, 3, donor_key=key)
    assert "dpsc" not in adata.uns and list(adata.obs) == list(before.obs)
    assert dpsc.privacy.spent(adata).epsilon == 0.0


def pd_series(n: int, kind: str):
    import pandas as pd

    values = pd.Series([f"d{i % 4}" for i in range(n)], dtype=object)
    if kind == "nan":
        values[3] = None
    if kind == "one":
        values[:] = "d0"
    return values.to_numpy()


def test_the_regime_warning_fires_before_booking_on_few_donors_and_not_on_many(small_adata, pbmc_full):
    few = small_adata.copy()
    few.obs["donor"] = np.arange(few.n_obs) % 6
    dpsc.privacy.set_budget(few, 1.0)  # the warning comes before the budget refuses: before booking
    with pytest.warns(
        UserWarning, match=r"with 6 donors this clustering would be dominated by noise.*Levers"
    ):
        with pytest.raises(dpsc.privacy.BudgetExceededError):
            dpsc.tl.cluster(few, 3, epsilon=8.0, donor_key="donor")
    many = pbmc_full.copy()
    many.obs["donor"] = np.arange(many.n_obs) % 2000
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*dominated by noise")
        warnings.filterwarnings("ignore", message="Only .* of the .* clusters")
        dpsc.tl.cluster(many, 8, epsilon=8.0, donor_key="donor")


def test_a_donor_like_column_is_named_once_for_a_per_cell_call(small_adata, monkeypatch):
    from dpsc.privacy import _unit

    monkeypatch.setattr(_unit, "_SAID", set())
    adata = small_adata.copy()
    adata.obs["patient_id"] = np.arange(adata.n_obs) % 4
    with pytest.warns(
        UserWarning, match=r"per cell, and obs\['patient_id'\] looks like a donor.*donor_key='patient_id'"
    ):
        dpsc.tl.cluster(adata, 3, epsilon=2.0)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*looks like a donor")
        dpsc.tl.cluster(adata.copy(), 3, epsilon=2.0)


def donors_by_site(adata: ad.AnnData, n_sites: int = 3, n_donors: int = 12) -> ad.AnnData:
    """Each cell a donor of uneven size, each donor at one site."""
    out = adata.copy()
    rng = np.random.default_rng(3)
    donor = rng.choice(n_donors, size=out.n_obs, p=rng.dirichlet(np.ones(n_donors)))
    out.obs["donor"] = [f"d{d}" for d in donor]
    out.obs["site"] = [f"s{d % n_sites}" for d in donor]
    return out


@pytest.mark.slow
@pytest.mark.optional_extra
def test_federated_donor_level_clustering_equals_the_central_one(small_adata):
    pytest.importorskip("flwr")
    adata = donors_by_site(small_adata)
    fed, central = adata.copy(), adata.copy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # 12 donors: the regime warning, in both
        dpsc.tl.cluster_federated(fed, "site", 3, epsilon=8.0, noise_seed=4, donor_key="donor")
        dpsc.tl.cluster(central, 3, epsilon=8.0, noise_seed=4, donor_key="donor")
    np.testing.assert_allclose(
        fed.uns["dpsc"]["dp_cluster"]["centroids"], central.uns["dpsc"]["dp_cluster"]["centroids"], atol=1e-5
    )
    record = dpsc.privacy.get_record(fed, "dp_cluster")
    assert record["individual"] == "donor" and "one donor with all of their cells" in record["statement"]
    assert dpsc.privacy.spent(fed).unit == "donor"
    assert dpsc.privacy.spent(fed).epsilon == pytest.approx(dpsc.privacy.spent(central).epsilon)


def test_a_donor_at_two_sites_is_refused_before_anything_is_booked(small_adata):
    adata = donors_by_site(small_adata)
    first = adata.obs_names[0]
    other = "s1" if adata.obs.loc[first, "site"] != "s1" else "s2"
    adata.obs.loc[first, "site"] = other  # one cell of a donor at another site
    with pytest.raises(ValueError, match=r"more than one site.*Give each donor one site"):
        dpsc.tl.cluster_federated(adata, "site", 3, donor_key="donor")
    assert "dpsc" not in adata.uns


def test_a_site_serves_only_plans_of_its_own_unit(small_adata, tmp_path):
    """A site with a donor_key refuses a per-cell plan, a site without one a per-donor plan; both before
    any cell is read, on the message only."""
    from dpsc.federated._site import Site, SiteRefusal, SiteSettings

    adata = donors_by_site(small_adata)
    path = tmp_path / "site.h5ad"
    adata.write_h5ad(path)
    plans = {
        unit: plan_clustering(8.0, 1e-5, n_vars=adata.n_vars, n_clusters=3, n_obs=adata.n_obs, unit=unit)
        for unit in ("cell", "donor")
    }
    assert type(plans["donor"]).from_config(plans["donor"].to_config()).unit == "donor"
    for donor_key, wrong in ((None, "donor"), ("donor", "cell")):
        ledger = tmp_path / f"{donor_key}.json"
        site = Site(SiteSettings(data=str(path), ledger=str(ledger), donor_key=donor_key))
        with pytest.raises(SiteRefusal, match=f"The run protects one {wrong}"):
            site.check_run(plans[wrong], "plain", 1, 2)
        site.check_run(plans["cell" if wrong == "donor" else "donor"], "plain", 1, 2)


def test_pp_releases_move_by_at_most_their_sensitivity_per_donor(small_adata):
    """pp.highly_variable_genes (Δ = √3) and pp.pca (Δ = 1): removing any one donor, weighted."""
    from dpsc.methods import hvg as _hvg
    from dpsc.methods import pca as _pca

    adata = with_donors(small_adata, seed=4)
    weights = donor_weights(adata, "donor", "test")
    releases = {
        _hvg.SENSITIVITY: lambda m, w: _hvg.gene_sums(m, True, 0.5, w),
        1.0: lambda m, w: _pca.upper(_pca.second_moment(m, True, weights=w)),
    }
    for donor in (adata.obs["donor"].value_counts().index[0], "single", "extreme"):
        keep = (adata.obs["donor"] != donor).to_numpy()
        for delta, release in releases.items():
            full = release(adata.X, weights)
            without = release(adata[keep].X, weights[keep])
            assert np.linalg.norm(full - without) <= delta * (1 + 1e-9), (donor, delta)


@pytest.mark.parametrize("storage", ["csr", "dense", "dask"])
def test_every_weighted_release_is_the_sum_over_donors_of_each_donors_sum_times_its_weight(
    small_adata, storage
):
    """Row-by-row weights inside each kind's sum equal the definition: Σ_d (1/m_d) · (donor d's exact sum)."""
    adata = with_donors(small_adata, seed=2)
    weights = donor_weights(adata, "donor", "test")
    plan = plan_clustering(8.0, 1e-5, n_vars=adata.n_vars, n_clusters=4, n_obs=12, n_genes=150, markers=True)
    requests = requests_of(plan, adata.X, weights)
    X = adata.X.toarray() if storage == "dense" else adata.X
    if storage == "dask":
        import dask.array as da

        X = da.from_array(adata.X.toarray(), chunks=(70, adata.n_vars))
    donors = adata.obs["donor"].to_numpy()
    for request in requests:
        weighted = np.asarray(contribution(request, X, weights=weights))
        definition = sum(
            weights[donors == d][0] * np.asarray(contribution(request, adata.X[np.flatnonzero(donors == d)]))
            for d in np.unique(donors)
        )
        assert np.allclose(weighted, definition, rtol=1e-9, atol=1e-9), request.kind


def test_pp_per_donor_records_the_unit_and_one_cell_donors_equal_the_cell_level_call(small_adata):
    for call, key in (
        (lambda a, **kw: dpsc.pp.pca(a, 4, epsilon=4.0, noise_seed=2, **kw), "X_pca"),
        (
            lambda a, **kw: dpsc.pp.highly_variable_genes(a, 50, epsilon=2.0, noise_seed=2, **kw),
            "highly_variable",
        ),
        (
            lambda a, **kw: dpsc.tl.rank_genes_groups(a, "cell_type", epsilon=2.0, noise_seed=2, **kw),
            "rank_genes_groups",
        ),
    ):
        per_cell, per_donor = small_adata.copy(), small_adata.copy()
        per_donor.obs["patient"] = [f"p{i}" for i in range(per_donor.n_obs)]
        call(per_cell)
        call(per_donor, donor_key="patient")
        record = dpsc.privacy.get_record(per_donor, key)
        assert record["individual"] == "donor" and "one donor (obs['patient'])" in record["statement"]
        if key == "X_pca":
            np.testing.assert_allclose(per_donor.varm["PCs"], per_cell.varm["PCs"], atol=1e-6)
        elif key == "highly_variable":
            assert (per_donor.var["highly_variable"] == per_cell.var["highly_variable"]).all()
        else:
            for group in per_cell.uns[key]["names"].dtype.names:
                assert list(per_donor.uns[key]["names"][group]) == list(per_cell.uns[key]["names"][group])
        assert dpsc.privacy.spent(per_donor).unit == "donor"


def test_the_runs_make_every_registered_kind_with_the_size_and_sensitivity_of_its_schedule(
    small_adata, pbmc_full
):
    """Each kind of :data:`dpsc.methods.release_kinds.REGISTRY` states its schedule steps and its
    release apart: a run's every request is released with its scheduled step's d and Δ, and the two
    runs of the sensitivity tests above (plain and on a gated reference, with markers) make every
    registered kind, so those tests cover any kind the registry adds."""
    from dpsc.methods.release_kinds import REGISTRY

    reference, private = reference_pair(pbmc_full)
    _, basis = reference_basis(reference, "cell_type", private, "test", markers=True, n_clusters=6)
    runs = [
        (
            small_adata,
            plan_clustering(
                8.0, 1e-5, n_vars=small_adata.n_vars, n_clusters=3, n_obs=12, n_genes=150, markers=True
            ),
            None,
        ),
        (
            private,
            plan_clustering(8.0, 1e-5, n_vars=private.n_vars, n_clusters=6, public_basis=basis, markers=True),
            basis,
        ),
    ]
    made = set()
    for adata, plan, start in runs:
        schedules = (
            {branch: plan.branch(branch).schedule() for branch in ("types", "sketch")} if plan.gated else {}
        )
        for request in requests_of(plan, adata.X, None, start):
            step = (schedules.get(request.branch) or plan.schedule())[request.index]
            release = request.release(adata.n_vars)
            assert release.sensitivity == step.sensitivity, request.kind
            assert release.size <= step.size and (request.kind == "marker_focus" or release.size == step.size)
            made.add(request.kind)
    assert made == set(REGISTRY)
