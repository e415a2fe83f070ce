"""Reader for GDSC expression + drug-response tables (cell lines × genes, one target per drug)."""

from __future__ import annotations

from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd


def read_gdsc(expression_csv: str | Path, response_csv: str | Path, *, target: str = "LN_IC50") -> ad.AnnData:
    """Join a GDSC expression table with a long-format drug-response table.

    Parameters
    ----------
    expression_csv
        Cell lines × genes (first column: Sanger model id, e.g. ``gdsc_subset_rnaseq_fpkm.csv``).
    response_csv
        Long table with ``SANGER_MODEL_ID``, ``DRUG_NAME`` and the ``target`` column.
    target
        Response column to pivot (``"LN_IC50"`` or ``"AUC"``).

    Returns
    -------
    AnnData
        Cell lines that have expression, ``X = log2(1 + value)`` (a per-sample transform),
        ``layers["raw"]`` the values as read, one ``obs`` column per drug (NaN where the pair
        was not screened; the mean is taken when a pair was screened twice).
    """
    expression = pd.read_csv(expression_csv, index_col=0)
    response = pd.read_csv(response_csv)
    needed = {"SANGER_MODEL_ID", "DRUG_NAME", target}
    if not needed <= set(response.columns):
        raise ValueError(f"{Path(response_csv).name} lacks columns {sorted(needed - set(response.columns))}.")
    wide = response.pivot_table(index="SANGER_MODEL_ID", columns="DRUG_NAME", values=target, aggfunc="mean")
    shared = expression.index.intersection(wide.index)
    if shared.empty:
        raise ValueError("No cell line is in both tables; check that both use Sanger model ids.")
    expr = expression.loc[shared]
    obs = wide.loc[shared].copy()
    obs.columns = [str(c) for c in obs.columns]
    obs.columns.name = None
    adata = ad.AnnData(
        X=np.log2(1.0 + expr.to_numpy(dtype=float)),
        obs=obs,
        var=pd.DataFrame(index=expr.columns.astype(str)),
    )
    adata.layers["raw"] = expr.to_numpy(dtype=float)
    adata.uns["dpsc_source"] = {"target": target, "expression": Path(expression_csv).name}
    return adata
