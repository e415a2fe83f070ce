"""``tl.cluster(reference=...)``: a public reference's basis, only the k-means spends, names from it."""

from __future__ import annotations

import json

import anndata as ad
import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score

import dpsc
from dpsc.methods.cluster_design import kmeans_steps
from dpsc.methods.cluster_plan import plan_clustering
from dpsc.methods.cluster_requests import Request, ScheduleError
from dpsc.methods.kmeans import Assignment
from dpsc.methods.public_basis import PublicBasis
from dpsc.tl._reference import UNMATCHED, fingerprint


@pytest.fixture
def pair(pbmc_full):
    return reference_pair(pbmc_full)


def reference_pair(pbmc_full):
    """A reference of 1,500 PBMC cells and 300 other cells as the private cohort (400 top genes)."""
    order = np.random.default_rng(1).permutation(pbmc_full.n_obs)
    totals = np.asarray(pbmc_full.X.sum(0)).ravel()
    genes = np.sort(np.argsort(-totals)[:400])
    reference = pbmc_full[np.sort(order[:1500]), genes].copy()
    private = pbmc_full[np.sort(order[1500:1800]), genes].copy()
    return reference, private


def test_a_reference_lifts_a_small_cohort_and_spends_only_on_the_kmeans(pair):
    reference, private = pair
    truth = private.obs["cell_type"].to_numpy()
    alone, guided = private.copy(), private.copy()
    dpsc.tl.cluster(alone, 8, noise_seed=3)
    dpsc.tl.cluster(guided, 8, reference=reference, noise_seed=3)
    scores = [adjusted_rand_score(truth, cells.obs["dp_cluster"]) for cells in (alone, guided)]
    assert scores[1] > scores[0] + 0.1, scores
    record = guided.uns["dpsc"]["dp_cluster"]["privacy"]
    assert record["guarantee"] == "proven"
    assert record["epsilon"] == pytest.approx(8.0, rel=1e-3)
    assert dpsc.privacy.spent(guided)[0] == pytest.approx(8.0, rel=1e-3)
    assert record["mechanisms"] == ["kmeans: sigma=" + record["mechanisms"][0].split("=")[1]]
    assert record["history"][0][2] == kmeans_steps(dict(dpsc.methods.cluster_design.kmeans_plan()))
    stated = record["reference"]
    assert stated["fingerprint"] == fingerprint(reference.X, reference.var_names)
    assert stated["n_obs"] == reference.n_obs
    assert "assumed public" in record["statement"]
    assert guided.obsm["X_dp_cluster"].shape == (private.n_obs, 16)
    assert guided.var["dp_cluster_gene"].sum() == stated["n_genes"]


def test_with_types_the_kmeans_starts_from_their_means_in_one_release_and_does_better(pair):
    """With reference_key the plan opens with the count that chooses the start; on cells of the
    reference's types it chooses the type means: PUBLIC_START_ROUNDS Lloyd releases of them, no
    sketch, and the clustering of the same cells at the same seed is closer to their types than
    the one that starts from its own sketch."""
    from dpsc.methods.cluster_design import PUBLIC_START_ROUNDS, kmeans_plan

    reference, private = pair
    truth = private.obs["cell_type"].to_numpy()
    sketch, typed = private.copy(), private.copy()
    dpsc.tl.cluster(sketch, 8, epsilon=2.0, reference=reference, noise_seed=3)
    dpsc.tl.cluster(typed, 8, epsilon=2.0, reference=reference, reference_key="cell_type", noise_seed=3)
    steps = [
        [h[2] for h in cells.uns["dpsc"]["dp_cluster"]["privacy"]["history"]] for cells in (sketch, typed)
    ]
    assert steps == [[kmeans_steps(kmeans_plan())], [1, PUBLIC_START_ROUNDS]]  # the count, then the k-means
    assert kmeans_plan(public_start=True)["n_sketch_steps"] == 0
    for cells in (sketch, typed):  # calibrated to at most ε
        assert 1.95 <= dpsc.privacy.spent(cells)[0] <= 2.0 * (1 + 1e-9)
    scores = [adjusted_rand_score(truth, cells.obs["dp_cluster"]) for cells in (sketch, typed)]
    assert scores[1] > scores[0], scores
    statement = typed.uns["dpsc"]["dp_cluster"]["privacy"]["statement"]
    assert f"by {1 + PUBLIC_START_ROUNDS} discrete Gaussian releases of" in statement
    assert "which chose the start (the types' mean points)" in statement


