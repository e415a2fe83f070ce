"""DEC's cluster frequencies, released with the sampled Gaussian mechanism (one step each)."""

import numpy as np
import pytest
import torch

import dpsc
from dpsc.module import dec_kl_per_cell, per_cell_target, student_t_assignment
from dpsc.privacy import NoiseSource, dp_cluster_frequency


def test_exact_release_is_the_column_sum_and_one_cell_moves_it_by_at_most_one():
    q = student_t_assignment(torch.rand(50, 4) * 5)
    exact = dp_cluster_frequency(q, noise_multiplier=0.0, rng=None, floor=0.0)
    torch.testing.assert_close(exact, q.double().sum(0))
    without_last = dp_cluster_frequency(q[:-1], noise_multiplier=0.0, rng=None, floor=0.0)
    # add/remove one cell: the L2 change is the cell's own row, at most 1 (the sensitivity)
    change = (exact - without_last).norm().item()
    assert change == pytest.approx(q[-1].double().norm().item())
    assert change <= 1.0
    # a one-hot row attains the bound
    onehot = torch.eye(4)[:1]
    assert dp_cluster_frequency(onehot, noise_multiplier=0.0, rng=None, floor=0.0).norm() == 1.0


def test_noise_std_is_sigma_and_floor_applies():
    q = torch.full((10, 3), 1 / 3)
    rng = NoiseSource(0).stream("test")
    draws = torch.stack(
        [dp_cluster_frequency(q, noise_multiplier=2.5, rng=rng, floor=-1e9) for _ in range(4000)]
    )
    assert draws.mean().item() == pytest.approx(10 / 3, abs=0.1)
    assert draws.std().item() == pytest.approx(2.5, rel=0.05)
    low = dp_cluster_frequency(torch.zeros(0, 3), noise_multiplier=5.0, rng=rng, floor=1.0)
    assert torch.all(low >= 1.0)


def test_rows_off_the_simplex_are_refused():
    with pytest.raises(ValueError, match="simplex"):
        dp_cluster_frequency(torch.full((2, 2), 1.0), noise_multiplier=1.0, rng=None)


def test_target_with_frequency_is_dec_equation_3():
    q = student_t_assignment(torch.rand(6, 3) * 4)
    f = q.sum(0)
    expected = q.pow(2) / f
    expected = expected / expected.sum(1, keepdim=True)
    torch.testing.assert_close(per_cell_target(q, 2.0, f), expected)
    # uniform frequencies give the per-cell target without f
    torch.testing.assert_close(per_cell_target(q, 2.0, torch.ones(3)), per_cell_target(q, 2.0))
    # a rare cluster gets a larger target weight than with uniform frequencies
    rare = torch.tensor([10.0, 10.0, 1.0])
    assert torch.all(per_cell_target(q, 2.0, rare)[:, 2] > per_cell_target(q, 2.0)[:, 2])
    assert torch.all(dec_kl_per_cell(q, per_cell_target(q, 2.0, rare)) >= -1e-7)


@pytest.mark.slow
def test_released_frequencies_are_accounted_steps(small_adata, fast_train):
    fit = {"n_clusters": 3, **fast_train, "cluster_epochs": 2, "noise_seed": 0}  # same noise: only f differs
    uniform = small_adata.copy()
    dpsc.tl.fit(small_adata, epsilon=8.0, **fit)  # "released" is the default
    rec = small_adata.uns["dpsc"]["X_dpdcan"]["privacy"]
    params = small_adata.uns["dpsc"]["X_dpdcan"]["params"]
    # the clustering's 6 releases (4 k-means tables) + (2 + 2) epochs × 10 Poisson draws + 1
    # frequency release per cluster epoch + 1 label-count release + the partition choice
    assert rec["frequency_steps"] == 2 and rec["label_steps"] == 1
    assert rec["steps"] == 6 + 4 * 10 + 2 + 1 + 1 == params["planned_steps"] + 7
    assert params["target_frequency"] == "released"
    assert 0 < rec["epsilon"] <= 8.0

    dpsc.tl.fit(uniform, epsilon=8.0, plan_kwargs={"target_frequency": "uniform"}, **fit)
    assert uniform.uns["dpsc"]["X_dpdcan"]["privacy"]["frequency_steps"] == 0
    assert uniform.uns["dpsc"]["X_dpdcan"]["privacy"]["steps"] == 6 + 4 * 10 + 1 + 1
    assert not np.allclose(uniform.obsm["X_dpdcan"], small_adata.obsm["X_dpdcan"])


