"""``tl.cluster(reference=...)``: a public reference's basis, only the k-means spends, names from it."""

from __future__ import annotations

import anndata as ad
import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score

import dpsc
from dpsc.methods._clustering import Request, ScheduleError, kmeans_steps, plan_clustering
from dpsc.methods._kmeans import Assignment
from dpsc.methods._public_basis import PublicBasis
from dpsc.tl._reference import UNMATCHED, fingerprint


@pytest.fixture
def pair(pbmc_full):
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
    scores = [adjusted_rand_score(truth, cells.obs["dp_kmeans"]) for cells in (alone, guided)]
    assert scores[1] > scores[0] + 0.1, scores
    record = guided.uns["dpsc"]["dp_kmeans"]["privacy"]
    assert record["guarantee"] == "proven"
    assert record["epsilon"] == pytest.approx(8.0, rel=1e-3)
    assert dpsc.privacy.spent(guided)[0] == pytest.approx(8.0, rel=1e-3)
    assert record["mechanisms"] == ["kmeans: sigma=" + record["mechanisms"][0].split("=")[1]]
    assert record["history"][0][2] == kmeans_steps(dict(dpsc.methods._clustering.kmeans_plan()))
    stated = record["reference"]
    assert stated["fingerprint"] == fingerprint(reference.X, reference.var_names)
    assert stated["n_obs"] == reference.n_obs
    assert "assumed public" in record["statement"]
    assert guided.obsm["X_dp_kmeans"].shape == (private.n_obs, 16)
    assert guided.var["dp_kmeans_gene"].sum() == stated["n_genes"]


def test_clusters_are_named_after_the_reference_types(pair):
    reference, private = pair
    dpsc.tl.cluster(private, 8, epsilon=None, reference=reference, reference_key="cell_type")
    names = private.obs["dp_kmeans_names"].astype(str)
    assert set(names) <= set(reference.obs["cell_type"].astype(str)) | {UNMATCHED}
    named = names != UNMATCHED
    accuracy = (names[named] == private.obs["cell_type"].astype(str)[named]).mean()
    assert named.mean() > 0.8 and accuracy > 0.8, (named.mean(), accuracy)
    table = private.uns["dpsc"]["dp_kmeans"]["cluster_names"]
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
    names = name_clusters(np.vstack([inside, far]), public, basis)
    assert names["name"].tolist() == ["type_1", "type_3", UNMATCHED]
    assert names["nearest_type"].iloc[2] != UNMATCHED  # the nearest type is still reported


def test_a_reference_path_and_a_lazy_cohort_give_the_same_clusters(pair, tmp_path):
    dask_array = pytest.importorskip("dask.array")
    reference, private = pair
    path = tmp_path / "reference.h5ad"
    reference.write_h5ad(path)
    lazy = private.copy()
    lazy.X = dask_array.from_array(private.X.toarray(), chunks=(100, private.n_vars))
    dpsc.tl.cluster(private, 5, reference=reference, noise_seed=7)
    dpsc.tl.cluster(lazy, 5, reference=str(path), noise_seed=7)
    assert (lazy.obs["dp_kmeans"] == private.obs["dp_kmeans"]).all()
    assert lazy.uns["dpsc"]["dp_kmeans"]["reference"]["name"] == str(path)


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
    assert back.uns["dpsc"]["dp_kmeans"]["privacy"]["reference"]["n_obs"] == reference.n_obs
    assert main(["cluster", str(paths["private"]), "--reference-key", "cell_type"]) == 2
    assert "--reference-key names a column of the reference; pass --reference FILE" in capsys.readouterr().err


def test_markers_on_a_reference_spend_inside_the_same_epsilon(pair):
    reference, private = pair
    dpsc.tl.cluster(private, 5, reference=reference, markers=True, noise_seed=2)
    record = private.uns["dpsc"]["dp_kmeans"]["privacy"]
    assert [m.split(":")[0] for m in record["mechanisms"]][:2] == ["kmeans", "marker_center"]
    assert dpsc.privacy.spent(private)[0] == pytest.approx(8.0, rel=1e-3)
    assert set(private.uns["dp_kmeans_markers"]["names"].dtype.names) == {str(i) for i in range(5)}
