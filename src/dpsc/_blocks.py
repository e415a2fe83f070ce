"""Reading a cells × genes matrix in row blocks: never a dense copy of all cells.

Every function that reads the cells (input checks, DP releases, encoders, annotation, audits)
goes through :func:`row_blocks`, so it works on in-memory (dense or sparse) and on backed
(``backed="r"``) AnnData alike, and memory stays flat in the number of cells.

A Dask array chunked by rows is read where its chunks are: each release is a sum over cells, so
:func:`blockwise_sum` applies the same per-block function to every chunk on the Dask workers (a
``dask.distributed.Client`` when one is active, else Dask's threaded scheduler) and adds the
partial sums in a tree, one ``compute`` per release; only partial sums reach the caller, who adds
the noise. The workers see un-noised partial sums, so a Dask cluster must sit inside the data
owner's boundary (TLS: ``distributed.Security``). Per-cell outputs (projections) stay lazy
(:func:`map_row_blocks`).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
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


def is_dask(matrix: Any) -> bool:
    """Whether ``matrix`` is a Dask array."""
    return type(matrix).__module__.split(".")[0] == "dask" and hasattr(matrix, "to_delayed")


def check_row_chunks(matrix: Any, name: str = "adata.X") -> None:
    """Refuse a Dask array chunked across genes (a cell's row must lie in one chunk), with the fix."""
    if is_dask(matrix) and len(matrix.chunks[1]) > 1:
        raise ValueError(
            f"{name} is a Dask array chunked across genes ({len(matrix.chunks[1])} column chunks); dpsc "
            "reads each cell whole. Rechunk it by rows only: adata.X = adata.X.rechunk({1: -1})."
        )


def _materialised(block: Any) -> np.ndarray | sp.csr_matrix:
    """Return a chunk as dpsc's block functions take it: CSR when sparse, else a numpy array."""
    if hasattr(block, "compute") and hasattr(block, "chunks"):
        block = block.compute()
    return sp.csr_matrix(block) if sp.issparse(block) else np.asarray(block)


def _call(fn, block, *per_cell):
    return fn(_materialised(block), *per_cell)


def _add(a, b):
    return a + b


def blockwise_sum(matrix: Any, fn, *per_cell: np.ndarray):
    r"""Return :math:`\sum_b` ``fn(block_b, *slices_b)`` over the row blocks of ``matrix``.

    ``fn`` maps one block (CSR or dense; with the rows of each ``per_cell`` array that belong to
    it) to its partial sum: a release's exact sum over cells is the sum of its blocks' sums. On a
    Dask array each chunk's partial sum is computed on the worker that holds it, added in a tree
    on the workers, and one ``compute`` returns the total; otherwise the blocks stream through this
    process (:func:`row_blocks`).
    """
    if not is_dask(matrix):
        total, start = None, 0
        for block in row_blocks(matrix):
            rows = block.shape[0]
            part = fn(block, *(a[start : start + rows] for a in per_cell))
            total = part if total is None else total + part
            start += rows
        return total
    import dask

    check_row_chunks(matrix)
    edges = np.cumsum((0, *matrix.chunks[0]))
    chunks = matrix.to_delayed()[:, 0]
    call = dask.delayed(_call, pure=True)
    # ``fn`` (a release's request: genes, loadings, an assignment) is one node of the graph, hashed
    # and sent once per release, not once per chunk: the client's work does not grow with the cells
    shared = dask.delayed(fn, pure=True, traverse=False)
    parts = [
        call(shared, chunk, *(a[lo:hi] for a in per_cell))
        for chunk, lo, hi in zip(chunks, edges[:-1], edges[1:], strict=True)
    ]
    add = dask.delayed(_add, pure=True)
    while len(parts) > 1:  # a tree of additions on the workers: only the total reaches this process
        parts = [add(*parts[i : i + 2]) if i + 1 < len(parts) else parts[i] for i in range(0, len(parts), 2)]
    return compute(parts[0])


def weighted_rows(values: Any, weights: np.ndarray | None) -> np.ndarray:
    r"""Return :math:`\sum_i w_i v_i` over the rows :math:`v_i` of ``values`` (dense or sparse).

    ``weights``: the :math:`w_i` (``None``: 1 each).
    """
    if weights is None:
        return np.asarray(values.sum(0)).ravel()
    return np.asarray(values.T @ weights).ravel()


def rows_of(per_cell: np.ndarray | None, start: int, n: int) -> np.ndarray | None:
    """Return the values of rows ``start … start + n`` of a per-cell array (``None`` stays ``None``)."""
    return None if per_cell is None else np.asarray(per_cell, dtype=np.float64)[start : start + n]


#: A Dask computation on the local (threaded or process) scheduler that runs longer than this many
#: seconds shows dask's progress bar; on a ``dask.distributed`` cluster the dashboard shows it.
PROGRESS_AFTER_S = 5.0


def compute(lazy: Any) -> Any:
    """Compute one Dask object; long work on a local scheduler shows dask's progress bar."""
    import dask
    from dask.diagnostics import ProgressBar

    with ProgressBar(minimum=PROGRESS_AFTER_S, dt=1.0):
        return dask.compute(lazy)[0]


def map_row_blocks(matrix: Any, fn, n_out: int, dtype: type = np.float32, rows: int | None = None):
    """Apply ``fn`` (block → ``(rows, n_out)``) to every row block; a lazy Dask array for a Dask matrix.

    ``rows``: cells per block of an in-memory or backed matrix (:data:`ROW_CHUNK` by default); a
    ``fn`` that densifies its block takes fewer, so that its memory is a block's.
    """
    if is_dask(matrix):
        check_row_chunks(matrix)
        return matrix.map_blocks(
            lambda block: np.asarray(fn(_materialised(block)), dtype=dtype),
            dtype=dtype,
            chunks=(matrix.chunks[0], (n_out,)),
            meta=np.empty((0, n_out), dtype=dtype),
        )
    out = np.empty((matrix.shape[0], n_out), dtype=dtype)
    start = 0
    for block in row_blocks(matrix, rows):
        out[start : start + block.shape[0]] = fn(block)
        start += block.shape[0]
    return out


def sum_over_cells(*per_cell: str) -> Callable:
    """Make a function that returns a sum over the cells of its ``matrix`` run blockwise on Dask.

    The decorated function's first parameter is ``matrix``; ``per_cell`` names its parameters
    that hold one value per cell (each block gets its rows; one left ``None`` stays ``None``). On
    an in-memory or backed matrix the function runs as written; on a Dask array it runs on every
    chunk (:func:`blockwise_sum`).
    """

    def decorate(fn: Callable) -> Callable:
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def wrapper(matrix: Any, *args: Any, **kwargs: Any) -> Any:
            if not is_dask(matrix):
                return fn(matrix, *args, **kwargs)
            bound = signature.bind(matrix, *args, **kwargs)
            bound.apply_defaults()
            arguments = dict(bound.arguments)
            given = tuple(name for name in per_cell if arguments[name] is not None)
            arrays = [np.asarray(arguments.pop(name)) for name in given]
            return blockwise_sum(matrix, functools.partial(_apply, fn, arguments, given), *arrays)

        return wrapper

    return decorate


def _apply(fn: Callable, arguments: dict, names: tuple, block: Any, *slices: Any) -> Any:
    return fn(**{**arguments, "matrix": block, **dict(zip(names, slices, strict=True))})