def test_non_private_fit_uses_frequencies_and_spends_nothing(small_adata, fast_train):
    uniform = small_adata.copy()
    dpsc.tl.fit(
        small_adata, epsilon=None, plan_kwargs={"target_frequency": "released"}, n_clusters=3, **fast_train
    )
    dpsc.tl.fit(
        uniform, epsilon=None, plan_kwargs={"target_frequency": "uniform"}, n_clusters=3, **fast_train
    )
    assert small_adata.uns["dpsc"]["X_dpdcan"]["privacy"]["frequency_steps"] == 0
    assert small_adata.uns["dpsc"]["X_dpdcan"]["privacy"]["steps"] == 0
    # the exact frequencies enter the cluster-stage target: the fit differs from the uniform one
    assert not np.allclose(uniform.obsm["X_dpdcan"], small_adata.obsm["X_dpdcan"])


def test_unknown_target_frequency_is_refused_and_adata_untouched(small_adata, fast_train):
    before = small_adata.copy()
    with pytest.raises(ValueError, match="target_frequency"):
        dpsc.tl.fit(
            small_adata, epsilon=8.0, plan_kwargs={"target_frequency": "batch"}, n_clusters=3, **fast_train
        )
    assert set(small_adata.obsm) == set(before.obsm) and set(small_adata.uns) == set(before.uns)


def test_non_private_label_counts_are_the_written_labels(small_adata, tiny_fit):
    model = dpsc.tl.fit(small_adata, epsilon=None, return_model=True, **tiny_fit)
    written = np.bincount(small_adata.obs["dp_cluster"].cat.codes, minlength=3)
    assert model.released_label_counts() is None  # nothing released: the counts are exact
    entry = small_adata.uns["dpsc"]["X_dpdcan"]
    np.testing.assert_array_equal(entry["label_counts"], written)
    assert entry["clusters_in_use"] == int((written > 0).sum())
    assert entry["privacy"]["label_steps"] == 0


@pytest.mark.slow
def test_private_label_counts_are_one_accounted_poisson_release(small_adata, tiny_fit):
    # input_pcs=16: the model's own loadings, so the written labels are the model's
    model = dpsc.tl.fit(small_adata, epsilon=8.0, input_pcs=16, noise_seed=0, return_model=True, **tiny_fit)
    rec = small_adata.uns["dpsc"]["X_dpdcan"]["privacy"]
    counts = model.released_label_counts()
    assert rec["label_steps"] == 1 and counts.shape == (3,)
    assert model.label_count_noise_ == pytest.approx(rec["noise_multiplier"])
    # one Poisson sample at q = 0.1 of the 300 cells (about 30), not the written labels of all cells
    assert 0 < counts.sum() < small_adata.n_obs / 2
    in_use = int((counts > max(2 * rec["noise_multiplier"], 0.5)).sum())
    assert small_adata.uns["dpsc"]["X_dpdcan"]["clusters_in_use"] == in_use


def test_collapse_note_reads_the_released_label_counts(small_adata, tiny_fit, monkeypatch):
    # soft frequencies may stay near uniform while the labels collapse: the note reads the counts
    monkeypatch.setattr(dpsc.model.DPDCAN, "released_label_counts", lambda self: np.array([40.0, 0.0, 0.0]))
    with pytest.warns(UserWarning, match="Only 1 of the 3 clusters hold"):
        dpsc.tl.fit(small_adata, epsilon=None, input_pcs=16, **tiny_fit)
    assert small_adata.uns["dpsc"]["X_dpdcan"]["clusters_in_use"] == 1


def test_collapse_note_of_a_fit_from_the_clustering_reads_the_kept_counts(small_adata, tiny_fit, monkeypatch):
    """The default fit's counts are those the partition choice released for the kept partition."""
    from dpsc.methods import selection as _selection

    counts = (np.array([40.0, 0.0, 0.0]), np.array([0.0, 0.0, 40.0]))
    monkeypatch.setattr(
        _selection, "select_partition", lambda *a: _selection.Selection((2.0, 1.0), counts, 0.0)
    )
    with pytest.warns(UserWarning, match="Only 1 of the 3 clusters hold"):
        dpsc.tl.fit(small_adata, epsilon=None, **tiny_fit)
    entry = small_adata.uns["dpsc"]["X_dpdcan"]
    assert entry["clusters_in_use"] == 1 and entry["params"]["partition"] == "clustering"
    np.testing.assert_array_equal(entry["label_counts"], counts[0])
