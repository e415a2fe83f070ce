r"""The parts of a marker release a public reference can give: the centre and the focused genes.

:mod:`.markers` releases the cells' mean expression (the centre :math:`m` every cell is measured
from) and chooses the genes U of its focused table from its first, noisy table. Both only have to
be public when the next release is made, not exact: any public :math:`m \ge 0` keeps every bound
and Δ of :mod:`.markers` (its worst cases hold for :math:`x, m \ge 0`), and any public U keeps
the focused table's. A public reference of the same tissue gives both at no ε:

* :func:`reference_center`: the reference cells' mean log1p(CP10k) expression on the private
  matrix's genes (0 on a gene the reference lacks), clipped to :math:`[0, \log(1 + 10^4)]`, so the
  centre release is left out and its share of ε goes to the others;
* :func:`reference_focus_genes`: with the reference's cell types, the union of each type's
  ``per_group`` best genes by scanpy's t-test score (type against the rest, log1p(CP10k)), in
  the private columns: the focused table reads the genes that mark the tissue's known types
  instead of genes read off a noisy table.

Reads the public reference only (a matrix, its shared columns and its labels): no cell of the
private data, no ε.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from .markers import MAX_LOG_EXPRESSION, _log_expression, _rows, _sparse_log_expression


def _log_blocks(counts: Any):
    """Yield log1p(CP10k) of the reference's row blocks (whole cells: every reference gene counts)."""
    for rows in _rows(counts, counts.shape[1]):
        yield _sparse_log_expression(rows) if sp.issparse(rows) else _log_expression(rows)


def _dense(values: Any) -> np.ndarray:
    return values.toarray() if sp.issparse(values) else np.asarray(values)


def reference_center(
    counts: Any, reference_genes: np.ndarray, private_genes: np.ndarray, n_genes: int
) -> np.ndarray:
    r"""Return the public centre: the reference's mean log1p(CP10k) on the private matrix's genes.

    :math:`m_j = \frac1{N}\sum_i x_{ij}` over the N reference cells for gene j of the private
    matrix shared with the reference (``private_genes[k]`` is ``reference_genes[k]`` there), 0 for
    a gene it lacks; clipped to :math:`[0, \log(1 + 10^4)]`. ``n_genes``: the private matrix's.
    """
    total = np.zeros(counts.shape[1])
    for x in _log_blocks(counts):
        total += np.asarray(x.sum(0)).ravel()
    center = np.zeros(n_genes)
    center[np.asarray(private_genes)] = total[np.asarray(reference_genes)] / max(counts.shape[0], 1)
    return np.clip(center, 0.0, MAX_LOG_EXPRESSION)


def reference_focus_genes(
    counts: Any,
    labels: np.ndarray,
    reference_genes: np.ndarray,
    private_genes: np.ndarray,
    per_group: int,
) -> np.ndarray:
    r"""Return U: the union of each reference type's ``per_group`` best shared genes, private columns.

    Scores are scanpy's t-test (``method="t-test"``): :math:`(\mu_g - \mu_r) /
    \sqrt{v_g / n_g + v_r / n_r}` on log1p(CP10k), type g against the other reference cells, with
    unbiased variances. Only genes shared with the private matrix are ranked. Sorted.
    """
    labels = np.asarray(labels).astype(str)
    kinds = np.unique(labels)
    shared = np.asarray(reference_genes)
    sums = np.zeros((len(kinds), counts.shape[1]))
    squares = np.zeros_like(sums)
    sizes = np.array([(labels == k).sum() for k in kinds], dtype=np.float64)
    start = 0
    for x in _log_blocks(counts):
        codes = np.searchsorted(kinds, labels[start : start + x.shape[0]])
        start += x.shape[0]
        cells = np.arange(len(codes))
        member = sp.csr_matrix((np.ones(len(codes)), (codes, cells)), (len(kinds), len(codes)))
        sums += _dense(member @ x)
        squares += _dense(member @ (x.multiply(x) if sp.issparse(x) else x**2))
    n_all, sum_all, square_all = sizes.sum(), sums.sum(0), squares.sum(0)
    chosen = []
    for g in range(len(kinds)):
        n_rest = max(n_all - sizes[g], 2.0)
        n_g = max(sizes[g], 2.0)
        mean_g, mean_r = sums[g] / n_g, (sum_all - sums[g]) / n_rest
        var_g = np.maximum(squares[g] / n_g - mean_g**2, 0.0) * n_g / (n_g - 1)
        var_r = np.maximum((square_all - squares[g]) / n_rest - mean_r**2, 0.0) * n_rest / (n_rest - 1)
        scores = (mean_g - mean_r) / np.sqrt(var_g / n_g + var_r / n_rest + 1e-12)
        best = np.argsort(-scores[shared], kind="stable")[:per_group]
        chosen.append(np.asarray(private_genes)[best])
    return np.unique(np.concatenate(chosen))
