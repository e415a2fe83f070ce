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
