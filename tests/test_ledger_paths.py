"""Every path inside the budget, and a ledger that composes honestly (the second privacy review).

One test per defect the review measured on the ledger: the paths that skipped the budget
(``DPDCAN.train``, both audits, ``tl.annotate`` with a fixed σ), ε added across neighbouring
relations, a ledger that copies and ``anndata.concat`` lost, the weakest guarantee hidden by a bare
``(ε, δ)``, and an audit whose canary placement read the cells but claimed a proof.
"""

import math
import multiprocessing
from dataclasses import replace

import anndata as ad
import numpy as np
import pytest
from scipy import sparse

import dpsc
from dpsc.privacy import (
    REPLACE_ONE,
    BudgetExceededError,
    FileLedger,
    NoiseSource,
    ReleasePlan,
    attach_ledger,
    concat,
    get_record,
    ledger_entry,
    ledger_frame,
    set_budget,
    spent,
    write_record,
)

ADD_REMOVE = "add/remove"  # the default neighbouring relation, as records state it


def planned_pure_record(tool: str, epsilon: float, relation: str = ADD_REMOVE):
    """What a pure-ε call books before it runs (its stated plan's reservation)."""
    return ReleasePlan.stated(tool, epsilon).reservation(tool, relation)


def write_result(adata: ad.AnnData, key: str, record) -> None:
    """Book a result's record in the ledger (check, reserve, settle), then write it under ``key``."""
    with ReleasePlan.reading(key).spend(adata, record, key) as spent:
        spent.booking.settle(record)
    write_record(adata, key, record)


def assert_refused_and_untouched(adata: ad.AnnData, call) -> None:
    """``call`` is refused by the budget before any work: no result, no ledger entry."""
    obs, obsm, uns = list(adata.obs), list(adata.obsm), set(adata.uns.get("dpsc", {}))
    with pytest.raises(BudgetExceededError, match="Nothing was changed"):
        call()
    assert list(adata.obs) == obs and list(adata.obsm) == obsm
    assert set(adata.uns.get("dpsc", {})) == uns
    assert ledger_frame(adata).empty and spent(adata) == (0.0, 0.0)


# -- every path that reads the cells is checked against the budget before any work -----------------
def test_model_train_is_refused_past_the_budget(small_adata):
    adata = small_adata.copy()
    dpsc.model.DPDCAN.setup_anndata(adata)
    model = dpsc.model.DPDCAN(adata, n_clusters=3)
    set_budget(adata, 1.0)  # the review: train(epsilon=50) under a budget of 1 spent nothing, booked nothing
    assert_refused_and_untouched(
        adata, lambda: model.train(epsilon=50.0, instance_epochs=1, cluster_epochs=1, progress_bar=False)
    )
    assert not model.is_trained_


@pytest.mark.parametrize(
    "options",
    [
        {"method": "one_run", "epsilon": 8.0},  # spent 7.99 under a budget of 2
        {"method": "one_run", "epsilon": None},  # made the total infinite
        {"method": "one_run", "canaries": "input", "epsilon": 8.0, "n_clusters": 3},
        {"method": "shadow", "epsilon": 8.0, "n_clusters": 3},  # its trained models read every cell
    ],
    ids=["one-run gradient", "one-run non-private", "one-run input", "shadow"],
)
def test_audits_are_refused_past_the_budget(small_adata, options):
    adata = small_adata.copy()
    set_budget(adata, 2.0)
    assert_refused_and_untouched(adata, lambda: dpsc.tl.audit(adata, **options))


def test_annotate_with_a_fixed_noise_multiplier_is_refused_past_the_budget(small_adata):
    ref, query = small_adata[:200].copy(), small_adata[200:].copy()
    set_budget(ref, 1.0)  # the review: σ given, epsilon=None, under a budget of 1 spent 81
    assert_refused_and_untouched(
        ref,
        lambda: dpsc.tl.annotate(query, ref, "cell_type", epsilon=None, noise_multiplier=0.5, epochs=2),
    )
    assert "dp_label" not in query.obs


# -- composition across neighbouring relations --------------------------------------------------
def test_mixed_relations_convert_add_remove_to_replace_one(gaussian_record):
    """``pp.pca`` (add/remove, 1.99) then a regression (replace-one, 2.0): not 3.99 under either."""
    adata = ad.AnnData(np.zeros((5, 2)))
    gaussian = gaussian_record(1.0, 0.1, 100)
    write_result(adata, "pca", gaussian)
    alone = spent(adata)
    assert alone.relation == ADD_REMOVE
    write_result(adata, "regression", planned_pure_record("regression", 2.0, REPLACE_ONE))
    total = spent(adata)
    # an add/remove (ε, δ) is (2ε, (1 + e^ε) δ) under replace-one (group privacy over two steps)
    assert total.relation == REPLACE_ONE
    assert total.epsilon == pytest.approx(2 * alone.epsilon + 2.0)
    assert total.delta == pytest.approx((1 + math.exp(alone.epsilon)) * alone.delta)
    assert ledger_frame(adata)["relation"].tolist() == [ADD_REMOVE, REPLACE_ONE]
    # a budget is checked in the converted units
    capped = ad.AnnData(np.zeros((5, 2)))
    write_result(capped, "pca", gaussian)
    set_budget(capped, alone.epsilon + 2.5)  # enough for the plain sum, not for the conversion
    with pytest.raises(BudgetExceededError, match="replace-one"):
        write_result(capped, "regression", planned_pure_record("regression", 2.0, REPLACE_ONE))


