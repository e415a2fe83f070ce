r"""A public reference for the private clustering: its basis, the k-means start, and cluster names.

``dpsc.tl.cluster(adata, k, reference=ref)`` takes the genes, gene scales and components of a
public reference of the same tissue (:mod:`dpsc.methods._public_basis`): public cells cost no ε,
so the whole budget goes to the DP k-means. With ``reference_key`` each released centroid is
named after the reference type whose mean point it matches (:func:`name_clusters`): a map of the
released centroids and the public reference only (post-processing).

The reference is an input the caller declares public: cells of another donor, study or condition
that must not contain the private cells; it is read and checked by :mod:`dpsc._public_reference`.
"""

from __future__ import annotations

import os
from typing import Any

import anndata as ad
import numpy as np
import pandas as pd

from .._public_reference import PublicReference, read_reference
from .._public_reference import fingerprint as fingerprint
from ..methods._public_basis import PublicBasis

UNMATCHED = "unmatched"
#: A centroid is named by the vote of its :data:`NEIGHBOURS` nearest reference cells, when it lies
#: where the reference has cells: its distance to the farthest of them is at most the
#: :data:`MATCH_QUANTILE` quantile of the same distance for the reference's own cells (a density
#: test; a type the reference lacks sits where it has none). Otherwise it is :data:`UNMATCHED`.
NEIGHBOURS = 10
MATCH_QUANTILE = 0.9
DENSITY_SAMPLE = 2000  # reference cells whose neighbour distances make that quantile


def reference_basis(
    reference: ad.AnnData | str | os.PathLike | None, reference_key: str | None, adata: ad.AnnData, tool: str
) -> tuple[PublicReference | None, PublicBasis | None]:
    """Read and check the public reference and compute its basis (reads the reference only)."""
    if reference is None:
        if reference_key is not None:
            raise ValueError("reference_key names a column of the reference; pass reference=... as well.")
        return None, None
    public = read_reference(reference, adata, reference_key, tool)
    return public, public.basis()


#: Where the DP k-means on a reference's basis starts: ``"sketch"`` (its own sketch release, as
#: without a reference), ``"reference kmeans"`` (k-means of the reference cells' points, as many
#: centroids as the Lloyd phase holds) or ``"type means"`` (the mean point of each reference type,
#: with ``reference_key``). Both public starts make no sketch release.
START = "sketch"
START_SEED = 0  # the public k-means of the reference's points (public data, public seed)


def start_centroids(
    reference: PublicReference, basis: PublicBasis, n_clusters: int, oversampling: int
) -> np.ndarray | None:
    """Return ``oversampling × n_clusters`` public starting centroids of the DP k-means (:data:`START`).

    With ``"type means"`` the reference types' mean points come first, and k-means centroids of the
    reference's points fill the rest. Computed from the public reference alone: no ε.
    """
    if START == "sketch":
        return None
    from sklearn.cluster import KMeans

    points = reference_points(reference, basis)
    n_start = oversampling * n_clusters  # the rows of the plan's Lloyd tables
    means = np.zeros((0, points.shape[1]))
    if START == "type means" and reference.labels is not None:
        labels = reference.labels.to_numpy()
        means = np.stack([points[labels == kind].mean(0) for kind in np.unique(labels)])[:n_start]
    rest = n_start - len(means)
    if rest == 0:
        return means
    fill = KMeans(min(rest, len(points)), n_init=4, random_state=START_SEED).fit(points).cluster_centers_
    start = np.concatenate([means, fill])
    return np.concatenate([start, start[: n_start - len(start)]]) if len(start) < n_start else start


def reference_points(reference: PublicReference, basis: PublicBasis) -> np.ndarray:
    """Return the reference cells' points in the basis (public)."""
    return np.asarray(reference.own_basis(basis).points(reference.counts))


def name_clusters(centroids: np.ndarray, reference: PublicReference, basis: PublicBasis) -> pd.DataFrame:
    """Name each released centroid (in the basis' points) after the reference cells around it.

    :func:`name_centroids` in the basis' points of the reference's cells.
    """
    return name_centroids(centroids, reference_points(reference, basis), reference.labels.to_numpy())


def name_centroids(centroids: np.ndarray, points: np.ndarray, labels: np.ndarray) -> pd.DataFrame:
    r"""Name each released centroid after the public reference cells around it (post-processing).

    In the space of ``points`` (the reference cells, as the centroids' cells are read), let
    :math:`N_j` be the :data:`NEIGHBOURS` reference cells nearest to centroid :math:`\mu_j` and
    :math:`d_j` the distance to the farthest of them; :math:`D` the same distance for reference
    cells (a sample of :data:`DENSITY_SAMPLE`, their neighbours among all the others). Centroid j
    is named after the most frequent type of :math:`N_j` when :math:`d_j \le` the
    :data:`MATCH_QUANTILE` quantile of :math:`D`, else :data:`UNMATCHED`. Reads the released
    centroids and the public reference only. Returns one row per centroid: ``name``, ``share``
    (of :math:`N_j` with that type) and ``nearest_type``.
    """
    points = np.asarray(points, dtype=np.float64)
    sample = np.random.default_rng(0).permutation(len(points))[:DENSITY_SAMPLE]
    own = _neighbour_distances(points[sample], points, NEIGHBOURS + 1)[0]  # itself is the first
    floor = float(np.quantile(own, MATCH_QUANTILE))
    distance, nearest = _neighbour_distances(np.asarray(centroids, dtype=np.float64), points, NEIGHBOURS)
    rows = []
    for j in range(len(centroids)):
        types, votes = np.unique(labels[nearest[j]], return_counts=True)
        best = types[votes.argmax()]
        name = best if distance[j] <= floor else UNMATCHED
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
