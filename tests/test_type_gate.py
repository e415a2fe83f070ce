"""The count that chooses the k-means start on a reference with types (dpsc.methods.type_gate)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import dpsc
from dpsc.methods import type_gate as _type_gate
from dpsc.methods.cluster_design import BRANCHES, kmeans_plan, kmeans_steps
from dpsc.methods.cluster_plan import plan_clustering
from dpsc.methods.cluster_requests import Request
from dpsc.tl._reference import reference_basis
from test_reference import reference_pair


@pytest.fixture
def pair(pbmc_full):
    return reference_pair(pbmc_full)


def _other_types(reference):
    """A reference of one PBMC type only, split in two labels: most private cells are of no type of it."""
    one = reference[reference.obs["cell_type"] == "type_1"].copy()
    one.obs["cell_type"] = np.where(np.arange(one.n_obs) % 2, "a", "b")
    return one


def test_one_cell_moves_one_count_by_one_and_the_gate_keeps_the_types_unless_clearly_outside():
    rng = np.random.default_rng(0)
    start, radii = rng.normal(size=(3, 4)), np.array([1.0, 1.5, 0.0])
    points = rng.normal(size=(50, 4))
    counts = _type_gate.inside_counts(points, start, radii)
    for extra in (start[0] + 0.01, start[2] + 5.0):  # one cell more: one of the two counts, by 1
        more = _type_gate.inside_counts(np.vstack([points, extra]), start, radii)
        assert np.abs(more - counts).sum() == 1 and np.linalg.norm(more - counts) == _type_gate.SENSITIVITY
    assert counts.sum() == 50
    sigma = 10.0
    assert _type_gate.starts_from_types(np.array([60.0, 40.0]), sigma)  # most inside
    assert _type_gate.starts_from_types(np.array([40.0, 60.0]), sigma)  # fewer, but within the noise
    assert not _type_gate.starts_from_types(np.array([5.0, 95.0]), sigma)  # clearly outside
    assert _type_gate.starts_from_types(np.array([5.0, 95.0]), 100.0)  # the same count, mostly noise


def test_both_branches_of_a_gated_plan_spend_at_most_epsilon_with_one_count(pair):
    reference, private = pair
    _, basis = reference_basis(reference, "cell_type", private, "test", markers=True, n_clusters=6)
    for markers in (False, True):
        plan = plan_clustering(
            4.0, 1e-5, n_vars=private.n_vars, n_clusters=6, public_basis=basis, markers=markers
        )
        assert plan.gated and plan.kinds[0] == "type_count"
        branches = [plan.branch(start) for start in BRANCHES]
        assert branches[0].to_config() == plan.to_config()
        assert [b.kmeans_steps for b in branches] == [kmeans_steps(kmeans_plan(s)) for s in (True, False)]
        assert len({b.sigmas["type_count"] for b in branches}) == 1  # release 0 is the same in both
        for branch in branches:
            assert 3.9 <= branch.spent() <= 4.0 * (1 + 1e-9)
            assert branch.n_releases <= plan.most_releases
        assert type(plan).from_config(plan.to_config()).branch("sketch") == branches[1]
        from dpsc.federated._pipeline import _releases_of  # what a deployed site prints per release

        assert _releases_of(plan, {}) == f"up to {plan.most_releases}"
        assert [_releases_of(plan, {"branch": b}) for b in BRANCHES] == [str(b.n_releases) for b in branches]
    ungated = plan_clustering(
        4.0, 1e-5, n_vars=private.n_vars, n_clusters=6, public_basis=basis.with_start(None)
    )
    assert not ungated.gated
    with pytest.raises(ValueError, match="Only a gated plan"):
        ungated.branch("sketch")


def test_a_reference_of_other_types_starts_from_the_sketch_within_the_same_epsilon(pair):
    """Cells mostly outside the reference's types: the count chooses the sketch, the record says so,
    and the clustering spends the same ε as on a reference of their types."""
    reference, private = pair
    matching, other = private.copy(), private.copy()
    dpsc.tl.cluster(matching, 6, epsilon=4.0, reference=reference, reference_key="cell_type", noise_seed=5)
    dpsc.tl.cluster(
        other, 6, epsilon=4.0, reference=_other_types(reference), reference_key="cell_type", noise_seed=5
    )
    records = [dpsc.privacy.get_record(cells, "dp_cluster") for cells in (matching, other)]
    steps = [[h[2] for h in record["history"]] for record in records]
    assert steps == [[1, 1], [1, kmeans_steps(kmeans_plan())]]
    np.testing.assert_allclose(records[0]["history"][0], records[1]["history"][0])  # the same count release
    assert (
        "the k-means' own sketch" in records[1]["statement"]
        and "types' mean points" in records[0]["statement"]
    )
    for cells in (matching, other):
        assert 3.9 <= dpsc.privacy.spent(cells)[0] <= 4.0 * (1 + 1e-9)
    _, basis = reference_basis(_other_types(reference), "cell_type", private, "test", n_clusters=6)
    exact = _type_gate.inside_counts(np.asarray(basis.points(private.X)), basis.start, basis.start_radii)
    assert exact[0] < exact[1] / 4  # the premise: most cells lie outside that reference's types


def test_a_site_counts_in_its_own_copy_and_follows_one_start(pair, tmp_path):
    """A site serves the count from its own copy's types (whatever basis the server sent), then holds
    the run to the start the server named first; a request of the other start is refused unbooked."""
    from dpsc.federated._site import Site, SiteRefusal
    from dpsc.methods.kmeans import Assignment
    from dpsc.tl._reference import fingerprint
    from test_reference import _basis_request, _site_files

    reference, private = pair
    settings = [replace(s, reference_key="cell_type") for s in _site_files(private, reference, tmp_path)]
    site = Site(settings[0])
    key = fingerprint(reference.X, reference.var_names)
    own, _, start, radii = site.basis_and_start(key, 6)
    plan = plan_clustering(
        8.0, 1e-5, n_vars=private.n_vars, n_clusters=6, public_basis=own.with_start(start, radii)
    )
    state: dict = {}
    wrong = own.with_start(start + 1.0, radii * 0)  # a server's start the site does not use
    count = site.contribute(
        plan, Request("type_count", 0, plan.sigmas["type_count"], basis=wrong), "plain", 1, 2, state, key
    )
    assert count.shape == (2,)
    centroids = Assignment("nearest", start)
    lloyd = Request(
        "kmeans", 1, plan.sigmas["kmeans"], own.genes, own.loadings, centroids, basis=own, branch="types"
    )
    site.contribute(plan, lloyd, "plain", 1, 2, state, key)
    assert state["branch"] == "types" and state["served"] == 2
    from dpsc.privacy._ledger import compose

    served = compose(dpsc.privacy.FileLedger(settings[0].ledger).entries())  # at the lines' summed δ
    assert served.delta == pytest.approx(1e-5) and served.epsilon <= 8.0 * (1 + 1e-9)
    ledger = dpsc.privacy.FileLedger(settings[1].ledger)
    other: dict = {}
    count_request = Request("type_count", 0, plan.sigmas["type_count"], basis=own)
    Site(settings[1]).contribute(plan, count_request, "plain", 1, 2, other, key)
    switched = replace(_basis_request(plan.branch("sketch"), own, index=1), branch="sketch")
    Site(settings[1]).contribute(plan, switched, "plain", 1, 2, other, key)  # the sketch start, named first
    with pytest.raises(SiteRefusal, match="follows the sketch one"):
        Site(settings[1]).contribute(plan, replace(lloyd, index=2), "plain", 1, 2, other, key)
    assert [e["key"] for e in ledger.entries()] == ["release 0: type_count", "release 1: kmeans"]
    third = Site(replace(settings[1], ledger=str(tmp_path / "third.json")))
    unnamed: dict = {}
    third.contribute(plan, count_request, "plain", 1, 2, unnamed, key)
    with pytest.raises(SiteRefusal, match="unnamed"):
        third.contribute(plan, replace(lloyd, branch=""), "plain", 1, 2, unnamed, key)
    assert len(dpsc.privacy.FileLedger(tmp_path / "third.json").entries()) == 1  # the refusal booked nothing
    from dpsc.methods.clustering import ClusterResult

    result = ClusterResult(own.genes, own.loadings, np.zeros(0), start)
    with pytest.raises(SiteRefusal, match="after 1 of the run's 2 releases"):  # no branch served: no results
        third.finish(result, plan, "plain", 1, 2, unnamed, key)


@pytest.mark.slow
@pytest.mark.optional_extra
def test_a_federated_run_on_a_reference_of_other_types_records_the_sketch_start_as_central(pair):
    """Over sites, the count chooses the sketch as the central call does, and the record composes
    the releases of that branch (not the type start's)."""
    pytest.importorskip("flwr")
    reference, private = pair
    other = _other_types(reference)
    dpsc.pp.partition(private, 2, random_state=0)
    fed, central = private.copy(), private.copy()
    given = {"epsilon": 4.0, "noise_seed": 5, "reference": other, "reference_key": "cell_type"}
    dpsc.tl.cluster_federated(fed, "site", 6, **given)
    dpsc.tl.cluster(central, 6, **given)
    records = [dpsc.privacy.get_record(cells, "dp_cluster") for cells in (fed, central)]
    for record in records:
        assert [h[2] for h in record["history"]] == [1, kmeans_steps(kmeans_plan())]
    np.testing.assert_allclose(records[0]["history"], records[1]["history"])
    assert dpsc.privacy.spent(fed).epsilon == pytest.approx(dpsc.privacy.spent(central).epsilon)
    np.testing.assert_allclose(
        fed.uns["dpsc"]["dp_cluster"]["centroids"], central.uns["dpsc"]["dp_cluster"]["centroids"], atol=1e-4
    )


def _gate_sites(pair, tmp_path, budget=100.0):
    """Two sites on D (the private cells) and D − 1 (one cell fewer), each with its own reference copy."""
    import anndata as ad

    from dpsc.federated._site import Site, SiteSettings
    from dpsc.tl._reference import fingerprint

    reference, private = pair
    reference_path = tmp_path / "reference.h5ad"
    reference.write_h5ad(reference_path)
    sites = []
    for name, cells in (("D", private), ("D_minus_one", private[1:])):
        path = tmp_path / f"{name}.h5ad"
        ad.AnnData(cells.X, var=cells.var[[]].copy()).write_h5ad(path)
        settings = SiteSettings(
            data=str(path),
            epsilon=8.0,
            budget=budget,
            reference=str(reference_path),
            reference_key="cell_type",
            ledger=str(tmp_path / f"{name}.ledger.json"),
        )
        sites.append(Site(settings))
    return sites, fingerprint(reference.X, reference.var_names)


def _gate_requests(plan, own, start, branch="types"):
    from dpsc.methods.kmeans import Assignment

    count = Request("type_count", 0, plan.sigmas["type_count"], basis=own)
    sigma = plan.branch(branch).sigmas["kmeans"]
    lloyd = Request(
        "kmeans", 1, sigma, own.genes, own.loadings, Assignment("nearest", start), basis=own, branch=branch
    )
    return count, lloyd


def test_the_gate_attack_is_refused_at_the_plan_check_on_both_neighbours(pair, tmp_path):
    """A crafted gated plan (the sketch's k-means as its own, then the type start at a small σ) is
    refused before any release on D and on D − 1 alike; an honest gated run is still served."""
    from dpsc.federated._site import SiteRefusal
    from dpsc.methods.cluster_plan import ClusterPlan

    sites, key = _gate_sites(pair, tmp_path)
    own, _, start, radii = sites[0].basis_and_start(key, 6)
    honest = plan_clustering(
        8.0, 1e-5, n_vars=sites[0].adata.n_vars, n_clusters=6, public_basis=own.with_start(start, radii)
    )
    sketch = honest.branch("sketch")
    config = honest.to_config()
    small = 0.148
    crafted = {  # the review's attack: both checked pairs were the sketch branch
        "sketch settings as the plan's own": {
            "kmeans-sketch-steps": sketch.kmeans["n_sketch_steps"],
            "sigma-kmeans": sketch.sigmas["kmeans"],
            "sigma-kmeans-types": small,
        },
        "the type start's own σ small": {"sigma-kmeans": small, "sigma-kmeans-types": small},
        "the sketch branch's σ small": {"sigma-kmeans-sketch": small},
    }
    for words, change in crafted.items():
        plan = ClusterPlan.from_config({**config, **change})
        for site in sites:
            count, _ = _gate_requests(plan, own, start)
            with pytest.raises(SiteRefusal):
                site.contribute(plan, count, "plain", 1, 2, {}, key)
            assert site.ledger.entries() == [], words
    for site in sites:  # the control: an honest gated run is served whole
        state: dict = {}
        for request in _gate_requests(honest, own, start):
            site.contribute(honest, request, "plain", 1, 2, state, key)
        assert state["served"] == 2 and len(site.ledger.entries()) == 2


@pytest.mark.parametrize("mode", ["plain", "secure"])
def test_a_run_never_books_past_the_sites_per_run_epsilon_even_through_a_hole_in_the_plan_check(
    pair, tmp_path, monkeypatch, mode
):
    """The second line: with the plan check disabled (a hole), the crafted type start is refused at its
    first booking over the run's own ε (plain) or fallback cap (secure), though the total budget is 100."""
    from dpsc.federated._site import Site, SiteRefusal
    from dpsc.methods.cluster_plan import ClusterPlan
    from dpsc.privacy import compose

    sites, key = _gate_sites(pair, tmp_path)
    own, _, start, radii = sites[0].basis_and_start(key, 6)
    honest = plan_clustering(
        8.0, 1e-5, n_vars=sites[0].adata.n_vars, n_clusters=6, public_basis=own.with_start(start, radii)
    )
    plan = ClusterPlan.from_config({**honest.to_config(), "sigma-kmeans": 0.148, "sigma-kmeans-types": 0.148})
    monkeypatch.setattr(Site, "_check_calibration", lambda self, plan, reference="": None)
    monkeypatch.setattr(Site, "_check_trust", lambda self, plan, threshold, n_sites: None)
    threshold = 2 if mode == "secure" else 1
    for site in sites:
        state: dict = {}
        count, lloyd = _gate_requests(plan, own, start)
        site.contribute(plan, count, mode, threshold, 2, state, key)
        with pytest.raises(SiteRefusal, match="for one run"):
            site.contribute(plan, lloyd, mode, threshold, 2, state, key)
        assert [e["key"] for e in site.ledger.entries()] == ["release 0: type_count"]
        assert compose(site.ledger.entries()).epsilon <= 8.0
    # the honest run in secure mode stays within both per-run caps
    monkeypatch.undo()
    site = Site(replace(sites[0].settings, ledger=str(tmp_path / "honest.json")))
    state = {}
    for request in _gate_requests(honest, own, start):
        site.contribute(honest, request, mode, threshold, 3, state, key)
    assert state["served"] == 2
