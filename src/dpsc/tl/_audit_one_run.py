"""``dpsc.tl.audit(method="one_run")``: a one-run canary audit of the DP-SGD engine on these cells."""

from __future__ import annotations

from typing import Any

import anndata as ad
import numpy as np
import pandas as pd
import scipy.sparse as sp
import torch

from .._validation import check_matrix, check_privacy_args, get_matrix
from ..audit import gradient_canary_run, input_canary_run
from ..privacy import (
    NoiseSource,
    PrivacyRecord,
    gaussian_release_record,
    no_guarantee_record,
    write_result,
)

CANARIES = ("gradient", "input")


def one_run_record(run: dict[str, Any], n_obs: int, noise: NoiseSource) -> PrivacyRecord:
    """Ledger record of the audited run: its canary scores are post-processing of its noisy gradients."""
    covered = "the audit report (canary scores, guesses, the ε lower bound)"
    unit = f"adding or removing one of the {n_obs} cells"
    if not run["history"]:
        return no_guarantee_record("audit", unit=unit, covered=covered)
    sigma, q, steps = run["history"][0]
    return gaussian_release_record(
        "audit",
        sigma=float(sigma),
        sample_rate=float(q),
        steps=int(steps),
        target_epsilon=None,
        delta=float(run["delta"]),
        unit=unit,
        mechanism="DP-SGD on the encoder (instance-stage loss; the decoder stays at its initialisation)",
        covered=covered,
        not_covered="nothing else is released",
        noise_dict=noise.to_dict(),
        noise_sentence=noise.describe(),
        scope="encoder (fixed decoder)",
        accountant_name=run["accountant"],
    )


def one_run_audit(
    adata: ad.AnnData,
    *,
    epsilon: float | None,
    delta: float,
    canaries: str,
    n_canaries: int,
    guess_fraction: float,
    confidence: float,
    layer: str | None,
    random_state: int,
    noise_seed: int | None,
    **run_kwargs: Any,
) -> pd.DataFrame:
    """Run :func:`dpsc.audit.gradient_canary_run` on the cells; write the report and a ledger entry."""
    if canaries not in CANARIES:
        raise ValueError(
            f"Unknown canaries {canaries!r}; choose 'gradient' (white box, DP-SGD engine) or 'input' "
            "(black box: inserted cells scored from the released model)."
        )
    if not 0 < guess_fraction <= 0.5:
        raise ValueError(f"guess_fraction must be in (0, 0.5], got {guess_fraction}.")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}.")
    matrix = get_matrix(adata, layer)
    check_matrix(matrix, "zinb")
    check_privacy_args(epsilon, delta, adata.n_obs)
    if canaries == "input":
        return _input_audit(
            adata,
            epsilon,
            delta,
            n_canaries,
            guess_fraction,
            confidence,
            layer,
            random_state,
            noise_seed,
            run_kwargs,
        )
    dense = matrix.toarray() if sp.issparse(matrix) else np.asarray(matrix)
    run = gradient_canary_run(
        torch.as_tensor(dense, dtype=torch.float32),
        epsilon=epsilon,
        delta=delta,
        n_canaries=n_canaries,
        guess_fraction=guess_fraction,
        confidence=confidence,
        seed=random_state,
        noise_seed=noise_seed,
        **run_kwargs,
    )
    columns = ["epsilon_claimed", "epsilon_lower", "confidence", "n_canaries", "ceiling", "n_guesses"]
    columns += ["n_correct", "noise_multiplier", "sample_rate", "steps"]
    table = pd.DataFrame([{"method": "one_run", "canaries": canaries, **{c: run[c] for c in columns}}])
    report = {
        "table": {c: table[c].tolist() for c in table.columns},
        "statement": (
            "epsilon_lower is a lower bound on the ε of the DP-SGD engine that audited run used, at the "
            f"stated confidence, from {n_canaries} white-box gradient canaries in one run (Steinke, Nasr "
            "& Jagielski 2023). Above epsilon_claimed it proves a bug; at or below it, it proves nothing "
            "about the true ε, and ceiling is the most these canaries could ever show."
        ),
    }
    write_result(adata, "audit", one_run_record(run, adata.n_obs, NoiseSource(noise_seed)), **report)
    return table


def _input_audit(
    adata: ad.AnnData,
    epsilon: float | None,
    delta: float,
    n_canaries: int,
    guess_fraction: float,
    confidence: float,
    layer: str | None,
    random_state: int,
    noise_seed: int | None,
    fit_kwargs: dict[str, Any],
) -> pd.DataFrame:
    """Black-box one-run audit (:func:`dpsc.audit.input_canary_run`); report and ledger entry."""
    run = input_canary_run(
        adata,
        epsilon=epsilon,
        delta=delta,
        n_canaries=n_canaries,
        guess_fraction=guess_fraction,
        confidence=confidence,
        seed=random_state,
        noise_seed=noise_seed,
        layer=layer,
        **fit_kwargs,
    )
    common = {"method": "one_run", "canaries": "input", "scope": run["scope"], "guarantee": run["guarantee"]}
    claimed = {"epsilon_claimed": run["epsilon_claimed"]}
    table = pd.DataFrame([{**common, **claimed, **row} for row in run["rows"]])
    report = {
        "table": {c: table[c].tolist() for c in table.columns},
        "statement": (
            f"epsilon_lower is a lower bound on the ε of the whole DP-DCAN fit (scope={run['scope']!r}) "
            f"with respect to one cell, from {n_canaries} inserted canary cells scored from the released "
            "model after one run (Steinke, Nasr & Jagielski 2023); the two scores' bounds hold together "
            f"at confidence {confidence:g}. Above epsilon_claimed it proves a leak; at or below it, it "
            "proves nothing about the true ε, and ceiling is the most these canaries could ever show. "
            "The 'reconstruction' score uses the decoder, which scope='encoder' never shares."
        ),
    }
    write_result(adata, "audit", run["record"], **report)
    return table
