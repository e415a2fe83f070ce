"""Tools: scanpy-style functions that fit models and write results into AnnData."""

from ._fit import DEFAULT_N_CLUSTERS, fit

__all__ = ["DEFAULT_N_CLUSTERS", "fit"]
