"""The privacy record written by every fit and its plain-language statement."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


def privacy_statement(
    *,
    epsilon: float | None,
    delta: float,
    scope: str,
    n_obs: int,
    private_parts: list[str],
    public_parts: list[str],
) -> str:
    """Plain-language paragraph on what an (ε, δ) claim covers and what it does not.

    Parameters
    ----------
    epsilon
        ε spent, or ``None`` for a non-private fit.
    delta
        δ of the claim.
    scope
        ``"encoder"``, ``"full"`` or ``"none"``.
    n_obs
        Number of training cells.
    private_parts, public_parts
        Names of the trained parts that were / were not trained with DP noise.
    """
    if epsilon is None:
        return (
            "No differential privacy: this model was trained on the cells without clipping or "
            "noise, and its weights, centroids and outputs may reveal information about any "
            f"of the {n_obs} training cells. Do not share it outside the data owner's control."
        )
    covered = ", ".join(private_parts)
    lines = [
        f"({epsilon:.3g}, {delta:.1e})-differential privacy with respect to adding or removing "
        f"one cell of the {n_obs} training cells, by DP-SGD with Poisson sampling and Opacus "
        f"accounting. Covered: the released {covered}, including the k-means initialisation "
        "of the centroids, and anything computed from them on other data."
    ]
    if scope == "encoder":
        lines.append(
            f"Not covered: the {', '.join(public_parts)}, trained on the cells without noise "
            "(partial perturbation, as in DP-DCAN). Caveat: the encoder's gradients flow through "
            "that decoder, which is hidden state depending on every cell, so the standard DP-SGD "
            "proof does not strictly apply to the encoder either; the ε above follows the "
            "DP-DCAN paper's analysis of the noisy encoder updates. The decoder is never "
            "exported by `export_shared`. Use scope='full' for a proven guarantee."
        )
    lines.append(
        "Also not covered: the embeddings and cluster labels written for the training cells "
        "themselves (they are computed from those cells), the choice of genes and of any "
        "preprocessing statistics made on the private cells before dpsc saw them, and "
        "hyper-parameters chosen by looking at these cells. A cell is one unit of privacy: "
        "one person contributing many cells is protected only at group level."
    )
    return " ".join(lines)


def estimator_statement(
    *,
    epsilon: float | None,
    delta: float,
    n_rows: int,
    mechanism: str,
    covered: str,
    neighbours: str = "replacing",
) -> str:
    """Plain-language scope of the guarantee of a stand-alone private estimator.

    Written into ``privacy_record()["statement"]`` of the estimators in :mod:`dpsc.fm` and
    :mod:`dpsc.linear` when they are used directly, outside the ``tl`` functions (which write a
    statement specific to their own inputs).

    Parameters
    ----------
    epsilon
        ε spent; ``None`` or ``inf`` for a non-private estimator.
    delta
        δ of the claim (0 for pure ε-DP).
    n_rows
        Number of private training rows passed to ``fit``.
    mechanism
        How the noise was added, e.g. ``"Laplace noise on the sufficient statistics"``.
    covered
        What was released with noise, e.g. ``"the coefficients"``.
    neighbours
        The neighbouring relation of the proof: ``"replacing"`` (bounded DP: Laplace mechanisms
        with a known number of rows) or ``"adding or removing"`` (DP-SGD with Poisson sampling).
    """
    if epsilon is None or epsilon == float("inf"):
        return (
            f"No differential privacy: this estimator used its {n_rows} training rows without noise; "
            "its parameters and predictions may reveal information about any of them."
        )
    claim = f"({epsilon:.3g}, {delta:.1e})" if delta else f"{epsilon:.3g}"
    return (
        f"{claim}-differential privacy with respect to {neighbours} one of the {n_rows} private "
        f"training rows (features and target), by {mechanism}. Covered: {covered} and anything "
        "computed from them on other data. Not covered: the number of rows and the feature list "
        "(treated as public), any scaling or feature map fitted on the private rows before this "
        "estimator saw them, predictions made for the "
        "training rows themselves, and hyper-parameters chosen by looking at these rows."
    )


@dataclass
class PrivacyRecord:
    """What a fit spent, written to ``adata.uns["dpsc"]["privacy"]``.

    Attributes
    ----------
    epsilon
        ε actually spent, from the accountant after the steps that ran (``None``: non-private).
    target_epsilon
        The ε asked for.
    delta
        δ of the claim.
    noise_multiplier
        σ: the noise standard deviation is σ × ``max_grad_norm``.
    sample_rate
        Poisson sampling rate q.
    steps
        Sampled-Gaussian steps that ran (DP-SGD steps of both stages plus k-means releases
        plus cluster-frequency releases).
    max_grad_norm
        Per-cell clipping norm C.
    accountant
        Opacus accountant used (``"rdp"`` or ``"prv"``).
    scope
        ``"encoder"``, ``"full"`` or ``"none"``.
    statement
        What the guarantee covers and does not (:func:`privacy_statement`).
    """

    epsilon: float | None
    target_epsilon: float | None
    delta: float
    noise_multiplier: float
    sample_rate: float
    steps: int
    max_grad_norm: float
    accountant: str
    scope: str
    statement: str
    private_parameters: list[str] = field(default_factory=list)
    kmeans_steps: int = 0
    frequency_steps: int = 0
    secure_mode: bool = False
    curve_steps: list[int] = field(default_factory=list)
    curve_epsilon: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict, suitable for ``adata.uns`` and for writing to ``.h5ad``."""
        out = asdict(self)
        if out["epsilon"] is None:
            out["epsilon"] = float("nan")
            out["target_epsilon"] = float("nan")
        return out