def test_one_call_maps_the_reference_cells_once_for_the_start_and_the_names(pair, monkeypatch):
    """The type start and the names read the same reference points: computed once per call."""
    reference, private = pair
    calls = []
    original = PublicBasis.points

    def counted(self, matrix):
        calls.append(matrix.shape[0])
        return original(self, matrix)

    monkeypatch.setattr(PublicBasis, "points", counted)
    cells = private.copy()
    dpsc.tl.cluster(cells, 6, reference=reference, reference_key="cell_type", noise_seed=3)
    assert cells.obs["dp_cluster_names"].notna().all()
    assert calls.count(reference.n_obs) == 1, calls


def test_the_type_start_keeps_the_most_populous_types_and_fills_the_rest(pair):
    """type_start: k < types keeps the k largest types' mean points; k > types adds public
    k-means centroids; no types, no start."""
    from dpsc._public_reference import reference_points, type_start
    from dpsc.tl._reference import read_reference

    reference, private = pair
    public = read_reference(reference, private, "cell_type", "test")
    basis = public.basis()
    points = reference_points(public, basis)
    labels = public.labels.astype(str).to_numpy()
    largest = public.labels.astype(str).value_counts().index[:3]
    start = type_start(public, basis, 3)
    expected = np.stack([points[labels == kind].mean(0) for kind in largest])
    assert np.allclose(np.sort(start, axis=0), np.sort(expected, axis=0))
    n_types = len(largest.union(public.labels.astype(str).unique()))
    wide = type_start(public, basis, n_types + 2)
    assert wide.shape == (n_types + 2, basis.n_comps) and len(np.unique(wide.round(9), axis=0)) == n_types + 2
    untyped = read_reference(reference, private, None, "test")
    assert type_start(untyped, untyped.basis(), 3) is None


def test_clusters_are_named_after_the_reference_types(pair):
    reference, private = pair
    dpsc.tl.cluster(private, 8, epsilon=None, reference=reference, reference_key="cell_type")
    names = private.obs["dp_cluster_names"].astype(str)
    assert set(names) <= set(reference.obs["cell_type"].astype(str)) | {UNMATCHED}
    named = names != UNMATCHED
    accuracy = (names[named] == private.obs["cell_type"].astype(str)[named]).mean()
    assert named.mean() > 0.8 and accuracy > 0.8, (named.mean(), accuracy)
    table = private.uns["dpsc"]["dp_cluster"]["cluster_names"]
    assert set(table) == {str(i) for i in range(8)}
    assert all(0 < entry["share"] <= 1 for entry in table.values())


def test_a_centroid_where_the_reference_has_no_cells_is_unmatched(pair):
    """The naming rule on constructed centroids: at a type's cells, and far from every reference cell."""
    from dpsc.tl._reference import name_clusters, read_reference

    reference, private = pair
    public = read_reference(reference, private, "cell_type", "test")
    basis = public.basis()
    points = np.asarray(public.own_basis(basis).points(public.counts))
    labels = public.labels.to_numpy()
    inside = np.stack([np.median(points[labels == kind], axis=0) for kind in ("type_1", "type_3")])
    far = -points.mean(0, keepdims=True) * 3  # beyond the reference's cells, opposite their mean
    names = name_clusters(np.vstack([inside, far]), public, basis).table
    assert names["name"].tolist() == ["type_1", "type_3", UNMATCHED]
    assert names["nearest_type"].iloc[2] != UNMATCHED  # the nearest type is still reported


def test_a_centroid_is_matched_within_its_types_spread_widened_by_its_own_noise(pair):
    """A centroid is named t when ||mu - m_t|| <= sqrt(r_t^2 + p s^2): just outside the voted type's
    radius it is unmatched without noise, named with a noise whose sqrt(p) s covers the gap."""
    import dpsc._public_reference as naming
    from dpsc.tl._reference import read_reference

    reference, private = pair
    public = read_reference(reference, private, "cell_type", "test")
    points = naming.reference_points(public, public.basis())
    labels = public.labels.astype(str).to_numpy()
    own = points[labels == "type_1"]
    center = own.mean(axis=0)
    radius = np.quantile(np.linalg.norm(own - center, axis=1), naming.NAME_RADIUS_QUANTILE)
    farthest = own[np.linalg.norm(own - center, axis=1).argmax()]
    direction = (farthest - center) / np.linalg.norm(farthest - center)
    outside = (center + 1.05 * radius * direction)[None, :]  # its nearest cells are still type_1
    named = naming.name_centroids(outside, points, labels).table
    assert named["nearest_type"].iloc[0] == "type_1"
    assert named["name"].iloc[0] == UNMATCHED
    wide = np.array([0.5 * radius / np.sqrt(points.shape[1])])  # sqrt(r^2 + p s^2) = 1.118 r
    assert naming.name_centroids(outside, points, labels, wide).table["name"].iloc[0] == "type_1"
    inside = (center + 0.5 * radius * direction)[None, :]
    assert naming.name_centroids(inside, points, labels).table["name"].iloc[0] == "type_1"


