"""The private analyses built on :mod:`dpsc.privacy`'s releases, free of AnnData.

Each method is a public module of this package that states its per-cell contribution and its
post-processing, and spends only through the plan of :mod:`dpsc.privacy`: DP gene statistics
(:mod:`.hvg`), DP PCA (:mod:`.pca`), DP k-means (:mod:`.kmeans`), private marker tables
(:mod:`.markers`), the private choice of a partition (:mod:`.selection`), the basis of a public
reference (:mod:`.public_basis`, :mod:`.public_markers`) and the count that chooses its start
(:mod:`.type_gate`). The one-call clustering is four modules: its public design
(:mod:`.cluster_design`), its request protocol (:mod:`.cluster_requests`), its plan
(:mod:`.cluster_plan`) and its run (:mod:`.clustering`). :mod:`dpsc.pp`, :mod:`dpsc.tl`,
:mod:`dpsc.model` and :mod:`dpsc.federated` read and write the AnnData around them.
"""

from .kmeans import (
    Assignment,
    dp_kmeans_centroids,
    kmeans_release_steps,
    kmeans_table,
    nearest_centroid,
    split_table,
    table_release,
)

# dpsc's own interface (not in __all__)
from .kmeans import central_table_release as central_table_release

__all__ = [
    "Assignment",
    "dp_kmeans_centroids",
    "kmeans_release_steps",
    "kmeans_table",
    "nearest_centroid",
    "split_table",
    "table_release",
]
