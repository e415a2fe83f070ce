"""Lightning training machinery: Poisson-sampled data and the DP-DCAN training plan."""

from ._data import PoissonDataSplitter
from ._plan import DCANTrainingPlan

__all__ = ["DCANTrainingPlan", "PoissonDataSplitter"]