def test_names_survive_a_shift_every_cluster_shares_and_a_new_type_stays_unmatched(pair):
    """A cohort in another condition: every type's centroid moved by one vector longer than any
    type's radius. Without removing it every centroid is unmatched; :func:`common_shift` finds it
    from the centroids alone, the types are named again (the closer, the smaller ``distance``),
    and a centroid far from every type (moved too) stays unmatched."""
    import dpsc._public_reference as naming
    from dpsc.tl._reference import read_reference

    reference, private = pair
    public = read_reference(reference, private, "cell_type", "test")
    points = naming.reference_points(public, public.basis())
    labels = public.labels.astype(str).to_numpy()
    kinds = ["type_1", "type_2", "type_3", "type_4"]
    inside = np.stack([points[labels == kind].mean(axis=0) for kind in kinds])
    radius = max(naming.type_spread(points[labels == kind], naming.NAME_RADIUS_QUANTILE)[1] for kind in kinds)
    direction = np.random.default_rng(0).normal(size=points.shape[1])
    shift = 3 * radius * direction / np.linalg.norm(direction)
    far = -points.mean(0, keepdims=True) * 3
    moved = np.vstack([inside, far]) + shift
    np.testing.assert_allclose(naming.common_shift(moved, points, labels), shift, atol=1e-9)
    named = naming.name_centroids(moved, points, labels).table
    assert named["name"].tolist() == [*kinds, UNMATCHED]
    assert (named["distance"].iloc[:4] < 1).all() and named["distance"].iloc[4] > 1
    kept = naming.MIN_SHIFT_CLUSTERS
    naming.MIN_SHIFT_CLUSTERS = 10**6  # no shift removed: the rule before it
    try:
        assert set(naming.name_centroids(moved, points, labels).table["name"]) == {UNMATCHED}
    finally:
        naming.MIN_SHIFT_CLUSTERS = kept


def test_a_cell_outside_its_clusters_named_type_is_unmatched(pair):
    """Cell i of a cluster named t keeps t when ||x_i - delta - m_t|| <= rho_t (t's
    CELL_RADIUS_QUANTILE radius) and is unmatched beyond it, after the cohort's shift; the cells
    of an unmatched cluster stay unmatched; a Dask array of the points names them the same."""
    dask_array = pytest.importorskip("dask.array")
    import dpsc._public_reference as naming
    from dpsc.tl._reference import read_reference

    reference, private = pair
    public = read_reference(reference, private, "cell_type", "test")
    points = naming.reference_points(public, public.basis())
    labels = public.labels.astype(str).to_numpy()
    kinds = ["type_1", "type_2", "type_3", "type_4"]
    far = -points.mean(0) * 3
    shift = np.full(points.shape[1], 0.05)
    names = naming.name_centroids(
        np.vstack([*(points[labels == k].mean(0) for k in kinds), far]) + shift, points, labels
    )
    assert names.table["name"].tolist() == [*kinds, UNMATCHED]
    own = points[labels == "type_1"]
    center = own.mean(axis=0)
    rho = np.quantile(np.linalg.norm(own - center, axis=1), naming.CELL_RADIUS_QUANTILE)
    direction = np.eye(points.shape[1])[1]
    cells = np.stack([center, center + 0.9 * rho * direction, center + 1.1 * rho * direction, far]) + shift
    clusters = np.array([0, 0, 0, 4])
    expected = ["type_1", "type_1", UNMATCHED, UNMATCHED]
    assert names.cell_names(clusters, cells).tolist() == expected
    assert names.cell_names(clusters, cells, rows=3).tolist() == expected
    assert names.cell_names(clusters, dask_array.from_array(cells, chunks=(3, -1))).tolist() == expected
    kept = names.cell_names(np.zeros(len(own), dtype=int), own + shift) == "type_1"
    assert kept.mean() >= naming.CELL_RADIUS_QUANTILE - 1 / len(own)  # t's own cells: all but the tail


