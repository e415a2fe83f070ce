"""Readers: the scDCC-style ``.h5`` benchmark files, and an AnnData zarr store read out of core."""

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


def read_zarr(path: str | Path, *, chunk: int | None = None) -> ad.AnnData:
    """Read an AnnData zarr store with ``X`` left on disk: a Dask array in whole-cell row chunks.

    ``obs`` and ``var`` are read into memory; ``X`` stays lazy, so ``dpsc.tl.cluster``,
    ``dpsc.tl.rank_genes_groups`` and the ``pp`` tools read it block by block (on a
    ``dask.distributed`` client when one is active). Every chunk holds whole cells and every gene,
    as a private release's per-cell bound needs.

    Parameters
    ----------
    path
        A folder written by ``adata.write_zarr(path)``.
    chunk
        Cells per chunk (default: dpsc's row block).

    Returns
    -------
    The AnnData, ``X`` a Dask array.

    Raises
    ------
    ValueError
        When the folder is not a zarr store, or lacks ``X``, ``obs`` or ``var``.
    """
    from .._blocks import ROW_CHUNK

    try:
        import zarr

        group = zarr.open_group(str(path), mode="r")
    except Exception as err:  # any reason the folder is not a zarr group
        raise ValueError(
            f"{path} is not a zarr store ({type(err).__name__}); pass a store written with "
            "adata.write_zarr(path), or an .h5ad file."
        ) from None
    missing = [key for key in ("X", "obs", "var") if key not in group]
    if missing:
        raise ValueError(
            f"{path} is a zarr store without the AnnData layout (no {', '.join(missing)}); write the cells "
            "with adata.write_zarr(path)."
        )
    rows = ROW_CHUNK if chunk is None else int(chunk)
    return ad.AnnData(
        X=ad.experimental.read_elem_lazy(group["X"], chunks=(rows, -1)),
        obs=ad.io.read_elem(group["obs"]),
        var=ad.io.read_elem(group["var"]),
    )