def test_spent_names_the_weakest_guarantee_and_seeded_noise(gaussian_record):
    adata = ad.AnnData(np.zeros((5, 2)))
    write_result(adata, "a", gaussian_record(1.0, 0.1, 10))
    assert (spent(adata).guarantee, spent(adata).seeded) == ("proven", False)
    write_result(adata, "b", replace(planned_pure_record("b", 0.5), guarantee="heuristic"))
    assert spent(adata).guarantee == "heuristic"  # a bare (ε, δ) would hide it
    seeded = planned_pure_record("fit", 0.1)
    seeded.noise = NoiseSource(7).to_dict()  # a run repeated from a known seed
    write_result(adata, "c", seeded)
    assert spent(adata).seeded and ledger_frame(adata)["seeded"].tolist() == [False, False, True]


# -- a ledger that copies and concatenation keep --------------------------------------------------
def test_concat_composes_overlapping_parts_and_keeps_the_worst_of_disjoint_ones(tmp_path):
    a, b = ad.AnnData(np.zeros((3, 2))), ad.AnnData(np.ones((4, 2)))
    a.obs_names, b.obs_names = ["a0", "a1", "a2"], ["b0", "b1", "b2", "b3"]
    write_result(a, "x", planned_pure_record("fit", 1.0))
    write_result(b, "y", planned_pure_record("fit", 2.0))
    set_budget(a, 3.0)
    set_budget(b, 5.0)
    assert "dpsc" not in ad.concat([a, b]).uns  # anndata's own concat drops the ledger
    same_cells = concat([a, b], disjoint=False)
    assert spent(same_cells).epsilon == pytest.approx(3.0) and len(ledger_frame(same_cells)) == 2
    other_people = concat([a, b], disjoint=True)  # parallel composition: each cell its own part's
    assert spent(other_people).epsilon == pytest.approx(2.0)
    assert same_cells.uns["dpsc"]["budget"]["epsilon"] == 3.0  # the smallest budget holds
    with pytest.raises(BudgetExceededError):
        write_result(same_cells, "z", planned_pure_record("fit", 0.5))
    attach_ledger(a, tmp_path / "a.json")
    with pytest.raises(ValueError, match="ledger files"):
        concat([a, b], disjoint=True)


def test_a_ledger_file_holds_the_budget_for_every_copy(tmp_path):
    """The review: three copies each spent 4.5 under a budget of 5."""
    adata = ad.AnnData(np.zeros((5, 2)))
    attach_ledger(adata, tmp_path / "cells.ledger.json")
    set_budget(adata, 5.0)
    first, second, third = adata.copy(), adata.copy(), adata.copy()
    write_result(first, "fit", planned_pure_record("fit", 4.5))
    with pytest.raises(BudgetExceededError, match=r"ε left: 0\.5"):
        write_result(second, "fit", planned_pure_record("fit", 4.5))
    assert spent(third).epsilon == pytest.approx(4.5)  # a copy made before the spend sees it
    adata.write_h5ad(tmp_path / "cells.h5ad")
    back = ad.read_h5ad(tmp_path / "cells.h5ad")  # the file outlives the object
    assert spent(back).epsilon == pytest.approx(4.5)


def _book_entries(path: str, tag: int, n: int) -> None:
    ledger = FileLedger(path)
    for i in range(n):
        ledger.reserve(ledger_entry(planned_pure_record("fit", 0.01), f"p{tag}-{i}"))


def test_two_processes_booking_in_one_ledger_file_lose_nothing(tmp_path):
    path = str(tmp_path / "shared.ledger.json")
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_book_entries, args=(path, tag, 25)) for tag in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0
    keys = [entry["key"] for entry in FileLedger(path).entries()]
    assert len(keys) == 50 and len(set(keys)) == 50  # every read-modify-write was atomic


# -- an audit whose canaries were placed by reading the cells claims no proof -------------------------
@pytest.mark.parametrize("placement", ["padding", "random", "quiet"])
def test_only_canary_placements_that_read_no_cell_are_proven(placement):
    from dpsc.tl._audit_one_run import one_run_record

    record = one_run_record(1.0, 0.1, 100, 1e-5, "rdp", placement, 300, NoiseSource())
    assert record.guarantee == ("none" if placement == "quiet" else "proven")
    if placement == "quiet":
        assert record.epsilon is None or not math.isfinite(record.epsilon)


# -- under DP, refuse-versus-run does not depend on what the cells contain --------------------------
def test_proven_paths_run_on_an_empty_cell_an_all_zero_gene_and_a_non_integer_count(small_adata):
    """The review: each of these made a proven path refuse, so the refusal itself leaked (ε = ∞)."""
    counts = small_adata.X.toarray()
    counts[0] = 0  # an empty cell
    counts[:, 5] = 0  # a gene no cell expresses
    counts[3, 3] = 0.5  # a value that is not a count
    adata = ad.AnnData(sparse.csr_matrix(counts), obs=small_adata.obs.copy())
    dpsc.pp.highly_variable_genes(adata, 50, epsilon=1.0)
    dpsc.pp.pca(adata, n_comps=5, epsilon=1.0)
    dpsc.tl.cluster(adata, 3, epsilon=2.0, key_added="cluster")
    assert adata.var["highly_variable"].sum() == 50 and np.isfinite(adata.obsm["X_pca"]).all()
    assert adata.obs["cluster"].notna().all()
    assert ledger_frame(adata)["guarantee"].tolist() == ["proven"] * 3
    for key in ("highly_variable", "X_pca", "cluster"):  # n is released exactly: every record says so
        assert "number of cells, which is treated as public" in get_record(adata, key)["statement"]