def test_a_reference_path_and_a_lazy_cohort_give_the_same_clusters(pair, tmp_path):
    dask_array = pytest.importorskip("dask.array")
    reference, private = pair
    path = tmp_path / "reference.h5ad"
    reference.write_h5ad(path)
    lazy = private.copy()
    lazy.X = dask_array.from_array(private.X.toarray(), chunks=(100, private.n_vars))
    dpsc.tl.cluster(private, 5, reference=reference, noise_seed=7)
    dpsc.tl.cluster(lazy, 5, reference=str(path), noise_seed=7)
    assert (lazy.obs["dp_cluster"] == private.obs["dp_cluster"]).all()
    assert lazy.uns["dpsc"]["dp_cluster"]["reference"]["name"] == str(path)
    typed, lazy_typed = private.copy(), lazy.copy()  # the count that chooses the start, chunk by chunk
    dpsc.tl.cluster(typed, 5, reference=reference, reference_key="cell_type", noise_seed=7)
    dpsc.tl.cluster(lazy_typed, 5, reference=str(path), reference_key="cell_type", noise_seed=7)
    assert (lazy_typed.obs["dp_cluster"] == typed.obs["dp_cluster"]).all()
    names = typed.obs["dp_cluster_names"].astype(str)  # each cell named from its own point, chunk by chunk
    assert (lazy_typed.obs["dp_cluster_names"].astype(str) == names).all()


def test_a_plan_on_a_public_basis_refuses_requests_without_it_or_with_a_bad_one():
    genes, loadings = np.arange(10), np.linalg.qr(np.random.default_rng(0).normal(size=(10, 4)))[0]
    basis = PublicBasis(genes, np.zeros(10), np.ones(10), loadings, genes)
    plan = plan_clustering(8.0, 1e-5, n_vars=30, n_clusters=3, n_obs=500, public_basis=basis)
    assert plan.kinds == ("kmeans",) and plan.n_releases == plan.kmeans_steps
    first = plan.schedule()[0]
    sketch = Assignment("sketch", np.zeros((4, plan.sketch_bits)))
    request = Request("kmeans", 0, first.sigma, genes, loadings, sketch)
    with pytest.raises(ScheduleError, match="basis"):
        first.check(request, 30, 10)
    first.check(Request("kmeans", 0, first.sigma, genes, loadings, sketch, basis=basis), 30, 10)
    tiny = PublicBasis(genes, np.zeros(10), np.full(10, 1e-9), loadings, genes)
    with pytest.raises(ScheduleError, match="scales"):
        first.check(Request("kmeans", 0, first.sigma, genes, loadings, sketch, basis=tiny), 30, 10)


def _renamed(reference: ad.AnnData, names) -> ad.AnnData:
    out = reference.copy()
    out.var_names = names
    return out


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda r: _renamed(r, [f"ENSG{i:011d}" for i in range(r.n_vars)]), "same gene identifiers"),
        (lambda r: _renamed(r, [g.capitalize() for g in r.var_names.str.upper()]), "species"),
        (lambda r: ad.AnnData(np.log1p(r.X.toarray()), obs=r.obs, var=r.var), "not raw counts"),
        (lambda r: r[:10].copy(), "at least"),
    ],
)
def test_a_bad_reference_is_refused_before_any_booking(pair, change, message):
    reference, private = pair
    private.var_names = private.var_names.str.upper()
    reference.var_names = reference.var_names.str.upper()
    before = private.copy()
    with pytest.raises(ValueError, match=message):
        dpsc.tl.cluster(private, 5, reference=change(reference))
    assert dpsc.privacy.spent(private)[0] == 0
    assert list(private.obs.columns) == list(before.obs.columns) and private.uns.keys() == before.uns.keys()


def test_reference_key_errors_and_small_type_warning(pair):
    reference, private = pair
    with pytest.raises(ValueError, match=r"pass reference=\.\.\."):
        dpsc.tl.cluster(private, 5, reference_key="cell_type")
    with pytest.raises(ValueError, match=r"reference\.obs has no 'kind'"):
        dpsc.tl.cluster(private, 5, reference=reference, reference_key="kind")
    with pytest.raises(ValueError, match="does not exist"):
        dpsc.tl.cluster(private, 5, reference="no/such/file.h5ad")
    assert dpsc.privacy.spent(private)[0] == 0
    with pytest.warns(UserWarning, match="fewer than 50 cells"):
        dpsc.tl.cluster(private, 5, reference=reference, reference_key="cell_type")


def test_the_command_line_takes_a_reference_and_prints_the_names(pair, tmp_path, capsys):
    from dpsc.cli import main

    reference, private = pair
    paths = {name: tmp_path / f"{name}.h5ad" for name in ("reference", "private", "out")}
    reference.write_h5ad(paths["reference"])
    private.write_h5ad(paths["private"])
    named = ["--reference", str(paths["reference"]), "--reference-key", "cell_type", "-o", str(paths["out"])]
    assert main(["cluster", str(paths["private"]), "--n-clusters", "5", *named]) == 0
    text = capsys.readouterr().out
    assert "Names from the reference: 0: " in text
    back = ad.read_h5ad(paths["out"])
    assert back.uns["dpsc"]["dp_cluster"]["privacy"]["reference"]["n_obs"] == reference.n_obs
    table = back.uns["dpsc"]["dp_cluster"]["cluster_names"]
    of_cluster = back.obs["dp_cluster"].astype(str).map({c: v["name"] for c, v in table.items()})
    outside = int(((back.obs["dp_cluster_names"].astype(str) == UNMATCHED) & (of_cluster != UNMATCHED)).sum())
    assert (f"{outside} cells lie outside their cluster's reference type" in text) == (outside > 0)
    assert main(["cluster", str(paths["private"]), "--reference-key", "cell_type"]) == 2
    assert "--reference-key names a column of the reference; pass --reference FILE" in capsys.readouterr().err


