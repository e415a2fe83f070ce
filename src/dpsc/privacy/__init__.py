"""Privacy: secure noise, the one release shape, DP-SGD, accounting, the plan, records, ledger.

Every proven release is a :class:`GaussianSum` (per-cell contributions with a stated bound, a sum
over cells or over sites, lattice-encoded discrete Gaussian noise), planned and calibrated once by
a :class:`ReleasePlan`; DEC cluster frequencies (:mod:`._frequency`) are the one mechanism kept
here. DP-SGD steps go through :class:`DPSGDEngine`. Every call that reads cells books its record in
the cells' ledger through :func:`spending`. The analyses built on these releases (gene selection,
PCA, k-means, the clustering, markers, public references) live in :mod:`dpsc.methods`.
"""

from importlib import import_module
from typing import Any

#: Where each public name lives; submodules load on first use, so that a federated site's
#: per-message process imports only what it uses (not Opacus or torch).
_WHERE = {
    "ACCOUNTANTS": "._accounting",
    "ADD_REMOVE": "._record",
    "BudgetExceededError": "._ledger",
    "COMMON_NOT_COVERED": "._record",
    "DPSGDEngine": "._engine",
    "DPSGDSettings": "._engine",
    "FileLedger": "._ledger",
    "MemoryLedger": "._ledger",
    "GaussianSum": "._release",
    "LaplaceSum": "._release",
    "N_PUBLIC": "._record",
    "NoiseSource": "._noise",
    "PlannedRelease": "._plan",
    "PrivacyRecord": "._record",
    "ReleasePlan": "._plan",
    "REPLACE_ONE": "._record",
    "SecureRandom": "._random",
    "Spending": "._ledger",
    "Spent": "._ledger",
    "attach_ledger": "._ledger",
    "book": "._ledger",
    "broadcast_from_rank_zero": "._distributed",
    "build_statement": "._record",
    "calibrate_noise_multiplier": "._accounting",
    "check_budget": "._ledger",
    "check_within_budget": "._ledger",
    "compose": "._ledger",
    "derive_key": "._random",
    "ledger_entry": "._ledger",
    "plain_entry": "._ledger",
    "concat": "._ledger",
    "distributed_slack": "._release",
    "dp_cluster_frequency": "._frequency",
    "epsilon_curve": "._accounting",
    "estimator_record": "._record",
    "frequency_release": "._frequency",
    "gaussian_release_record": "._plan",
    "get_record": "._ledger",
    "history_epsilon": "._accounting",
    "is_distributed": "._distributed",
    "laplace_release": "._release",
    "ledger_frame": "._ledger",
    "with_storage_note": "._record",
    "make_accountant": "._accounting",
    "no_guarantee_record": "._record",
    "planned_pure_record": "._record",
    "poisson_steps": "._engine",
    "secure_key": "._random",
    "set_budget": "._ledger",
    "spending": "._ledger",
    "spent": "._ledger",
    "spent_epsilon": "._accounting",
    "split_budget": "._accounting",
    "sum_over_ranks": "._distributed",
    "world": "._distributed",
    "write_record": "._ledger",
    "write_result": "._ledger",
}

#: What users call (each documented in docs/api.md). The other names of ``_WHERE`` serve dpsc's
#: own packages and tests: importable, but not part of the API and free to change.
__all__ = [
    "BudgetExceededError",
    "DPSGDEngine",
    "DPSGDSettings",
    "FileLedger",
    "GaussianSum",
    "LaplaceSum",
    "NoiseSource",
    "PlannedRelease",
    "PrivacyRecord",
    "ReleasePlan",
    "SecureRandom",
    "Spent",
    "attach_ledger",
    "calibrate_noise_multiplier",
    "concat",
    "distributed_slack",
    "dp_cluster_frequency",
    "get_record",
    "ledger_frame",
    "set_budget",
    "spent",
    "split_budget",
]


def __getattr__(name: str) -> Any:
    """Import the submodule that defines ``name`` on first access (PEP 562)."""
    if name in _WHERE:
        value = getattr(import_module(_WHERE[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dpsc.privacy' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
