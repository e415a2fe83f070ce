"""Lightning training machinery: Poisson-sampled data and the DP-DCAN training plan."""

from ._data import PoissonDataSplitter
from ._plan import DCANTrainingPlan, DPConfig

__all__ = ["DCANTrainingPlan", "DPConfig", "PoissonDataSplitter"]
