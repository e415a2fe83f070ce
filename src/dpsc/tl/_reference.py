r"""A public reference for the private clustering: its basis, the k-means start, and cluster names.

``dpsc.tl.cluster(adata, k, reference=ref)`` takes the genes, gene scales and components of a
public reference of the same tissue (:mod:`dpsc.methods._public_basis`): public cells cost no ε,
so the whole budget goes to the DP k-means. With ``reference_key`` each released centroid is
named after the reference type whose spread holds it (:mod:`dpsc._public_reference`): a map of the
released centroids and the public reference only (post-processing).

The reference is an input the caller declares public: cells of another donor, study or condition
that must not contain the private cells; it is read and checked by :mod:`dpsc._public_reference`.
"""

from __future__ import annotations

import os

import anndata as ad
import numpy as np

from .._public_reference import (  # noqa: F401  (the tools' names for them)
    UNMATCHED,
    PublicReference,
    name_centroids,
    name_clusters,
    read_reference,
    reference_points,
    write_names,
)
from .._public_reference import fingerprint as fingerprint
from ..methods._public_basis import PublicBasis


def reference_basis(
    reference: ad.AnnData | str | os.PathLike | None,
    reference_key: str | None,
    adata: ad.AnnData,
    tool: str,
    markers: bool = False,
) -> tuple[PublicReference | None, PublicBasis | None]:
    """Read and check the public reference and compute its basis (reads the reference only).

    ``markers``: the basis also holds the reference's marker centre (the tool ranks markers).
    """
    public = optional_reference(reference, reference_key, adata, tool)
    return (None, None) if public is None else (public, public.basis(markers=markers))


def optional_reference(
    reference: ad.AnnData | str | os.PathLike | None, reference_key: str | None, adata: ad.AnnData, tool: str
) -> PublicReference | None:
    """Read and check the public reference a tool was given, if any (reads the reference only)."""
    if reference is None:
        if reference_key is not None:
            raise ValueError("reference_key names a column of the reference; pass reference=... as well.")
        return None
    return read_reference(reference, adata, reference_key, tool)


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
