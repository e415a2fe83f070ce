"""Tools: scanpy-style functions that fit models and write results into AnnData."""

from ._annotate import annotate
from ._audit import audit
from ._cluster import cluster
from ._cluster_federated import cluster_federated
from ._federated import fit_federated
from ._fit import DEFAULT_N_CLUSTERS, fit
from ._fit import collapse_message as collapse_message  # for the command line (not in __all__)
from ._kmeans import few_clusters_message as few_clusters_message
from ._kmeans import kmeans
from ._rank_genes_groups import rank_genes_groups
from ._reference import prepare_reference
from ._regression import private_regression

__all__ = [
    "DEFAULT_N_CLUSTERS",
    "annotate",
    "audit",
    "cluster",
    "cluster_federated",
    "fit",
    "fit_federated",
    "kmeans",
    "prepare_reference",
    "private_regression",
    "rank_genes_groups",
]
