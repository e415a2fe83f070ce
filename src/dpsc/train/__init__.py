"""Lightning training machinery: Poisson-sampled data and the DP-DCAN training plan."""

from ._data import PoissonDataSplitter
from ._data import as_tensor as as_tensor  # for dpsc.model (not in __all__)
from ._plan import DCANTrainingPlan
from ._progress import FitProgress as FitProgress  # for dpsc.model (not in __all__)
from ._progress import quiet_training_logs as quiet_training_logs

__all__ = ["DCANTrainingPlan", "PoissonDataSplitter"]
