r"""Gene scaling with statistics pooled over the sites (an optional first round of FedSC).

Each site :math:`k` sends, once, the per-gene sums of its represented cells
:math:`S_k = \sum_{i \in k} x_i`, :math:`Q_k = \sum_{i \in k} x_i^2` and its count :math:`n_k`;
the server pools them into the mean and standard deviation over all :math:`N = \sum_k n_k`
cells,

.. math:: m = \frac{1}{N}\sum_k S_k, \qquad
          s = \sqrt{\max\Big(\frac{1}{N}\sum_k Q_k - m^2,\ 0\Big)},

and every site z-scores its own cells with them, :math:`\tilde x = \mathrm{clip}((x - m)/s,
-c, c)` with :math:`c = 10` (scanpy's ``pp.scale(max_value=10)`` convention); genes with
:math:`s = 0` are only centred. The sums are sent without noise: they are not covered by the
client-level DP guarantee, so :func:`dpsc.tl.fit_federated` refuses them together with
``epsilon``.
"""

from __future__ import annotations

import numpy as np
import torch

CLIP = 10.0


def site_sums(X: np.ndarray) -> dict[str, torch.Tensor]:
    """Per-gene ``sum``, ``sumsq`` and the cell count ``n`` of one site's cells × genes."""
    X = np.asarray(X, dtype=np.float64)
    return {
        "sum": torch.as_tensor(X.sum(0)),
        "sumsq": torch.as_tensor((X**2).sum(0)),
        "n": torch.tensor([float(X.shape[0])], dtype=torch.float64),
    }


def pooled_scaling(sums: list[dict[str, torch.Tensor]]) -> tuple[np.ndarray, np.ndarray]:
    """Pooled per-gene mean ``m`` and standard deviation ``s`` from the sites' :func:`site_sums`."""
    if not sums:
        raise ValueError("No site sent its sums; cannot pool gene statistics.")
    n = sum(float(s["n"][0]) for s in sums)
    mean = sum(s["sum"].double().numpy() for s in sums) / n
    var = sum(s["sumsq"].double().numpy() for s in sums) / n - mean**2
    return mean, np.sqrt(np.clip(var, 0.0, None))


def apply_scaling(X: np.ndarray, mean: np.ndarray, std: np.ndarray, clip: float = CLIP) -> np.ndarray:
    r""":math:`\mathrm{clip}((x - m)/s, -c, c)` per gene, float32; genes with ``s = 0`` are centred only."""
    safe = np.where(std > 0, std, 1.0)
    return np.clip((np.asarray(X, dtype=np.float64) - mean) / safe, -clip, clip).astype(np.float32)
