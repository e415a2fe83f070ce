r"""Names for private clusters from a public reference: post-processing of released centroids.

Each released centroid is named after the public reference cells around it, in the points of a
public basis (:mod:`dpsc.methods._public_basis`), or :data:`UNMATCHED` where the reference has no
cells. Reads released centroids and the public reference only: no ε. The central tools
(:mod:`dpsc.tl._reference`) and a federated site (:mod:`dpsc.federated._site`) name clusters
with it, so both write the same names.
"""

from __future__ import annotations

from typing import Any

import anndata as ad
import numpy as np
import pandas as pd

from ._public_reference import PublicReference
from .methods._public_basis import PublicBasis

UNMATCHED = "unmatched"
#: A centroid is named by the vote of its :data:`NEIGHBOURS` nearest reference cells, when it lies
#: where the reference has cells: its distance to the farthest of them is at most the
#: :data:`MATCH_QUANTILE` quantile of the same distance for the reference's own cells (a density
#: test; a type the reference lacks sits where it has none). Otherwise it is :data:`UNMATCHED`.
NEIGHBOURS = 10
MATCH_QUANTILE = 0.9
DENSITY_SAMPLE = 2000  # reference cells whose neighbour distances make that quantile
#: Widen each centroid's density test by its own noise (:func:`name_centroids`). Measured on the
#: reference / private pairs and not adopted: names agree with the cells' types more often (most at
#: ε = 2), but a type the reference lacks was then never named "unmatched" (docs, Benchmarks).
NOISE_AWARE = False


def reference_points(reference: PublicReference, basis: PublicBasis) -> np.ndarray:
    """Return the reference cells' points in the basis (public)."""
    return np.asarray(reference.own_basis(basis).points(reference.counts))


def name_clusters(
    centroids: np.ndarray,
    reference: PublicReference,
    basis: PublicBasis,
    noise: np.ndarray | None = None,
) -> pd.DataFrame:
    """Name each released centroid (in the basis' points) after the reference cells around it.

    :func:`name_centroids` in the basis' points of the reference's cells; ``noise``: each
    centroid's noise sd per coordinate (:func:`dpsc.methods.dp_kmeans_centroids`).
    """
    points = reference_points(reference, basis)
    return name_centroids(centroids, points, reference.labels.to_numpy(), noise)


def name_centroids(
    centroids: np.ndarray, points: np.ndarray, labels: np.ndarray, noise: np.ndarray | None = None
) -> pd.DataFrame:
    r"""Name each released centroid after the public reference cells around it (post-processing).

    In the space of ``points`` (the reference cells, as the centroids' cells are read), let
    :math:`N_j` be the :data:`NEIGHBOURS` reference cells nearest to centroid :math:`\mu_j` and
    :math:`d_j` the distance to the farthest of them; :math:`D` the same distance for reference
    cells (a sample of :data:`DENSITY_SAMPLE`, their neighbours among all the others). Centroid j
    is named after the most frequent type of :math:`N_j` when :math:`d_j \le \sqrt{q^2 + p\,s_j^2}`,
    q the :data:`MATCH_QUANTILE` quantile of :math:`D`, else :data:`UNMATCHED`: :math:`s_j` is the
    centroid's noise sd per coordinate (``noise``; 0 when not given) and p the points' dimension, so
    a centroid that its noise alone moved :math:`\approx \sqrt p\, s_j` away from where the
    reference has cells is still matched (with :data:`NOISE_AWARE`; otherwise :math:`s_j = 0`).
    Reads the released centroids, their public noise and the public reference only. Returns one
    row per centroid: ``name``, ``share`` (of :math:`N_j` with that type) and ``nearest_type``.
    """
    points = np.asarray(points, dtype=np.float64)
    sample = np.random.default_rng(0).permutation(len(points))[:DENSITY_SAMPLE]
    own = _neighbour_distances(points[sample], points, NEIGHBOURS + 1)[0]  # itself is the first
    floor = float(np.quantile(own, MATCH_QUANTILE))
    distance, nearest = _neighbour_distances(np.asarray(centroids, dtype=np.float64), points, NEIGHBOURS)
    spread = np.zeros(len(centroids))
    if noise is not None and NOISE_AWARE:
        spread = np.asarray(noise, dtype=np.float64)
    allowed = np.sqrt(floor**2 + points.shape[1] * spread**2)
    rows = []
    for j in range(len(centroids)):
        types, votes = np.unique(labels[nearest[j]], return_counts=True)
        best = types[votes.argmax()]
        name = best if distance[j] <= allowed[j] else UNMATCHED
        rows.append({"name": name, "share": votes.max() / NEIGHBOURS, "nearest_type": best})
    return pd.DataFrame(rows, index=pd.Index([str(j) for j in range(len(centroids))], name="cluster"))


def write_names(target: ad.AnnData, key: str, names: pd.DataFrame) -> dict[str, Any]:
    """Write each cell's cluster name to ``obs[f"{key}_names"]``; return the names as ``uns`` stores them."""
    target.obs[f"{key}_names"] = pd.Categorical(names["name"].reindex(target.obs[key].astype(str)).to_numpy())
    return names.to_dict(orient="index")


def _neighbour_distances(queries: np.ndarray, points: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Return each query's distance to its m-th nearest point and the indices of its m nearest."""
    squared = (queries**2).sum(1)[:, None] - 2 * queries @ points.T + (points**2).sum(1)[None, :]
    nearest = np.argsort(squared, axis=1)[:, :m]
    farthest = np.take_along_axis(squared, nearest[:, -1:], axis=1)[:, 0]
    return np.sqrt(np.maximum(farthest, 0.0)), nearest
