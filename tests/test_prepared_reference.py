"""``dpsc.tl.prepare_reference``: a reference read once, reused from disk with the same results."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

import dpsc
from test_reference import reference_pair


@pytest.fixture
def pair(pbmc_full):
    return reference_pair(pbmc_full)


@pytest.fixture
def prepared(pair, tmp_path):
    reference, private = pair
    path = tmp_path / "prepared"
    dpsc.tl.prepare_reference(reference, private, path, reference_key="cell_type")
    return path


def _run(private, reference):
    out = private.copy()
    dpsc.tl.cluster(out, 5, reference=reference, reference_key="cell_type", markers=True, noise_seed=7)
    dpsc.tl.rank_genes_groups(out, "dp_cluster", epsilon=2, reference=reference, noise_seed=8)
    return out


def test_a_prepared_reference_gives_the_clusters_names_and_markers_of_the_reference_itself(pair, prepared):
    reference, private = pair
    direct, reused = _run(private, reference), _run(private, str(prepared))
    for key in ("dp_cluster", "dp_cluster_names"):
        assert (reused.obs[key] == direct.obs[key]).all()
    np.testing.assert_array_equal(reused.obsm["X_dp_cluster"], direct.obsm["X_dp_cluster"])
    markers = [pd.DataFrame(a.uns["rank_genes_groups"]["names"]) for a in (direct, reused)]
    assert markers[0].equals(markers[1])
    said = [a.uns["dpsc"]["dp_cluster"]["reference"] for a in (direct, reused)]
    assert said[1]["fingerprint"] == said[0]["fingerprint"] and said[1]["n_obs"] == reference.n_obs
    assert f"(prepared at {prepared})" in said[1]["name"]
    assert dpsc.privacy.spent(reused) == dpsc.privacy.spent(direct)


def test_the_folder_holds_public_values_only(pair, tmp_path):
    """Preparing for two cohorts with the same genes and other cells writes the same arrays."""
    reference, private = pair
    other = private.copy()
    other.X = other.X[::-1].copy()  # other cells, same genes
    for name, cohort in (("a", private), ("b", other)):
        dpsc.tl.prepare_reference(reference, cohort, tmp_path / name, reference_key="cell_type")
    hashes = [json.loads((tmp_path / n / "manifest.json").read_text())["arrays_sha256"] for n in "ab"]
    assert hashes[0] == hashes[1]


def _tampered(path):
    arrays = dict(np.load(path / "arrays.npz"))
    arrays["points"] = arrays["points"] * 0.5
    np.savez(path / "arrays.npz", **arrays)


@pytest.mark.parametrize(
    "change, message",
    [
        (_tampered, "does not match its manifest"),
        (lambda path: (path / "manifest.json").unlink(), "not a prepared reference"),
    ],
)
def test_a_changed_folder_is_refused_before_any_booking(pair, prepared, change, message):
    _, private = pair
    change(prepared)
    with pytest.raises(ValueError, match=message):
        dpsc.tl.cluster(private, 5, reference=str(prepared), reference_key="cell_type")
    assert dpsc.privacy.spent(private)[0] == 0 and "dp_cluster" not in private.obs


def test_other_genes_or_another_reference_key_are_refused_with_the_fix(pair, prepared):
    _, private = pair
    with pytest.raises(ValueError, match="prepare it for these cells' genes"):
        dpsc.tl.cluster(private[:, :-1].copy(), 5, reference=str(prepared), reference_key="cell_type")
    with pytest.raises(ValueError, match="reference_key='cell_type', not 'type'"):
        dpsc.tl.cluster(private, 5, reference=str(prepared), reference_key="type")
    assert dpsc.privacy.spent(private)[0] == 0


def test_preparing_refuses_to_overwrite_unless_asked(pair, prepared):
    reference, private = pair
    with pytest.raises(ValueError, match="overwrite=True"):
        dpsc.tl.prepare_reference(reference, private, prepared, reference_key="cell_type")
    dpsc.tl.prepare_reference(reference, private, prepared, reference_key="cell_type", overwrite=True)


@pytest.mark.slow
def test_the_fit_pretrains_on_a_prepared_reference_as_on_the_reference(pair, prepared, tmp_path, monkeypatch):
    """Same basis and points: the weights pretrained for the reference serve the prepared one."""
    import dpsc.tl._fit_reference as fit_reference

    pretrained = []
    train = fit_reference.pretrained_state
    monkeypatch.setattr(fit_reference, "pretrained_state", lambda *a: pretrained.append(1) or train(*a))
    reference, private = pair
    fits = []
    for source in (reference, str(prepared)):
        out = private.copy()
        dpsc.tl.fit(out, 5, reference=source, reference_key="cell_type", reference_model=tmp_path / "model")
        fits.append(out)
    assert len(pretrained) == 1  # the second fit loaded the first's weights: same key
    assert fits[1].obs["dp_cluster_names"].notna().all()
    said = [a.uns["dpsc"]["X_dpdcan"]["reference"]["fingerprint"] for a in fits]
    assert said[0] == said[1]


def test_the_command_line_prepares_a_reference_and_clusters_on_it(pair, tmp_path, capsys):
    from dpsc.cli import main

    reference, private = pair
    reference.write_h5ad(tmp_path / "reference.h5ad")
    private.write_h5ad(tmp_path / "cohort.h5ad")
    prepare = ["prepare-reference", str(tmp_path / "reference.h5ad"), str(tmp_path / "cohort.h5ad")]
    prepare += ["--output", str(tmp_path / "prepared"), "--reference-key", "cell_type"]
    assert main(prepare) == 0
    assert f"--reference {tmp_path / 'prepared'}" in capsys.readouterr().out
    assert main(prepare) == 2
    assert "--overwrite" in capsys.readouterr().err
    cluster = ["cluster", str(tmp_path / "cohort.h5ad"), "--n-clusters", "5"]
    assert main([*cluster, "--reference", str(tmp_path / "prepared"), "--reference-key", "cell_type"]) == 0
    assert "Names from the reference: 0: " in capsys.readouterr().out


def test_a_federated_clustering_on_a_prepared_reference_is_the_central_one_on_the_reference(pair, prepared):
    pytest.importorskip("flwr")
    reference, private = pair
    dpsc.pp.partition(private, 2, random_state=0)
    fed, central = private.copy(), private.copy()
    folder = str(prepared)
    dpsc.tl.cluster_federated(fed, "site", 6, noise_seed=4, reference=folder, reference_key="cell_type")
    dpsc.tl.cluster(central, 6, noise_seed=4, reference=reference, reference_key="cell_type")
    centroids = [a.uns["dpsc"]["dp_cluster"]["centroids"] for a in (fed, central)]
    np.testing.assert_allclose(centroids[0], centroids[1], atol=1e-4)


def test_a_reference_file_is_read_backed_with_the_fingerprint_of_the_same_cells_in_memory(pair, tmp_path):
    """Its counts stay on disk (each pass reads row blocks); fingerprint and results as in memory."""
    from anndata.abc import CSRDataset

    from dpsc.tl._reference import optional_reference

    reference, private = pair
    reference.write_h5ad(tmp_path / "reference.h5ad")
    read = optional_reference(str(tmp_path / "reference.h5ad"), "cell_type", private, "test")
    assert isinstance(read.counts, CSRDataset)
    assert read.fingerprint == optional_reference(reference, "cell_type", private, "test").fingerprint
    on_disk, in_memory = _run(private, str(tmp_path / "reference.h5ad")), _run(private, reference)
    assert (on_disk.obs["dp_cluster_names"] == in_memory.obs["dp_cluster_names"]).all()
    markers = [pd.DataFrame(a.uns["rank_genes_groups"]["names"]) for a in (on_disk, in_memory)]
    assert markers[0].equals(markers[1])


@pytest.mark.parametrize("atlas", [False, True])
def test_the_servers_reference_fingerprint_is_the_one_each_site_computes_of_its_copy(pair, tmp_path, atlas):
    """Also for an atlas that keeps its counts in raw (the server hashed X before)."""
    import warnings

    import scanpy as sc

    from dpsc.cli import _reference_fingerprint
    from dpsc.tl._reference import optional_reference

    reference, private = pair
    if atlas:
        reference.raw = reference.copy()
        sc.pp.normalize_total(reference, target_sum=1e4)
        sc.pp.log1p(reference)
    path = str(tmp_path / "reference.h5ad")
    reference.write_h5ad(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the atlas's "counts from raw.X" note
        site = optional_reference(path, None, private, "this site").fingerprint
        assert _reference_fingerprint(path) == site
        dpsc.tl.prepare_reference(path, private, tmp_path / "prepared")
        assert _reference_fingerprint(str(tmp_path / "prepared")) == site