def test_markers_on_a_reference_spend_inside_the_same_epsilon(pair, monkeypatch):
    """The markers of a clustering on a reference are measured from the reference's centre: the
    k-means and the marker bounds and tables spend the ε, no centre is released."""
    from dpsc.methods import markers as _markers
    from dpsc.methods.public_markers import reference_center
    from dpsc.tl._reference import optional_reference

    centres, frame_from_center = [], _markers.frame_from_center
    monkeypatch.setattr(
        _markers,
        "frame_from_center",
        lambda center, norms: centres.append(center) or frame_from_center(center, norms),
    )
    reference, private = pair
    dpsc.tl.cluster(private, 5, reference=reference, markers=True, noise_seed=2)
    record = private.uns["dpsc"]["dp_cluster"]["privacy"]
    released = [m.split(":")[0] for m in record["mechanisms"]]
    assert released[:2] == ["kmeans", "marker_norms"] and "marker_center" not in released
    public = optional_reference(reference, None, private, "test")
    center = reference_center(public.counts, public.reference_genes, public.private_genes, private.n_vars)
    assert len(centres) == 1 and np.allclose(centres[0], center) and center.max() > 0
    assert dpsc.privacy.spent(private)[0] == pytest.approx(8.0, rel=1e-3)
    assert set(private.uns["dp_cluster_markers"]["names"].dtype.names) == {str(i) for i in range(5)}


def test_private_markers_measured_from_a_reference_spend_nothing_on_the_centre(pair):
    """tl.rank_genes_groups(reference=...): the centre is the reference's mean and, with its types, the
    focused genes are each type's best in the reference; only the bounds and tables spend ε, and the
    top genes agree better with scanpy's non-private t-test on the same cells than without."""
    import scanpy as sc

    from dpsc.methods import markers as _markers
    from dpsc.methods.public_markers import reference_focus_genes

    reference, private = pair
    private.obs["cell_type"] = private.obs["cell_type"].astype("category")
    truth = private.copy()
    sc.pp.normalize_total(truth, target_sum=1e4)
    sc.pp.log1p(truth)
    sc.tl.rank_genes_groups(truth, "cell_type", method="t-test", n_genes=private.n_vars)
    names = truth.uns["rank_genes_groups"]["names"]

    def top50(result) -> float:
        return float(
            np.mean([len(set(result["names"][g][:50]) & set(names[g][:50])) / 50 for g in names.dtype.names])
        )

    agreement = {}
    for variant in ("none", "reference"):
        scores = []
        for seed in (0, 1):
            cells = private.copy()
            given = {"reference": reference, "reference_key": "cell_type"} if variant == "reference" else {}
            dpsc.tl.rank_genes_groups(cells, "cell_type", epsilon=2, noise_seed=seed, **given)
            scores.append(top50(cells.uns["rank_genes_groups"]))
        agreement[variant] = np.mean(scores)
    assert agreement["reference"] > agreement["none"] + 0.1, agreement
    record = cells.uns["dpsc"]["rank_genes_groups"]["privacy"]
    assert [m.split(":")[0] for m in record["mechanisms"]] == ["norms", "table", "focus_norms", "focus_table"]
    assert record["epsilon"] == pytest.approx(2.0, rel=1e-2)
    assert record["reference"]["fingerprint"] == fingerprint(reference.X, reference.var_names)
    assert "assumed public" in record["statement"]
    shared = np.arange(private.n_vars)
    genes = reference_focus_genes(
        reference.X, reference.obs["cell_type"].to_numpy(), shared, shared, _markers.FOCUS_GENES
    )
    assert cells.uns["dpsc"]["rank_genes_groups"]["params"]["focus_genes"] == len(genes)
    with pytest.raises(ValueError, match=r"pass reference=\.\.\. as well"):
        dpsc.tl.rank_genes_groups(private, "cell_type", reference_key="cell_type")


