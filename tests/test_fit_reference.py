"""``tl.fit(reference=...)``: pretrained on public cells, only the encoder and centroids trained privately."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import dpsc
from dpsc.model import _dcan_reference
from dpsc.tl._reference import UNMATCHED, fingerprint

FAST = {"cluster_epochs": 2}


@pytest.fixture
def pair(pbmc_full):
    """A reference of 1,200 PBMC cells and 400 other cells as the private cohort (400 top genes)."""
    order = np.random.default_rng(2).permutation(pbmc_full.n_obs)
    totals = np.asarray(pbmc_full.X.sum(0)).ravel()
    genes = np.sort(np.argsort(-totals)[:400])
    reference = pbmc_full[np.sort(order[:1200]), genes].copy()
    private = pbmc_full[np.sort(order[1200:1600]), genes].copy()
    return reference, private


def _decoder(state: dict) -> dict:
    return {k: v for k, v in state.items() if k.startswith(("decoder.", "px_scale."))}


def test_the_decoder_is_the_pretrained_one_and_only_the_encoder_and_centroids_learn(pair, tmp_path):
    reference, private = pair
    model = dpsc.tl.fit(
        private,
        epsilon=8,
        n_clusters=6,
        reference=reference,
        reference_model=tmp_path,
        noise_seed=4,
        progress_bar=False,
        return_model=True,
        **FAST,
    )
    key = (tmp_path / _dcan_reference.PRETRAINED_META).read_text()
    pretrained = torch.load(tmp_path / _dcan_reference.PRETRAINED_WEIGHTS, weights_only=True)
    trained = model.module.state_dict()
    for name, value in _decoder(pretrained).items():
        assert torch.equal(trained[name], value), name  # the public decoder never trained on a cell
    encoder = [k for k in pretrained if k.startswith("encoder.")]
    assert any(not torch.equal(trained[k], pretrained[k]) for k in encoder)  # the private part learned
    assert fingerprint(reference.X, reference.var_names) in key
    record = dpsc.privacy.get_record(private, "X_dpdcan")
    assert record["guarantee"] == "proven"
    assert record["epsilon"] <= 8.0 + 1e-6
    assert record["reference"]["fingerprint"] == fingerprint(reference.X, reference.var_names)
    assert "pretrained on the public reference" in record["statement"]
    assert "assumed public" in record["statement"]
    assert dpsc.privacy.spent(private)[0] == pytest.approx(record["epsilon"])
    assert private.obsm["X_dpdcan"].shape == (private.n_obs, 16)
    assert private.uns["dpsc"]["X_dpdcan"]["params"]["partition"] in ("clustering", "model")


def test_a_saved_pretrained_model_is_reused_and_a_new_reference_pretrains_again(pair, tmp_path, monkeypatch):
    reference, private = pair
    calls = []
    original = _dcan_reference.pretrained_state
    monkeypatch.setattr(
        "dpsc.tl._fit_reference.pretrained_state", lambda *a, **k: calls.append(1) or original(*a, **k)
    )
    options = {"n_clusters": 6, "reference_model": tmp_path, "progress_bar": False, **FAST}
    dpsc.tl.fit(private.copy(), epsilon=8, reference=reference, **options)
    dpsc.tl.fit(private.copy(), epsilon=4, reference=reference, **options)
    assert len(calls) == 1  # the second fit loaded it from disk
    other = reference[: reference.n_obs // 2].copy()
    dpsc.tl.fit(private.copy(), epsilon=8, reference=other, **options)
    assert len(calls) == 2  # another reference (fingerprint): pretrained again, not the stale one


def test_an_atlas_pretrains_on_a_seeded_sample_of_its_points(monkeypatch):
    """Past PRETRAIN_MAX_CELLS points the pretraining reads a uniform sample, the same for one seed."""
    monkeypatch.setattr(_dcan_reference, "PRETRAIN_MAX_CELLS", 60)
    monkeypatch.setattr(_dcan_reference, "PRETRAIN_EPOCHS", {"instance_epochs": 1, "cluster_epochs": 1})
    read = []
    original = _dcan_reference.points_anndata
    monkeypatch.setattr(_dcan_reference, "points_anndata", lambda p: read.append(p) or original(p))
    points = np.random.default_rng(0).normal(size=(200, 4)).astype(np.float32) / 4
    for seed in (0, 0, 1):
        _dcan_reference.pretrained_state(points, 3, seed)
    assert [len(p) for p in read] == [60, 60, 60]
    assert np.array_equal(read[0], read[1]) and not np.array_equal(read[0], read[2])
    assert all(np.isin(p, points).all() for p in read)  # reference points, not new ones
    read.clear()
    _dcan_reference.pretrained_state(points[:50], 3, 0)
    assert np.array_equal(read[0], points[:50])  # a smaller reference is read whole


def test_the_clusters_are_named_after_the_reference_types(pair):
    reference, private = pair
    dpsc.tl.fit(
        private,
        epsilon=None,
        n_clusters=6,
        reference=reference,
        reference_key="cell_type",
        progress_bar=False,
        **FAST,
    )
    names = private.obs["dp_cluster_names"].astype(str)
    assert set(names) <= set(reference.obs["cell_type"].astype(str)) | {UNMATCHED}
    named = names != UNMATCHED
    accuracy = (names[named] == private.obs["cell_type"].astype(str)[named]).mean()
    assert named.mean() > 0.8 and accuracy > 0.7, (named.mean(), accuracy)
    assert set(private.uns["dpsc"]["X_dpdcan"]["cluster_names"]) == {str(i) for i in range(6)}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"scope": "paper"}, "scope='encoder'"),
        ({"input_pcs": 8}, "input_pcs='auto'"),
        ({"reference": None, "reference_model": "somewhere"}, "pass reference="),
        ({"reference": None, "reference_key": "cell_type"}, "pass reference="),
        ({"reference_key": "no_such_column"}, "no 'no_such_column'"),
    ],
)
def test_a_refused_reference_fit_costs_no_epsilon_and_leaves_the_data(pair, options, message):
    reference, private = pair
    before = private.copy()
    with pytest.raises(ValueError, match=message):
        dpsc.tl.fit(private, epsilon=8, n_clusters=6, **{"reference": reference, **options})
    assert dpsc.privacy.spent(private)[0] == 0.0
    assert "X_dpdcan" not in private.obsm and list(private.obs.columns) == list(before.obs.columns)


def test_the_command_line_fits_on_a_reference_and_refuses_to_export_it(pair, tmp_path, capsys):
    import anndata as ad

    from dpsc.cli import main

    reference, private = pair
    paths = {name: tmp_path / f"{name}.h5ad" for name in ("reference", "private", "out")}
    reference.write_h5ad(paths["reference"])
    private.write_h5ad(paths["private"])
    saved = tmp_path / "pretrained"
    named = ["--reference", str(paths["reference"]), "--reference-key", "cell_type"]
    command = ["fit", str(paths["private"]), "--n-clusters", "5", "--no-progress", *named]
    assert main([*command, "--reference-model", str(saved), "-o", str(paths["out"])]) == 0
    assert "Names from the reference: 0: " in capsys.readouterr().out
    assert (saved / "dpdcan_reference.pt").exists()
    back = ad.read_h5ad(paths["out"])
    assert back.uns["dpsc"]["X_dpdcan"]["privacy"]["reference"]["n_obs"] == reference.n_obs
    assert main([*command, "--export", str(tmp_path / "shared")]) == 2  # refused before the fit
    assert "Leave out --export" in capsys.readouterr().err
    assert not (tmp_path / "shared").exists()


def test_the_untrained_reference_network_embeds_each_point_where_the_clustering_does():
    """``REFERENCE_MODEL`` is residual: before pretraining, a cell at point p (‖p‖ ≤ 1) is embedded
    at s·p, where ``tl.cluster(reference=...)`` puts it (scaled), and its clusters are read from the
    latent itself (the reference's Euclidean k-means), not from its direction."""
    import torch

    from dpsc.model import REFERENCE_MODEL
    from dpsc.module import DCANModule

    assert REFERENCE_MODEL["residual"]
    module = DCANModule(n_input=16, n_clusters=3, **REFERENCE_MODEL)
    points = torch.randn(50, 16, generator=torch.Generator().manual_seed(0))
    points = points / points.norm(dim=1, keepdim=True) * torch.linspace(0.1, 1.0, 50)[:, None]
    with torch.no_grad():
        latent = module.encode(module.represent(points))
    assert torch.allclose(latent, module.latent_scale * points, atol=1e-6)
    assert torch.equal(module.assignment_space(latent), latent)
