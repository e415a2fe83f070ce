"""Readers for the scDCC-style ``.h5`` benchmark files."""

from __future__ import annotations

from pathlib import Path

import anndata as ad
import h5py
import numpy as np
import pandas as pd
import scipy.sparse as sp


def _decode(values: np.ndarray) -> list[str]:
    return [v.decode() if isinstance(v, bytes) else str(v) for v in values]


def read_h5(path: str | Path) -> ad.AnnData:
    """Read an scDCC/scDeepCluster-style ``.h5`` file into AnnData.

    The file holds ``X`` (cells × genes), ``Y`` (integer labels) and optionally
    ``cell_type`` (label names), ``gene_names`` and ``cell_names``.

    Parameters
    ----------
    path
        Path to the ``.h5`` file.

    Returns
    -------
    AnnData
        ``X`` as sparse CSR float32 (values unchanged; check whether they are counts before
        using a count likelihood), ``obs["label"]`` categorical (``cell_type`` names when the
        file has them, else the ``Y`` values as strings).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"No such file: {path}. Pass the path to an scDCC-style .h5 file.")
    with h5py.File(path, "r") as h5:
        missing = [k for k in ("X", "Y") if k not in h5]
        if missing:
            raise ValueError(
                f"{path.name} lacks dataset(s) {missing}; an scDCC-style file needs 'X' and 'Y'."
            )
        x = np.asarray(h5["X"][:], dtype=np.float32)
        y = np.asarray(h5["Y"][:]).astype(int)
        names = _decode(h5["cell_type"][:]) if "cell_type" in h5 else [str(v) for v in y]
        genes = (
            _decode(h5["gene_names"][:])
            if "gene_names" in h5
            else [f"gene_{j:05d}" for j in range(x.shape[1])]
        )
        cells = (
            _decode(h5["cell_names"][:])
            if "cell_names" in h5
            else [f"cell_{i:05d}" for i in range(x.shape[0])]
        )
    obs = pd.DataFrame({"label": pd.Categorical(names), "label_code": y}, index=cells)
    obs.index = obs.index.astype(str)
    var = pd.DataFrame(index=pd.Index(genes).astype(str))
    adata = ad.AnnData(X=sp.csr_matrix(x), obs=obs, var=var)
    adata.var_names_make_unique()
    adata.obs_names_make_unique()
    return adata