# -- the reference in a federation: each site its own copy -----------------------------------------
def _site_files(private, reference, tmp_path, n_sites=2):
    from dpsc.federated._site import SiteSettings

    reference_path = tmp_path / "reference.h5ad"
    reference.write_h5ad(reference_path)
    settings = []
    for k in range(n_sites):
        path = tmp_path / f"site{k}.h5ad"
        part = private[k::n_sites]
        ad.AnnData(part.X, var=part.var[[]].copy()).write_h5ad(path)
        settings.append(SiteSettings(data=str(path), epsilon=8.0, reference=str(reference_path)))
    return settings


def _basis_request(plan, basis, index=0):
    from dpsc.methods.kmeans import Assignment as KMeansAssignment

    rows = plan.kmeans["oversampling"] * plan.n_clusters
    n_bits = max(int(plan.kmeans["n_bits"]), int(np.ceil(np.log2(2 * rows))))
    sketch = KMeansAssignment("sketch", np.random.default_rng(0).normal(size=(basis.n_comps, n_bits)))
    sigma = plan.sigmas["kmeans"]
    return Request("kmeans", index, sigma, basis.genes, basis.loadings, sketch, basis=basis)


def test_a_site_serves_a_reference_run_only_in_the_basis_of_its_own_copy(pair, tmp_path):
    from dataclasses import replace

    from dpsc.federated._site import Site, SiteRefusal

    reference, private = pair
    settings = _site_files(private, reference, tmp_path)
    site = Site(settings[0])
    fingerprint_ = fingerprint(reference.X, reference.var_names)
    own, in_reference = site.public_basis(fingerprint_)
    assert np.array_equal(in_reference.loadings, own.loadings) and len(own.genes) == len(in_reference.genes)
    plan = plan_clustering(8.0, 1e-5, n_vars=private.n_vars, n_clusters=4, public_basis=own)
    vector = site.contribute(plan, _basis_request(plan, own), "plain", 1, 2, {}, fingerprint_)
    assert vector.shape[0] > 0
    with pytest.raises(SiteRefusal, match="fingerprint"):  # another reference than the site's copy
        Site(settings[1]).contribute(plan, _basis_request(plan, own), "plain", 1, 2, {}, "0" * 64)
    skewed = replace(own, means=own.means + 0.5)  # the server's basis is not the site's
    with pytest.raises(SiteRefusal, match="not the one this site computes"):
        Site(settings[1]).contribute(plan, _basis_request(plan, skewed), "plain", 1, 2, {}, fingerprint_)
    with pytest.raises(SiteRefusal, match="names its reference"):  # a basis plan without its reference
        Site(settings[1]).contribute(plan, _basis_request(plan, own), "plain", 1, 2, {}, "")
    without = Site(replace(settings[1], reference=None, ledger=str(tmp_path / "other.json")))
    with pytest.raises(SiteRefusal, match="has none"):
        without.contribute(plan, _basis_request(plan, own), "plain", 1, 2, {}, fingerprint_)
    for refused in (settings[1], replace(settings[1], reference=None, ledger=str(tmp_path / "other.json"))):
        assert dpsc.privacy.FileLedger(refused.ledger).entries() == []  # nothing booked on a refusal
    with pytest.raises(FileNotFoundError, match="--reference FILE"):  # a missing copy fails at start
        replace(settings[1], reference=str(tmp_path / "missing.h5ad"))


@pytest.mark.slow
@pytest.mark.optional_extra
def test_a_federated_clustering_on_a_reference_reproduces_the_central_one(pair):
    pytest.importorskip("flwr")
    reference, private = pair
    dpsc.pp.partition(private, 2, random_state=0)
    fed, central = private.copy(), private.copy()
    dpsc.tl.cluster_federated(
        fed, "site", 6, epsilon=8.0, noise_seed=4, reference=reference, reference_key="cell_type"
    )
    dpsc.tl.cluster(central, 6, epsilon=8.0, noise_seed=4, reference=reference, reference_key="cell_type")
    np.testing.assert_allclose(
        fed.uns["dpsc"]["dp_cluster"]["centroids"], central.uns["dpsc"]["dp_cluster"]["centroids"], atol=1e-4
    )
    assert (fed.obs["dp_cluster"] == central.obs["dp_cluster"]).mean() > 0.99
    assert (
        fed.obs["dp_cluster_names"].astype(str) == central.obs["dp_cluster_names"].astype(str)
    ).mean() > 0.99
    record = dpsc.privacy.get_record(fed, "dp_cluster")
    assert record["reference"]["fingerprint"] == fingerprint(reference.X, reference.var_names)
    assert "assumed public" in record["statement"] and "SecAgg+" in record["statement"]
    assert "released centroids" in record["statement"] and "loadings" not in record["covered"]
    assert dpsc.privacy.spent(fed).epsilon == pytest.approx(dpsc.privacy.spent(central).epsilon)


