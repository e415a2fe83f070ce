"""Reading a cells × genes matrix in row blocks: never a dense copy of all cells.

Every function that reads the cells (input checks, DP releases, encoders, annotation, audits)
goes through :func:`row_blocks`, so it works on in-memory (dense or sparse) and on backed
(``backed="r"``) AnnData alike, and memory stays flat in the number of cells.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import scipy.sparse as sp

ROW_CHUNK = 65_536  # rows read at once from a (possibly backed) matrix
DENSE_ROWS = 4096  # rows densified at once (4096 × 2000 genes: 66 MB in float64)


def row_blocks(matrix: Any, chunk: int | None = None) -> Iterator[np.ndarray | sp.csr_matrix]:
    """Yield consecutive row blocks (:data:`ROW_CHUNK` rows by default) of an in-memory or backed matrix."""
    chunk = ROW_CHUNK if chunk is None else chunk
    for start in range(0, matrix.shape[0], chunk):
        block = matrix[start : start + chunk]
        if hasattr(block, "compute") and hasattr(block, "chunks"):  # a Dask array: its chunks may be sparse
            block = block.compute()
        yield sp.csr_matrix(block) if sp.issparse(block) else np.asarray(block)


def dense_blocks(
    matrix: Any, rows: int | None = None, columns: np.ndarray | None = None, dtype: type = np.float32
) -> Iterator[np.ndarray]:
    """Yield dense ``rows``-cell blocks (of ``columns`` only, if given) of an in-memory or backed matrix."""
    for block in row_blocks(matrix, DENSE_ROWS if rows is None else rows):
        if columns is not None:
            block = block[:, columns]
        yield np.asarray(block.toarray() if sp.issparse(block) else block, dtype=dtype)


def map_rows(matrix: Any, fn, n_out: int, rows: int | None = None, columns: np.ndarray | None = None):
    """Apply ``fn`` (dense block → ``(rows, n_out)`` array) block by block; return all rows, float32."""
    out = np.empty((matrix.shape[0], n_out), dtype=np.float32)
    start = 0
    for block in dense_blocks(matrix, rows, columns):
        out[start : start + len(block)] = fn(block)
        start += len(block)
    return out
