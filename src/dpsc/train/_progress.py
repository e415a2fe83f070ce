"""What a DP-DCAN fit shows while it trains: one progress bar over both stages, and no log noise."""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from lightning.pytorch.callbacks import Callback
from tqdm.auto import tqdm

from ..privacy import DPSGDSettings


class FitProgress(Callback):
    """A tqdm bar over the epochs of every stage of one fit, with the stage and the ε spent so far.

    The ε shown is the DP-SGD accountant's (Opacus) after the steps taken (the fit's total, with its
    other releases, is in its record): it depends only on σ, q and
    the step count, never on the cells, so showing it releases nothing.

    Parameters
    ----------
    total_epochs
        Epochs of all stages together (the bar's length).
    delta
        δ at which the running ε is shown; ``None`` for a non-private fit.
    enabled
        ``False`` draws nothing; in a data-parallel fit only the first process draws.
    """

    def __init__(self, total_epochs: int, delta: float | None, enabled: bool = True) -> None:
        self.delta = delta
        name = "DP-DCAN" if delta else "DCAN"
        first_process = all(os.environ.get(k, "0") == "0" for k in ("RANK", "LOCAL_RANK", "NODE_RANK"))
        self.bar = tqdm(total=total_epochs, desc=name, unit="epoch", disable=not (enabled and first_process))
        self.stage = ""
        self.settings: DPSGDSettings | None = None

    def start_stage(self, name: str, settings: DPSGDSettings | None = None) -> None:
        """Label the epochs that follow with the stage ``name``; read ε from the DP-SGD ``settings``."""
        self.stage, self.settings = name, settings
        self.bar.set_postfix_str(name)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        """Advance the bar by one epoch and show the ε spent so far."""
        postfix = self.stage
        if self.settings is not None and self.delta:
            postfix = f"{postfix}, DP-SGD ε={self.settings.spent(self.delta):.2f}"
        self.bar.set_postfix_str(postfix, refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        """End the bar (after the last stage, or on an error)."""
        self.bar.close()


_TRAINING_LOGGERS = ("lightning.pytorch", "lightning.fabric", "lightning", "scvi")


@contextmanager
def quiet_training_logs() -> Iterator[None]:
    """Show only warnings from Lightning and scvi while a stage trains, then restore the levels.

    Each stage builds a Lightning ``Trainer``, whose INFO lines (devices, an advert, "max_epochs
    reached") scvi's handler prints a second time; the progress bar says all of it. Lightning's
    own deprecation notice about torch's pytree API (not ours to act on) is dropped too.
    """
    loggers = [logging.getLogger(name) for name in _TRAINING_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(max(lg.level, logging.WARNING))
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)