@pytest.mark.slow
@pytest.mark.optional_extra
def test_federated_markers_on_a_reference_are_measured_from_the_sites_agreed_centre(pair):
    """Each site describes its copy's marker centre; the server measures the markers from it and
    releases none, as the central clustering does: the same ranking and the same spend."""
    pytest.importorskip("flwr")
    reference, private = pair
    dpsc.pp.partition(private, 2, random_state=0)
    fed, central = private.copy(), private.copy()
    dpsc.tl.cluster_federated(fed, "site", 5, epsilon=8.0, noise_seed=4, reference=reference, markers=True)
    dpsc.tl.cluster(central, 5, epsilon=8.0, noise_seed=4, reference=reference, markers=True)
    for adata in (fed, central):
        released = [m.split(":")[0] for m in dpsc.privacy.get_record(adata, "dp_cluster")["mechanisms"]]
        assert "marker_center" not in released and "marker_norms" in released
    names = [adata.uns["dp_cluster_markers"]["names"][:5] for adata in (fed, central)]
    assert (
        np.mean([a == b for a, b in zip(*(np.asarray(n.tolist()).ravel() for n in names), strict=True)]) > 0.9
    )
    assert dpsc.privacy.spent(fed).epsilon == pytest.approx(dpsc.privacy.spent(central).epsilon)


@pytest.mark.optional_extra
def test_a_deployed_federation_on_a_reference_each_site_with_its_own_copy(pair, tmp_path, launch_dpsc):
    """SuperLink + 2 SuperNodes on loopback (separate processes, bounded, stopping by themselves)."""
    pytest.importorskip("flwr")
    from dpsc.federated._deploy import free_port

    reference, private = pair
    ref_path = tmp_path / "reference.h5ad"
    reference.write_h5ad(ref_path)
    data = []
    for k in range(2):
        path = tmp_path / f"site{k}.h5ad"
        ad.AnnData(private.X[k::2], var=private.var[[]].copy()).write_h5ad(path)
        data.append(path)
    port = free_port()

    bounded = ("--timeout", "170", "--reference", str(ref_path))
    run = ("--sites", "2", "--mode", "plain", "--n-clusters", "4", "--port", str(port))
    server = launch_dpsc(
        ["federate", "server", *run, "--out", str(tmp_path / "fed"), *bounded], tmp_path / "s.log"
    )
    named = [("--reference-key", "cell_type"), ()]  # the first site names its clusters, the other not
    nodes = [
        launch_dpsc(
            [
                "federate",
                "site",
                "--data",
                str(path),
                "--superlink",
                f"127.0.0.1:{port}",
                *bounded,
                *named[k],
            ],
            tmp_path / f"site{k}.log",
        )
        for k, path in enumerate(data)
    ]
    codes = [p.wait(timeout=190) for p in [server, *nodes]]
    assert codes == [0, 0, 0], (tmp_path / "s.log").read_text()[-2000:]
    assert "sha256" in (tmp_path / "s.log").read_text()
    summary = json.loads((tmp_path / "fed" / "result" / "summary.json").read_text())
    assert {r["kind"] for r in summary["releases"]} == {"kmeans"}  # genes and components: the reference's
    outputs = []
    for path in data:
        out = ad.read_h5ad(path.with_name(path.stem + ".dpsc.h5ad"))
        assert out.obs["dp_cluster"].notna().all()
        record = out.uns["dpsc"]["dp_cluster"]["privacy"]
        assert record["reference"]["fingerprint"] == fingerprint(reference.X, reference.var_names)
        assert "assumed public" in record["statement"]
        outputs.append(out)
    names = outputs[0].obs["dp_cluster_names"].astype(str)  # named from the site's own copy: no ε
    assert set(names) <= set(reference.obs["cell_type"].astype(str)) | {UNMATCHED}
    assert (names != UNMATCHED).mean() > 0.5
    assert set(outputs[0].uns["dpsc"]["dp_cluster"]["cluster_names"]) == {"0", "1", "2", "3"}
    assert "dp_cluster_names" not in outputs[1].obs


def test_a_basis_travels_whole_and_same_basis_tells_another_apart(pair):
    from dataclasses import replace

    from dpsc.federated._pipeline import basis_arrays, basis_from_arrays
    from dpsc.methods.public_basis import same_basis
    from dpsc.tl._reference import reference_basis

    reference, private = pair
    _, basis = reference_basis(reference, None, private, "test")
    back = basis_from_arrays(basis.genes, basis.loadings, basis_arrays(basis))
    assert same_basis(back, basis) and back.radius == basis.radius and back.target_sum == basis.target_sum
    sphere = replace(basis, radius=None)
    assert same_basis(basis_from_arrays(sphere.genes, sphere.loadings, basis_arrays(sphere)), sphere)
    assert same_basis(replace(basis, means=basis.means * (1 + 1e-9)), basis)  # round-off
    for changed in (
        replace(basis, means=basis.means + 1e-3),
        replace(basis, loadings=-basis.loadings),
        replace(basis, genes=basis.genes[::-1].copy()),
        replace(basis, radius=None),
        replace(basis, target_sum=basis.target_sum * 2),
        "not a basis",
    ):
        assert not same_basis(changed, basis)


