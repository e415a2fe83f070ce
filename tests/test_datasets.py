import h5py
import numpy as np
import pytest

import dpsc


def test_pbmc4k_is_real_raw_counts(pbmc_full):
    a = pbmc_full
    assert a.shape == (4271, 2000)
    x = a.X.data
    assert np.all(x == np.round(x)) and x.min() > 0 and x.max() == 777
    assert a.obs["cell_type"].nunique() == 8
    assert a.obs["cell_type"].value_counts().max() == 1292


def test_pbmc4k_returns_a_fresh_copy():
    a = dpsc.datasets.pbmc4k()
    a.obs["x"] = 1
    assert "x" not in dpsc.datasets.pbmc4k().obs


def test_tms_liver_ships_named_genes_raw_counts_and_nine_mice():
    a = dpsc.datasets.tms_liver()
    assert a.shape == (1779, 1819)
    x = a.X.data
    assert np.all(x == np.round(x)) and x.min() > 0
    assert {"Alb", "Apoa1", "Kdr", "Stab2"} <= set(a.var_names)  # the markers the tutorial names types by
    assert a.obs["cell_type"].value_counts().to_dict() == {
        "hepatocyte": 1162,
        "endothelial cell of hepatic sinusoid": 617,
    }
    assert a.obs["donor"].nunique() == 9


def test_read_h5(tmp_path):
    path = tmp_path / "toy.h5"
    with h5py.File(path, "w") as h5:
        h5["X"] = np.arange(12, dtype=np.float32).reshape(4, 3)
        h5["Y"] = np.array([1, 2, 1, 2])
        h5["cell_type"] = np.array([b"a", b"b", b"a", b"b"])
        h5["gene_names"] = np.array([b"g1", b"g2", b"g3"])
    a = dpsc.datasets.read_h5(path)
    assert a.shape == (4, 3)
    assert list(a.var_names) == ["g1", "g2", "g3"]
    assert list(a.obs["label"]) == ["a", "b", "a", "b"]
    np.testing.assert_array_equal(a.X.toarray(), np.arange(12).reshape(4, 3))


def test_read_h5_without_names_and_bad_files(tmp_path):
    path = tmp_path / "plain.h5"
    with h5py.File(path, "w") as h5:
        h5["X"] = np.ones((3, 2), dtype=np.float32)
        h5["Y"] = np.array([1, 1, 2])
    a = dpsc.datasets.read_h5(path)
    assert list(a.obs["label"]) == ["1", "1", "2"]
    bad = tmp_path / "bad.h5"
    with h5py.File(bad, "w") as h5:
        h5["X"] = np.ones((3, 2))
    with pytest.raises(ValueError, match="'Y'"):
        dpsc.datasets.read_h5(bad)
    with pytest.raises(FileNotFoundError):
        dpsc.datasets.read_h5(tmp_path / "none.h5")


def test_gdsc_subset_embedded():
    a = dpsc.datasets.gdsc_subset()
    assert a.shape == (90, 1350)
    assert len(a.obs.columns) == 10 and a.obs["Paclitaxel"].notna().sum() == 89
    assert np.isfinite(a.X).all() and a.X.min() >= 0


def test_read_gdsc_joins_tables(tmp_path):
    import pandas as pd

    pd.DataFrame({"g1": [1.0, 3.0], "g2": [0.0, 7.0]}, index=pd.Index(["S1", "S2"], name="model_id")).to_csv(
        tmp_path / "e.csv"
    )
    pd.DataFrame(
        {"SANGER_MODEL_ID": ["S1", "S1", "S3"], "DRUG_NAME": ["d", "d", "d"], "LN_IC50": [1.0, 3.0, 5.0]}
    ).to_csv(tmp_path / "r.csv", index=False)
    a = dpsc.datasets.read_gdsc(tmp_path / "e.csv", tmp_path / "r.csv")
    assert list(a.obs_names) == ["S1"] and a.obs["d"].iloc[0] == 2.0  # duplicate pair averaged
    assert a.X[0, 0] == 1.0 and a.layers["raw"][0, 0] == 1.0


@pytest.fixture(scope="module")
def atlas_pair():
    source = dpsc.datasets.pbmc4k()
    model = dpsc.datasets.fit_atlas_model(source)
    return source, model, dpsc.datasets.simulate(12_000, model=model, random_state=3)


def test_simulate_matches_the_source_per_type(atlas_pair):
    """Tolerances: library-size median ±5 %, gene means (genes with mean > 0.05) median relative
    error < 10 % and log-mean correlation > 0.99 per type, overall density ±0.005."""
    source, _, sim = atlas_pair
    assert sim.X.format == "csr" and sim.X.dtype == np.float32 and sim.X.indices.dtype == np.int32
    assert abs(sim.X.nnz / np.prod(sim.shape) - source.X.nnz / np.prod(source.shape)) < 0.005
    assert sim.uns["dpsc_dataset"]["name"] == "simulated" and "synthetic" in sim.uns["dpsc_dataset"]
    for cell_type in source.obs["cell_type"].cat.categories:
        real = source[source.obs["cell_type"] == cell_type].X
        fake = sim[sim.obs["cell_type"] == cell_type].X
        assert abs(fake.shape[0] / sim.n_obs - real.shape[0] / source.n_obs) < 0.015
        lib_real, lib_fake = (np.median(np.asarray(m.sum(axis=1))) for m in (real, fake))
        assert abs(lib_fake / lib_real - 1) < 0.05, (cell_type, lib_real, lib_fake)
        mean_real, mean_fake = np.asarray(real.mean(axis=0)).ravel(), np.asarray(fake.mean(axis=0)).ravel()
        expressed = mean_real > 0.05
        assert np.median(np.abs(mean_fake[expressed] / mean_real[expressed] - 1)) < 0.10, cell_type
        assert np.corrcoef(np.log1p(mean_real), np.log1p(mean_fake))[0, 1] > 0.99, cell_type


def test_simulate_is_reproducible_and_independent_of_threads(atlas_pair):
    _, model, sim = atlas_pair
    again = dpsc.datasets.simulate(12_000, model=model, random_state=3, n_jobs=1, chunk_size=8192)
    assert (again.X != sim.X).nnz == 0
    assert (dpsc.datasets.simulate(500, model=model, random_state=4).X != sim.X[:500]).nnz > 0
    with pytest.raises(ValueError, match="n_cells"):
        dpsc.datasets.simulate(0, model=model)


@pytest.mark.parametrize(("mu", "theta"), [(0.2, 0.5), (0.05, 0.02), (6.0, 2.0), (40.0, 0.3)])
def test_zero_truncated_nb_has_the_conditional_mean(mu, theta):
    from dpsc.datasets._simulate import _zero_truncated_nb

    n = 200_000
    p0 = (theta / (theta + mu)) ** theta
    draws = _zero_truncated_nb(np.full(n, mu), np.full(n, theta), np.full(n, p0), np.random.default_rng(0))
    assert draws.min() >= 1
    expected = mu / (1 - p0)  # E[x | x > 0]
    assert abs(draws.mean() / expected - 1) < 0.03, (draws.mean(), expected)
