"""Per-sample normalisation and outlier projection (Honkela et al. 2018, "Methods")."""

from __future__ import annotations

import numpy as np


def normalise_rows(X: np.ndarray, center: np.ndarray | None) -> np.ndarray:
    r"""Centre genes with a given (public) mean and scale every sample to unit L2 norm.

    .. math:: x_i \leftarrow (x_i - m) / \lVert x_i - m \rVert_2

    The centre ``m`` must not be computed from private samples (it would leak their mean
    without accounting); dpsc passes the mean of the public samples, or zeros. The scaling is
    per sample and uses nothing but that sample. A sample equal to ``m`` stays at zero.
    """
    X = np.asarray(X, dtype=float)
    Xc = X - center if center is not None else X.copy()
    norms = np.linalg.norm(Xc, axis=1, keepdims=True)
    return np.divide(Xc, norms, out=np.zeros_like(Xc), where=norms > 0)


def project(values: np.ndarray, bound: float) -> np.ndarray:
    r"""Project (clip) every entry onto :math:`[-B, B]`: :math:`v \leftarrow \max(-B, \min(v, B))`."""
    if not bound > 0:
        raise ValueError(f"Projection bound must be > 0, got {bound}.")
    return np.clip(values, -bound, bound)