def test_an_atlas_format_reference_is_read_from_raw_and_matched_by_its_symbol_column(pair):
    """CELLxGENE's shape: Ensembl IDs in var_names, symbols in var['feature_name'], counts in raw."""
    import warnings

    import scanpy as sc

    reference, private = pair
    atlas = reference.copy()
    atlas.var["feature_name"] = atlas.var_names.astype(str)
    atlas.var_names = [f"ENSG{i:011d}" for i in range(atlas.n_vars)]
    atlas.raw = atlas.copy()
    sc.pp.normalize_total(atlas, target_sum=1e4)
    sc.pp.log1p(atlas)
    plain, from_atlas = private.copy(), private.copy()
    dpsc.tl.cluster(plain, 8, reference=reference, reference_key="cell_type", noise_seed=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dpsc.tl.cluster(from_atlas, 8, reference=atlas, reference_key="cell_type", noise_seed=3)
    said = " ".join(str(w.message) for w in caught)
    assert "reference.raw.X" in said and "var['feature_name']" in said
    assert (plain.obs["dp_cluster"] == from_atlas.obs["dp_cluster"]).all()  # the same counts and genes
    assert list(plain.obs["dp_cluster_names"]) == list(from_atlas.obs["dp_cluster_names"])


def test_the_basis_streams_over_the_reference_and_is_scanpys_recipe(pbmc_full, monkeypatch):
    """The basis read in blocks of 256 cells equals scanpy's in-memory recipe on the whole matrix
    (normalize_total to the median total, log1p, seurat HVG, scale, centred PCA): its memory is a
    block's, not the reference's."""
    import scanpy as sc
    import scipy.sparse as sp

    from dpsc.methods import public_basis

    reference = sp.csr_matrix(pbmc_full.X[:2500])
    genes = np.arange(reference.shape[1])
    monkeypatch.setattr(public_basis, "BLOCK_VALUES", 256 * len(genes))  # 256 cells per block
    basis = public_basis.basis_from_reference(reference, genes, genes, 1000, 16, 0.9)

    cells = ad.AnnData(reference.astype(np.float64))
    totals = np.asarray(reference.sum(1)).ravel()
    sc.pp.normalize_total(cells, target_sum=float(np.median(totals)))
    sc.pp.log1p(cells)
    sc.pp.highly_variable_genes(cells, n_top_genes=1000, flavor="seurat")
    kept = np.flatnonzero(cells.var["highly_variable"].to_numpy())
    logged = cells.X[:, kept].toarray()
    Y = np.clip((logged - logged.mean(0)) / logged.std(0), -10, 10)
    _, _, Vt = np.linalg.svd(Y - Y.mean(0), full_matrices=False)
    np.testing.assert_array_equal(basis.genes, kept)
    np.testing.assert_allclose(basis.means, logged.mean(0), atol=1e-10)
    np.testing.assert_allclose(np.abs(basis.loadings.T @ Vt[:16].T), np.eye(16), atol=1e-6)
    norms = np.linalg.norm(Y @ basis.loadings, axis=1)
    assert basis.radius == pytest.approx(np.quantile(norms, 0.9), rel=1e-9)


@pytest.mark.parametrize("seed", [0, 1])
def test_the_gene_choice_from_moments_is_scanpys_seurat_flavour(seed):
    """Genes never expressed, a bin of one gene and ties included."""
    import scanpy as sc

    from dpsc.methods.public_basis import seurat_top_genes

    rng = np.random.default_rng(seed)
    counts = rng.negative_binomial(1, rng.uniform(0.3, 0.99, 400), size=(300, 400)).astype(float)
    counts[:, :7] = 0
    counts[:, 7] = 50.0  # constant: dispersion 0
    counts[0, 8] = 5000.0  # alone in the top bin of means
    logged = np.log1p(counts)
    cells = ad.AnnData(logged)
    sc.pp.highly_variable_genes(cells, n_top_genes=60, flavor="seurat")
    x = np.expm1(logged)
    var = x.var(0, ddof=1)
    np.testing.assert_array_equal(
        seurat_top_genes(x.mean(0), var, 60), cells.var["highly_variable"].to_numpy()
    )
