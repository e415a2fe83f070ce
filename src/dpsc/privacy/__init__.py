"""Privacy: secure noise, the one release shape, DP-SGD, accounting, the plan, records, ledger.

Every proven release is a :class:`GaussianSum` (per-cell contributions with a stated bound, a sum
over cells or over sites, lattice-encoded discrete Gaussian noise), planned and calibrated once by
a :class:`ReleasePlan`; DEC cluster frequencies (:func:`dp_cluster_frequency`) are the one mechanism kept
here. DP-SGD steps go through :class:`DPSGDEngine`. Every call that reads cells books its record in
the cells' ledger through :func:`spending`. The analyses built on these releases (gene selection,
PCA, k-means, the clustering, markers, public references) live in :mod:`dpsc.methods`.
"""

from ._lazy import lazy_exports

#: What users call (docs/api.md, "Privacy"): budgets, ledgers and records, the noise source, the
#: release shapes, the plan, the DP-SGD engine.
_USER = {
    "attach_ledger": "._ledger",
    "BudgetExceededError": "._ledger",
    "calibrate_noise_multiplier": "._accounting",
    "concat": "._ledger",
    "distributed_slack": "._release",
    "dp_cluster_frequency": "._frequency",
    "DPSGDEngine": "._engine",
    "DPSGDSettings": "._engine",
    "FileLedger": "._ledger",
    "GaussianSum": "._release",
    "get_record": "._ledger",
    "LaplaceSum": "._release",
    "ledger_frame": "._ledger",
    "NoiseSource": "._noise",
    "PlannedRelease": "._plan",
    "PoissonSampling": "._engine",
    "PlanSettings": "._plan",
    "PrivacyRecord": "._record",
    "ReleasePlan": "._plan",
    "SecureRandom": "._random",
    "set_budget": "._ledger",
    "Spent": "._ledger",
    "spent": "._ledger",
    "split_budget": "._accounting",
}

#: What a private tool of dpsc is built from (docs/api.md, "Building a private tool"): the accountant
#: and its ε, the record and ledger writers, the standard sentences of a record, the unit of privacy
#: (a cell or a donor, and each cell's donor weight), the Poisson step counts, derived keys, and the
#: process group of a data-parallel fit.
_BUILDING_BLOCKS = {
    "lazy_exports": "._lazy",
    "broadcast_from_rank_zero": "._distributed",
    "check_within_budget": "._ledger",
    "COMMON_NOT_COVERED": "._record",
    "compose": "._ledger",
    "derive_key": "._random",
    "donor_codes": "._unit",
    "donor_weights": "._unit",
    "DonorRows": "._unit",
    "epsilon_curve": "._accounting",
    "estimator_record": "._record",
    "gaussian_release_record": "._plan",
    "history_epsilon": "._accounting",
    "is_distributed": "._distributed",
    "join_process_group": "._distributed",
    "laplace_release": "._release",
    "ledger_entry": "._ledger",
    "make_accountant": "._accounting",
    "MemoryLedger": "._ledger",
    "n_donors": "._unit",
    "nominal_sigma": "._accounting",
    "no_guarantee_record": "._record",
    "not_covered_for": "._record",
    "note_donor_column": "._unit",
    "plain_entry": "._ledger",
    "PrivacyUnit": "._unit",
    "unit_and_weights": "._unit",
    "with_unit": "._unit",
    "poisson_steps": "._engine",
    "REPLACE_ONE": "._record",
    "shared_noise_source": "._distributed",
    "Spending": "._ledger",
    "sum_over_ranks": "._distributed",
    "with_storage_note": "._record",
    "world": "._distributed",
    "write_record": "._ledger",
}

#: Where each exported name lives; submodules load on first use, so that a federated site's
#: per-message process imports only what it uses (not Opacus or torch). Nothing else is exported:
#: the other names of the submodules are dpsc's own.
_WHERE = {**_USER, **_BUILDING_BLOCKS}
__all__ = sorted(_WHERE, key=str.lower)


__getattr__, __dir__ = lazy_exports(__name__, _WHERE, globals())
