"""The private analyses built on :mod:`dpsc.privacy`'s releases, free of AnnData.

Each method states its per-cell contribution and its post-processing, and spends only through the
plan of :mod:`dpsc.privacy`: DP gene statistics (:mod:`._hvg`), DP PCA (:mod:`._pca`), DP k-means
(:mod:`._kmeans`), the one-call clustering's plan and pipeline (:mod:`._clustering`), private
marker tables (:mod:`._markers`), the private choice of a partition (:mod:`._selection`) and the
basis of a public reference (:mod:`._public_basis`). :mod:`dpsc.pp` and :mod:`dpsc.tl` read and
write the AnnData around them.
"""

from ._kmeans import (
    Assignment,
    dp_kmeans_centroids,
    kmeans_release_steps,
    kmeans_table,
    nearest_centroid,
    split_table,
    table_release,
)

# dpsc's own interface (not in __all__)
from ._kmeans import central_table_release as central_table_release

__all__ = [
    "Assignment",
    "dp_kmeans_centroids",
    "kmeans_release_steps",
    "kmeans_table",
    "nearest_centroid",
    "split_table",
    "table_release",
]
