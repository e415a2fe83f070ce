"""DP-SGD MLP classifier: the gradient-perturbation comparison for the functional mechanism."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from ..privacy import (
    DonorRows,
    DPSGDEngine,
    DPSGDSettings,
    GaussianSum,
    NoiseSource,
    PlannedRelease,
    ReleasePlan,
    estimator_record,
    history_epsilon,
    poisson_steps,
)

#: Share of ε a donor-level fit spends on the released number of donors (the denominator of its
#: noisy mean gradient): a fixed, data-independent split, small because one count of sensitivity 1
#: needs little.
DONOR_COUNT_SHARE = 0.02


class DPSGDClassifier:
    """One-hidden-layer MLP trained with DP-SGD through :class:`~dpsc.privacy.DPSGDEngine`.

    Each step includes every row independently with rate ``q = batch_size / n`` (Poisson
    sampling from the secret stream, as the accountant assumes), clips each row's gradient of its
    own cross-entropy to ``max_grad_norm`` and adds ``N(0, σ²C²)`` to their sum; an empty sample
    still takes the noisy step. An epoch is ``round(1/q)`` steps. The accountant is Opacus's PRV
    accountant by default (``"rdp"`` selectable); RDP with Opacus's default orders cannot certify
    ε below about 0.19 at δ = 1e-5. σ is calibrated to spend ``epsilon`` over ``epochs``, or
    given as ``noise_multiplier``, in which case training stops before the first epoch whose
    spent ε would exceed ``max_epsilon`` (a decision on public quantities only). Unlike the
    functional mechanism, the spent ε grows with every epoch. ``epsilon=None`` and
    ``noise_multiplier=None`` train the same network without privacy.

    ``fit(..., donors=codes)`` makes the guarantee per donor: each step includes every donor with
    rate q and, for a donor included, one of its rows at random (:class:`~dpsc.privacy.DonorRows`),
    so a donor adds at most one clipped gradient; :data:`DONOR_COUNT_SHARE` of ε releases the
    number of donors (one Gaussian count, sensitivity 1), and q times that released count divides
    the summed gradient (post-processing), never the true number.
    """

    def __init__(
        self,
        *,
        epsilon: float | None = 1.0,
        delta: float = 1e-5,
        noise_multiplier: float | None = None,
        max_epsilon: float | None = None,
        epochs: int = 30,
        batch_size: int = 128,
        lr: float = 0.05,
        max_grad_norm: float = 1.0,
        hidden: int = 64,
        accountant: str = "prv",
        random_state: int = 0,
        noise_seed: int | None = None,
    ) -> None:
        self.epsilon = epsilon
        self.delta = delta
        self.noise_multiplier = noise_multiplier
        self.max_epsilon = max_epsilon
        self.epochs = epochs
        self.batch_size = batch_size
        self.lr = lr
        self.max_grad_norm = max_grad_norm
        self.hidden = hidden
        self.accountant = accountant
        self.random_state = random_state
        self.noise_seed = noise_seed

    @property
    def private(self) -> bool:
        """Whether the fit uses DP-SGD."""
        return self.epsilon is not None or self.noise_multiplier is not None

    def fit(self, X: np.ndarray, y: np.ndarray, donors: np.ndarray | None = None) -> DPSGDClassifier:
        """Train on features ``X`` ``(n, d)`` and labels ``y``; ``donors``: each row's donor (per donor)."""
        if donors is not None and (self.epsilon is None or self.noise_multiplier is not None):
            raise ValueError(
                "A donor-level DPSGDClassifier needs an epsilon (and no fixed noise_multiplier)."
            )
        self.donors_ = None if donors is None else DonorRows.of(np.asarray(donors))
        torch.manual_seed(self.random_state)  # initialisation and the non-private shuffling only
        self.classes_, codes = np.unique(np.asarray(y), return_inverse=True)
        X_t = torch.as_tensor(np.asarray(X), dtype=torch.float32)
        y_t = torch.as_tensor(codes, dtype=torch.long)
        self.n_train_ = int(X_t.shape[0])
        self.network_ = nn.Sequential(
            nn.Linear(X_t.shape[1], self.hidden), nn.ReLU(), nn.Linear(self.hidden, self.classes_.size)
        )
        optimizer = torch.optim.SGD(self.network_.parameters(), lr=self.lr, momentum=0.9)
        self.epsilon_history_: list[float] = []
        self.epochs_trained_ = 0
        if self.private:
            self._train_private(X_t, y_t, optimizer)
        else:
            self._train_plain(X_t, y_t, optimizer)
        return self

    def _settings(self, n: int) -> tuple[DPSGDSettings, int]:
        q = min(1.0, self.batch_size / n)
        steps_per_epoch = max(1, round(1.0 / q))
        training = PlannedRelease("dpsgd", sample_rate=q, steps=self.epochs * steps_per_epoch)
        if self.donors_ is not None:
            counted = PlannedRelease("donors", share=DONOR_COUNT_SHARE)
            training = PlannedRelease(
                "dpsgd", share=1 - DONOR_COUNT_SHARE, sample_rate=q, steps=training.steps
            )
            plan = ReleasePlan.of(counted, training, accountant=self.accountant)
        else:
            plan = ReleasePlan.of(training, accountant=self.accountant)
        if self.noise_multiplier is None:
            plan = plan.calibrate(self.epsilon, self.delta)
        else:  # a stated σ (the ε argument is then ignored)
            plan = plan.with_sigmas(self.delta, dpsgd=self.noise_multiplier)
        noise = NoiseSource(self.noise_seed)
        settings = plan.dpsgd_settings("dpsgd", n_obs=n, max_grad_norm=self.max_grad_norm, noise=noise)
        if self.donors_ is not None:
            settings.donors = self.donors_
            sigma = plan.sigma("donors")
            count = GaussianSum("number of donors", 1, 1.0, sigma)
            released = float(count.release(np.array([self.donors_.n_donors]), noise.stream("donors"))[0])
            settings.record_full_release(sigma)
            settings.expected_batch_size = max(1, round(q * released))
        return settings, steps_per_epoch

    def _train_private(self, X: torch.Tensor, y: torch.Tensor, optimizer: torch.optim.Optimizer) -> None:
        settings, steps_per_epoch = self._settings(len(y))
        self.noise_multiplier_ = settings.noise_multiplier
        engine = DPSGDEngine([self.network_], optimizer, settings)
        loss_fn = nn.CrossEntropyLoss(reduction="none")
        self.network_.train()
        try:
            for _ in range(self.epochs):
                if (
                    self.max_epsilon is not None
                    and self._projected(settings, steps_per_epoch) > self.max_epsilon
                ):
                    break
                poisson_steps(
                    engine, len(y), steps_per_epoch, lambda idx: loss_fn(self.network_(X[idx]), y[idx])
                )
                self.epochs_trained_ += 1
                self.epsilon_history_.append(settings.spent(self.delta))
        finally:
            engine.close()
            self._history = settings.history
        self.spent_epsilon_ = self.epsilon_history_[-1] if self.epsilon_history_ else 0.0

    def _projected(self, settings: DPSGDSettings, steps: int) -> float:
        """ε after one more epoch, from a copy of the accountant's history (public quantities)."""
        history = [*settings.history, (settings.noise_multiplier, settings.sample_rate, steps)]
        return history_epsilon(history, self.delta, self.accountant)

    def _train_plain(self, X: torch.Tensor, y: torch.Tensor, optimizer: torch.optim.Optimizer) -> None:
        loader = torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(X, y),
            batch_size=min(self.batch_size, len(y)),
            shuffle=True,
            generator=torch.Generator().manual_seed(self.random_state),
        )
        loss_fn = nn.CrossEntropyLoss()
        self.network_.train()
        for _ in range(self.epochs):
            for xb, yb in loader:
                optimizer.zero_grad()
                loss_fn(self.network_(xb), yb).backward()
                optimizer.step()
            self.epochs_trained_ += 1
        self.spent_epsilon_ = float("inf")

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        """Class probabilities ``(n, n_classes)``."""
        self.network_.eval()
        with torch.no_grad():
            logits = self.network_(torch.as_tensor(np.asarray(X), dtype=torch.float32))
        return torch.softmax(logits, 1).numpy()

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Most probable class of each row."""
        return self.classes_[self.predict_proba(X).argmax(1)]

    def privacy_record(self) -> dict[str, Any]:
        """Return what the fit spent and what it covers (:func:`~dpsc.privacy.estimator_record`)."""
        if not self.private:
            return estimator_record(
                tool="DPSGDClassifier",
                epsilon=None,
                delta=0.0,
                n_rows=self.n_train_,
                mechanism="",
                covered="the network weights",
            ).to_dict()
        return estimator_record(
            tool="DPSGDClassifier",
            epsilon=self.spent_epsilon_,
            delta=self.delta,
            n_rows=self.n_train_,
            mechanism=f"DP-SGD with Poisson sampling and Opacus {self.accountant.upper()} accounting"
            + (
                ""
                if getattr(self, "donors_", None) is None
                else "; per donor: each donor drawn with rate q brings one random row, and one Gaussian "
                "release of the number of donors sets the mean gradient's denominator"
            ),
            covered="the network weights",
            neighbours="adding or removing",
            noise_seed=self.noise_seed,
            history=list(self._history),
            accountant=self.accountant,
            details={
                "mechanism": f"DP-SGD, Poisson sampling, {self.accountant.upper()} accountant",
                "noise_multiplier": self.noise_multiplier_,
                "max_grad_norm": self.max_grad_norm,
                "epochs": self.epochs_trained_,
                "epsilon_history": list(self.epsilon_history_),
            },
        ).to_dict()
