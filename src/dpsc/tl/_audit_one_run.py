"""``dpsc.tl.audit(method="one_run")``: a one-run canary audit of the DP-SGD engine on these cells."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import anndata as ad
import pandas as pd

from .._validation import check_privacy_args, get_matrix
from ..audit import CANARY_DONOR_CELLS, audit_schedule, gradient_canary_run, input_canary_run
from ..privacy import (
    NoiseSource,
    PlannedRelease,
    PrivacyRecord,
    PrivacyUnit,
    ReleasePlan,
    gaussian_release_record,
    no_guarantee_record,
    with_unit,
    write_record,
)

CANARIES = ("gradient", "input")


def one_run_record(
    sigma: float,
    q: float,
    steps: int,
    delta: float,
    accountant: str,
    placement: str,
    n_obs: int,
    noise: NoiseSource,
) -> PrivacyRecord:
    """Ledger record of the audited run: its canary scores are post-processing of its noisy gradients.

    With ``placement="quiet"`` the canary coordinates are chosen from exact per-gene detection
    counts of the cells, so the report is not a DP release of them: the record says so (no guarantee).
    """
    covered = "the audit report (canary scores, guesses, the ε lower bound)"
    unit = f"adding or removing one of the {n_obs} cells"
    if sigma == 0 or placement == "quiet":
        reason = (
            "" if sigma == 0 else " and the canary placement, chosen from exact per-gene detection counts"
        )
        return no_guarantee_record("audit", unit=unit, covered=covered + reason)
    return gaussian_release_record(
        "audit",
        sigma=float(sigma),
        sample_rate=float(q),
        steps=int(steps),
        target_epsilon=None,
        delta=float(delta),
        unit=unit,
        mechanism="DP-SGD on the encoder (instance-stage loss; the decoder stays at its initialisation)",
        covered=covered,
        not_covered="nothing else is released",
        noise=noise,
        scope="encoder (fixed decoder)",
        accountant_name=accountant,
    )


def group_of_two_budget(epsilon: float, delta: float) -> tuple[float, float]:
    r"""Return the (ε, δ) at group size 2 of an (ε, δ) guarantee.

    :math:`(2\varepsilon, (1 + e^\varepsilon)\delta)`: removing a cell that is also the source of a
    canary removes two rows, two steps of group privacy (Dwork & Roth 2014, §2.3).
    """
    return 2 * float(epsilon), (1 + math.exp(min(float(epsilon), 700.0))) * float(delta)


def group_of_two(record: PrivacyRecord, n_obs: int) -> PrivacyRecord:
    """Return the input-canary fit's record for a cell (or donor) that is also a canary's source (group 2)."""
    if record.epsilon is None:
        return record
    epsilon, delta = group_of_two_budget(record.epsilon, record.delta)
    pair = "a donor and its canary donor" if record.individual == "donor" else "a cell and its canary"
    statement = f"The audited fit's guarantee at group size 2 ({pair}), over {n_obs} cells: "
    return PrivacyRecord(
        individual=record.individual,
        details={k: v for k, v in record.details.items() if k == "donor_key"},
        tool="audit",
        epsilon=epsilon,
        delta=delta,
        guarantee=record.guarantee,
        statement=statement + record.statement,
        covered=record.covered,
        not_covered=record.not_covered,
        accountant=record.accountant,
        noise=record.noise,
    )


def one_run_audit(
    adata: ad.AnnData,
    *,
    fit: Callable,
    epsilon: float | None,
    delta: float,
    canaries: str,
    n_canaries: int,
    guess_fraction: float,
    confidence: float,
    layer: str | None,
    random_state: int,
    noise_seed: int | None,
    key_added: str = "audit",
    **run_kwargs: Any,
) -> pd.DataFrame:
    """Run a one-run canary audit on the cells; book it before any work, write the report (``key_added``)."""
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
    check_privacy_args(epsilon, delta, adata.n_obs)
    request = {  # what both canary runs take
        "epsilon": epsilon,
        "delta": delta,
        "n_canaries": n_canaries,
        "guess_fraction": guess_fraction,
        "confidence": confidence,
        "random_state": random_state,
        "noise_seed": noise_seed,
    }
    if canaries == "input":
        return _input_audit(adata, fit, request, layer, run_kwargs, key_added)
    accountant = run_kwargs.get("accountant", "rdp")
    placement = run_kwargs.get("placement", "padding")
    _, q, steps = audit_schedule(adata.n_obs, run_kwargs.get("epochs", 5), run_kwargs.get("batch_size"))
    plan = ReleasePlan.of(PlannedRelease("dpsgd", sample_rate=q, steps=steps), accountant=accountant)
    sigma = plan.calibrate(epsilon, delta).sigma("dpsgd")
    noise = NoiseSource(noise_seed)
    record = one_run_record(sigma, q, steps, delta, accountant, placement, adata.n_obs, noise)
    with plan.spend(adata, record, key_added, noise) as spent:
        run = gradient_canary_run(matrix, **request, noise_multiplier=sigma, **run_kwargs)
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
        write_record(adata, key_added, record, **report)
        spent.booking.settle(record)
    return table


def _input_audit(
    adata: ad.AnnData,
    fit: Callable,
    request: dict[str, Any],
    layer: str | None,
    fit_kwargs: dict[str, Any],
    key_added: str = "audit",
) -> pd.DataFrame:
    """Black-box one-run audit (:func:`dpsc.audit.input_canary_run`); booked before any work.

    ``request`` holds :func:`one_run_audit`'s ``epsilon``, ``delta``, ``n_canaries``,
    ``guess_fraction``, ``confidence``, ``random_state`` and ``noise_seed``.
    """
    epsilon, delta = request["epsilon"], request["delta"]
    if epsilon is None:
        plan = ReleasePlan.reading("audited fit")
        planned = no_guarantee_record(
            "audit", unit=f"the {adata.n_obs} audited cells", covered="the audited fit"
        )
    else:  # the audited fit at group size 2 (a cell and its canary), reserved before it runs
        plan = ReleasePlan.stated("audited fit", *group_of_two_budget(epsilon, delta))
        planned = with_unit(plan.reservation("audit"), PrivacyUnit(fit_kwargs.get("donor_key")))
    per_donor = fit_kwargs.get("donor_key") is not None
    unit = "donor with all of their cells" if per_donor else "cell"
    canary = (
        f"canary donors (each up to {CANARY_DONOR_CELLS} permuted cells of one real donor)"
        if per_donor
        else "canary cells"
    )
    made = (
        "made from the cells of one real donor, each real donor the source of at most one"
        if per_donor
        else "a real cell with its counts permuted"
    )
    with plan.spend(adata, planned, key_added) as spent:
        booking = spent.booking
        run = input_canary_run(adata, fit=fit, layer=layer, **request, **fit_kwargs)
        common = {
            "method": "one_run",
            "canaries": "input",
            "scope": run["scope"],
            "guarantee": run["guarantee"],
        }
        claimed = {"epsilon_claimed": run["epsilon_claimed"]}
        table = pd.DataFrame([{**common, **claimed, **row} for row in run["rows"]])
        report = {
            "table": {c: table[c].tolist() for c in table.columns},
            "statement": (
                f"epsilon_lower is a lower bound on the ε of the whole DP-DCAN fit (scope={run['scope']!r}) "
                f"with respect to one {unit}, from {request['n_canaries']} inserted {canary} scored "
                "from the released model after one run (Steinke, Nasr & Jagielski 2023); the two scores' "
                f"bounds hold together at confidence {request['confidence']:g}. Above epsilon_claimed it "
                "proves a leak; at or below it, it proves nothing about the true ε, and ceiling is the most "
                "these canaries could ever show. The 'reconstruction' score uses the decoder (fixed at its "
                "initialisation under scope='encoder'; never shared under scope='paper'). Each canary is "
                f"{made}, so the ledger books the fit at group size 2."
            ),
        }
        record = group_of_two(run["record"], adata.n_obs)
        write_record(adata, key_added, record, **report)
        booking.settle(record)
    return table
