"""Tools: scanpy-style functions that fit models and write results into AnnData."""

from ._fit import DEFAULT_N_CLUSTERS, fit
from ._regression import private_regression

__all__ = ["DEFAULT_N_CLUSTERS", "fit", "private_regression"]
