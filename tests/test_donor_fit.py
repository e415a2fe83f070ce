"""``tl.fit(donor_key=...)``: DP-DCAN per donor with all of their cells.

Each step of DP-SGD and each sampled release draws donors (rate q) and one random cell of each donor
drawn, so a donor adds at most one clipped gradient; the start's and the choice's sums weight each
cell by 1/m_d. The record's ε is recomputed from its history with Google's dp-accounting.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from dp_accounting import dp_event, rdp

import dpsc
from dpsc.methods.selection import partition_tables
from dpsc.privacy import DonorRows, NoiseSource, PoissonSampling, donor_weights
from test_donor_unit import with_donors

FAST = {"instance_epochs": 1, "cluster_epochs": 1}


def test_a_donor_level_draw_holds_at_most_one_cell_per_donor_and_each_donor_at_rate_q():
    codes = np.repeat(np.arange(40), np.arange(1, 41))  # donors of 1 … 40 cells
    rows = DonorRows.of(np.random.default_rng(0).permutation(codes))
    sampling = PoissonSampling(0.3, NoiseSource(1), rows)
    batches = list(sampling.batches(rows.n_rows, 400))
    drawn = np.zeros(40)
    for batch in batches:
        donors = rows.order.argsort()[batch]  # position of each row in the grouped order
        owner = np.searchsorted(rows.starts, donors, side="right") - 1
        assert len(set(owner)) == len(batch)  # one cell per donor drawn, never two
        drawn[owner] += 1
    assert np.allclose(drawn / 400, 0.3, atol=0.09)  # every donor, large or small, at q
    with pytest.raises(ValueError, match="donors of those"):
        sampling.release_rows()(rows.n_rows - 1)


def test_the_choice_moves_by_at_most_two_per_donor(small_adata):
    cells = with_donors(small_adata)
    weights = donor_weights(cells, "donor", "test")
    rng = np.random.default_rng(0)
    points = rng.normal(size=(cells.n_obs, 5)) * 3
    labels = (rng.integers(0, 4, cells.n_obs), rng.integers(0, 4, cells.n_obs))
    full = partition_tables(points, labels, 4, weights)
    for donor in ("single", "extreme", "d0"):
        keep = (cells.obs["donor"] != donor).to_numpy()
        without = partition_tables(points[keep], tuple(lab[keep] for lab in labels), 4, weights[keep])
        assert np.linalg.norm(full - without) <= 2 + 1e-9


def google_epsilon(history, delta):
    accountant = rdp.RdpAccountant()
    for sigma, q, steps in history:
        event = dp_event.GaussianDpEvent(sigma)
        if q < 1:
            event = dp_event.PoissonSampledDpEvent(q, event)
        accountant.compose(dp_event.SelfComposedDpEvent(event, int(steps)))
    return accountant.get_epsilon(delta)


def test_fit_per_donor_is_proven_recorded_and_recomputable(small_adata):
    cells = with_donors(small_adata)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dpsc.tl.fit(cells, 4, epsilon=8, donor_key="donor", noise_seed=2, progress_bar=False, **FAST)
    record = dpsc.privacy.get_record(cells, "X_dpdcan")
    assert record["guarantee"] == "proven" and record["individual"] == "donor"
    assert "one donor (obs['donor']) with all of their cells" in record["statement"]
    assert "one of its cells chosen at random" in record["statement"]
    assert record["epsilon"] <= 8 + 1e-6
    assert google_epsilon(record["history"], record["delta"]) == pytest.approx(record["epsilon"], rel=0.03)
    assert dpsc.privacy.spent(cells).unit == "donor"
    assert cells.uns["dpsc"]["X_dpdcan"]["params"]["donor_key"] == "donor"
    assert cells.obsm["X_dpdcan"].shape[0] == cells.n_obs


@pytest.fixture
def drawn(monkeypatch) -> list[list[int]]:
    """Every Poisson draw made while the test runs (the one sampler watched)."""
    from dpsc.privacy import _engine

    seen: list[list[int]] = []
    draw = _engine.poisson_rows

    def watched(rng, n, sample_rate, donors=None):
        rows = draw(rng, n, sample_rate, donors)
        seen.append(rows)
        return rows

    monkeypatch.setattr(_engine, "poisson_rows", watched)
    return seen


def test_every_sampled_batch_of_a_donor_level_fit_holds_one_cell_per_donor(small_adata, drawn):
    cells = with_donors(small_adata)
    codes = cells.obs["donor"].astype("category").cat.codes.to_numpy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dpsc.tl.fit(cells, 4, epsilon=8, donor_key="donor", noise_seed=2, progress_bar=False, **FAST)
    assert len(drawn) > 5 and any(drawn)
    for rows in drawn:
        assert len(set(codes[rows])) == len(rows)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"input_pcs": None}, "needs the default model"),
        ({"likelihood": "gaussian"}, "needs the default model"),
        ({"epsilon": None}, "epsilon=None trains without noise"),
        ({"devices": 2, "strategy": "ddp"}, "draws donors in one process"),
    ],
)
def test_a_donor_level_fit_the_model_cannot_make_is_refused_before_booking(small_adata, kwargs, words):
    cells = with_donors(small_adata)
    before = cells.copy()
    with pytest.raises(ValueError, match=words):
        dpsc.tl.fit(cells, 4, donor_key="donor", progress_bar=False, **kwargs)
    assert "dpsc" not in cells.uns
    assert (cells.X != before.X).nnz == 0


def test_kmeans_per_donor_moves_each_table_by_at_most_its_sensitivity_and_records_the_unit(small_adata):
    from dpsc.methods.kmeans import Assignment, kmeans_table, table_sensitivity

    cells = with_donors(small_adata)
    weights = donor_weights(cells, "donor", "test")
    rng = np.random.default_rng(1)
    points = rng.normal(size=(cells.n_obs, 6)) * 4
    points[cells.obs["donor"].to_numpy() == "extreme"] = 1e6
    nearest = Assignment("nearest", rng.normal(size=(5, 6)))
    full = kmeans_table(points, nearest, 1.0, 2.0, weights=weights)
    for donor in ("single", "extreme", "d0"):
        keep = (cells.obs["donor"] != donor).to_numpy()
        without = kmeans_table(points[keep], nearest, 1.0, 2.0, weights=weights[keep])
        assert np.linalg.norm(full - without) <= table_sensitivity(1.0, 2.0) + 1e-9
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dpsc.pp.pca(cells, n_comps=8, donor_key="donor", noise_seed=1)
        dpsc.tl.kmeans(cells, 4, donor_key="donor", noise_seed=1)
    record = dpsc.privacy.get_record(cells, "dp_cluster")
    assert record["individual"] == "donor" and "one donor (obs['donor'])" in record["statement"]
    assert dpsc.privacy.spent(cells).unit == "donor"
    with pytest.raises(ValueError, match="ledger is per donor"):
        dpsc.tl.kmeans(cells, 4, key_added="per_cell", noise_seed=1)


def test_canary_donors_come_from_distinct_real_donors_and_the_audit_is_per_donor(small_adata):
    from dpsc.audit import CANARY_DONOR_CELLS, make_canary_donors
    from dpsc.privacy import donor_codes

    cells = with_donors(small_adata)
    codes = donor_codes(cells, "donor", "test")
    canaries, owner = make_canary_donors(cells.X, codes, 10, np.random.default_rng(0))
    assert canaries.shape[0] == len(owner) and set(owner) == set(range(10))
    assert np.bincount(owner).max() <= CANARY_DONOR_CELLS
    with pytest.raises(ValueError, match="need as many real donors"):
        make_canary_donors(cells.X, codes, codes.max() + 2, np.random.default_rng(0))
    with pytest.raises(ValueError, match="canaries='input'"):
        dpsc.tl.audit(cells, donor_key="donor")
    assert "dpsc" not in cells.uns
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        table = dpsc.tl.audit(
            cells,
            method="one_run",
            canaries="input",
            n_canaries=10,
            guess_fraction=0.2,
            donor_key="donor",
            n_clusters=3,
            noise_seed=0,
            **FAST,
        )
    claimed = table["epsilon_claimed"].iloc[0]
    assert 0 < claimed <= 8 + 1e-6 and (table["epsilon_lower"] <= claimed).all()
    record = dpsc.privacy.get_record(cells, "audit")
    assert record["individual"] == "donor" and "a donor and its canary donor" in record["statement"]
    assert "canary donors" in cells.uns["dpsc"]["audit"]["statement"]
    assert dpsc.privacy.spent(cells).unit == "donor"


def test_annotate_per_donor_draws_donors_releases_their_number_and_records_the_unit(pbmc_full, drawn):
    rng = np.random.default_rng(0)
    cells = pbmc_full[np.sort(rng.choice(pbmc_full.n_obs, 500, replace=False)), :300].copy()
    ref, query = cells[:350].copy(), cells[350:].copy()
    ref.obs["donor"] = rng.integers(0, 40, ref.n_obs).astype(str)
    codes = ref.obs["donor"].astype("category").cat.codes.to_numpy()
    with pytest.raises(ValueError, match="method='dpsgd' with an epsilon"):
        dpsc.tl.annotate(query, ref, "cell_type", method="pcdbn", donor_key="donor")
    assert "dpsc" not in ref.uns
    options = {"epochs": 3, "noise_seed": 1, "accountant": "rdp"}  # the accountant dp-accounting checks
    dpsc.tl.annotate(query, ref, "cell_type", epsilon=4.0, donor_key="donor", **options)
    assert drawn and all(len(set(codes[rows])) == len(rows) for rows in drawn)
    record = dpsc.privacy.get_record(ref, "dp_label")
    assert record["individual"] == "donor" and "one reference donor (obs['donor'])" in record["statement"]
    assert [1.0, 1] == [record["history"][0][1], record["history"][0][2]]  # the released number of donors
    assert record["epsilon"] <= 4.0 + 1e-6
    assert google_epsilon(record["history"], record["delta"]) == pytest.approx(record["epsilon"], rel=0.05)
    assert dpsc.privacy.spent(ref).unit == "donor"
