"""FedSC's site against a hostile server: schedule, σ, the run's own ε and replay, one attack each.

A fake server drives the site's guard (:class:`dpsc.federated._fedsc_site.FedSCGuard`) as the Flower
handlers do: the run is checked at its first round, every training round and k-means release must be
the next of the run's schedule, and every booking stays within the site's ε for one run. After each
refusal nothing more was booked, and the ledger stays within the site's ε for the run.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from dpsc.federated._fedsc_site import KMEANS_STEPS, FedSCGuard, fedsc_plan, kmeans_schedule
from dpsc.federated._settings import SiteSettings
from dpsc.federated._site import SiteRefusal
from dpsc.federated._ssl import dp_schedule
from dpsc.methods.kmeans import Assignment
from dpsc.privacy import compose, history_epsilon

N_CELLS, BATCH, ROUNDS, D, K = 200, 64, 3, 8, 4


def honest_run(epsilon: float = 8.0) -> dict:
    """The run configuration an honest server sends, with the noise a site of ε calibrates."""
    q, per_epoch = dp_schedule(N_CELLS, BATCH)
    plan = fedsc_plan(epsilon, 1e-5, q, ROUNDS * per_epoch)
    return {
        "rounds": ROUNDS,
        "local-epochs": 1,
        "noise-multipliers": json.dumps([plan.sigma("training")]),
        "kmeans-noise-multipliers": json.dumps([plan.sigma("kmeans")]),
        "noise-seed": -1,
    }


class FakeSite:
    """The site's side as the Flower handlers run it: a guard per message, the run's state kept."""

    def __init__(self, tmp_path, run: dict, budget: float = 100.0) -> None:
        self.settings = SiteSettings(
            data=str(tmp_path / "cells.npy"), ledger=str(tmp_path / "ledger.json"), budget=budget, delta=1e-5
        )
        self.config, self.state = run, {}
        self.q, self.per_epoch = dp_schedule(N_CELLS, BATCH)

    def guard(self) -> FedSCGuard:
        return FedSCGuard(self.settings, N_CELLS, json.loads(json.dumps(self.state)))

    def train(self, server_round: int, local_epochs: int = 1) -> None:
        guard = self.guard()
        guard.start(self.config, 0, self.q, self.per_epoch)
        guard.check_round(server_round, local_epochs)
        steps, total = local_epochs * self.per_epoch, int(guard.run["steps"])
        sigma = float(guard.run["sigma"])
        try:
            guard.book([(sigma, self.q, steps)], f"round {server_round}", steps / (total + KMEANS_STEPS))
        finally:
            self.state = guard.run
        guard.run["served"] = server_round
        self.state = guard.run

    def kmeans(self, index: int, kind: str | None = None, shape: tuple | None = None) -> np.ndarray:
        guard = self.guard()
        schedule = kmeans_schedule(K, D)
        kind = kind or schedule[min(index, len(schedule) - 1)][0]
        shape = shape or schedule[min(index, len(schedule) - 1)][1]
        matrix = np.random.default_rng(index).normal(size=shape)
        points = np.random.default_rng(0).normal(size=(N_CELLS, D)).astype(np.float32)
        try:
            return guard.kmeans_table(points, Assignment(kind, matrix), index, K)
        finally:
            self.state = guard.run

    def entries(self) -> list[dict]:
        from dpsc.privacy import FileLedger

        return FileLedger(self.settings.ledger).entries()

    def refuses(self, call, *args, match: str, **kwargs) -> None:
        before = self.entries()
        with pytest.raises(SiteRefusal, match=match):
            call(*args, **kwargs)
        assert self.entries() == before  # a refusal books nothing
        assert run_epsilon(self.entries()) <= 8.0 * (1 + 1e-6)


def run_epsilon(entries: list[dict]) -> float:
    """ε of a run's booked releases at the run's δ (the site's 1e-5; a partial run is a part of it)."""
    history = [tuple(row) for entry in entries for row in entry["history"]]
    return history_epsilon(history, 1e-5) if history else 0.0


def serve_honestly(site: FakeSite) -> None:
    for server_round in range(1, ROUNDS + 1):
        site.train(server_round)
    for index in range(KMEANS_STEPS):
        site.kmeans(index)


@pytest.mark.parametrize("budget", [None, 100.0])
def test_an_honest_run_is_served_whole_within_the_sites_epsilon(tmp_path, budget):
    """Also with the default budget (one run's ε): a partial run is judged at the whole run's δ."""
    site = FakeSite(tmp_path, honest_run(), budget=budget)
    serve_honestly(site)
    assert [e["key"] for e in site.entries()] == [
        *(f"round {r}" for r in range(1, ROUNDS + 1)),
        *(f"k-means release {i}" for i in range(KMEANS_STEPS)),
    ]
    assert compose(site.entries()).epsilon <= 8.0 * (1 + 1e-6)


def test_a_training_round_is_served_once_in_order_and_never_past_the_run(tmp_path):
    """Attack: replay round 1, skip to round 3, ask for a round past the run's last."""
    site = FakeSite(tmp_path, honest_run())
    site.train(1)
    site.refuses(site.train, 1, match="round 1; this site has served 1")
    site.refuses(site.train, 3, match="round 3; this site has served 1")
    site.train(2)
    site.train(3)
    site.refuses(site.train, 4, match="served 3 of the run's 3 rounds")


def test_a_round_of_more_local_epochs_than_planned_is_refused(tmp_path):
    """Attack: the message asks for 50 local epochs in a run planned with 1 (50 × the steps)."""
    site = FakeSite(tmp_path, honest_run())
    site.refuses(site.train, 1, 50, match="50 local epochs")


def test_noise_below_the_sites_own_calibration_or_a_server_seed_is_refused(tmp_path):
    """Attack: the server's σ for training or for the k-means below the site's own; a noise seed."""
    run = honest_run()
    for key in ("noise-multipliers", "kmeans-noise-multipliers"):
        low = {**run, key: json.dumps([json.loads(run[key])[0] * 0.5])}
        site = FakeSite(tmp_path / key, low)
        site.refuses(site.train, 1, match="below this site's own calibration")
    site = FakeSite(tmp_path / "seed", {**run, "noise-seed": 7})
    site.refuses(site.train, 1, match="noise seed")


def test_a_kmeans_release_is_served_once_in_order_after_training_with_its_planned_shape(tmp_path):
    """Attacks: a table before training ends, a replayed or skipped index, one past the schedule, a
    table of another kind or of more rows than the plan's, values that are not finite."""
    site = FakeSite(tmp_path, honest_run())
    site.train(1)
    site.refuses(site.kmeans, 0, match="before the run's training rounds were all served")
    site.train(2)
    site.train(3)
    site.kmeans(0)
    site.refuses(site.kmeans, 0, match="k-means release 0; the next")
    site.refuses(site.kmeans, 2, match="k-means release 2; the next")
    site.refuses(site.kmeans, 1, kind="sketch", match="Malformed k-means request")
    rows, width = kmeans_schedule(K, D)[1][1]
    site.refuses(site.kmeans, 1, shape=(rows * 100, width), match="Malformed k-means request")
    for index in range(1, KMEANS_STEPS):
        site.kmeans(index)
    site.refuses(site.kmeans, KMEANS_STEPS, match=f"release {KMEANS_STEPS}; the next")


def test_the_run_never_books_past_the_sites_epsilon_even_through_a_hole_in_the_plan_check(
    tmp_path, monkeypatch
):
    """The second line: with the σ check disabled (a hole) and a budget of 100, a run whose noise is
    a tenth of the site's own is refused at its first booking past the site's ε for one run."""
    run = honest_run()
    tenth = {**run, "noise-multipliers": json.dumps([json.loads(run["noise-multipliers"])[0] / 10])}
    monkeypatch.setattr(
        FedSCGuard,
        "check_run",
        lambda self, run, partition, q, steps: (
            json.loads(run["noise-multipliers"])[0],
            json.loads(run["kmeans-noise-multipliers"])[0],
        ),
    )
    site = FakeSite(tmp_path, tenth)
    site.refuses(site.train, 1, match="for one run")
    assert site.entries() == []


def test_both_federated_tasks_share_one_site_guard_and_its_words(tmp_path):
    """FedSC's site and the clustering's are one guard (ledger, budget, caps, refusal words): a
    second honest FedSC run on a ledger whose budget the first spent is refused with the words a
    clustering site uses (what was spent, what is asked, the cap, and how to start a new ledger)."""
    from dpsc.federated import Site
    from dpsc.federated._guard import SiteGuard

    assert issubclass(Site, SiteGuard) and issubclass(FedSCGuard, SiteGuard)
    first = FakeSite(tmp_path, honest_run(), budget=8.0)
    serve_honestly(first)
    second = FakeSite(tmp_path, honest_run(), budget=8.0)
    second.refuses(second.train, 1, match=r"budget refuses the run: its ledger .* epsilon left: 0.*--ledger")


def test_a_deployed_fedsc_site_reads_only_the_cells_its_own_settings_name(tmp_path, small_adata):
    """Deployed, a FedSC site reads its own ``.h5ad`` (its settings file's ``data``), represented as
    ``tl.fit_federated`` does, a value that is not a count read as 0 (never a refusal that depends
    on the cells); a server's run configuration that names a folder of cells is refused."""
    from types import SimpleNamespace

    from dpsc.federated import represent_cells, write_site_settings
    from dpsc.federated._flower import FedSCSite
    from dpsc.federated._run_config import run_settings

    own = tmp_path / "own.h5ad"
    small_adata.X = small_adata.X.toarray().astype(np.float32)
    small_adata.X[0, 0] = np.nan
    small_adata.write_h5ad(own)
    decoy = tmp_path / "server_named"
    decoy.mkdir()
    np.save(decoy / "client_0.npy", np.zeros((3, small_adata.n_vars), dtype=np.float32))
    settings = write_site_settings(SiteSettings(data=str(own), epsilon=8.0), tmp_path / "site.toml")
    context = SimpleNamespace(node_config={"partition-id": 0, "settings": str(settings)}, run_config={})
    cells = FedSCSite(run_settings("fedsc"), None).raw_cells(context)
    np.testing.assert_array_equal(cells, represent_cells(small_adata.X, "zinb"))
    assert np.isfinite(cells).all() and cells[0, 0] == 0
    with pytest.raises(ValueError, match="no setting data-dir"):
        run_settings("fedsc", {"data-dir": str(decoy)})


def test_a_deployed_fedsc_site_writes_its_results_to_its_own_output(tmp_path, small_adata):
    """The finish writes the site's embedding and labels to the output its settings name."""
    import anndata as ad

    from dpsc.federated._flower import write_site_output
    from dpsc.federated._run_config import run_settings

    own = tmp_path / "own.h5ad"
    small_adata.write_h5ad(own)
    settings = SiteSettings(data=str(own), epsilon=8.0)
    points = np.random.default_rng(0).normal(size=(small_adata.n_obs, 4))
    labels = np.arange(small_adata.n_obs) % 3
    path = write_site_output(settings, run_settings("fedsc"), points, labels)
    assert path == tmp_path / "own.dpsc.h5ad" and not (tmp_path / "labels_0.npy").exists()
    written = ad.read_h5ad(path)
    np.testing.assert_allclose(written.obsm["X_fedsc"], points, rtol=1e-6)
    assert written.obs["dp_cluster"].astype(int).tolist() == labels.tolist()
    assert written.uns["dpsc"]["X_fedsc"]["ledger"] == settings.ledger


def test_a_deployed_site_takes_one_noise_multiplier_for_every_site_and_no_donor_unit(tmp_path):
    """A deployed site has no partition id: one σ for every site is served, a per-partition list or
    an unreadable one is refused; a site whose settings protect donors refuses FedSC (per cell)."""
    from dpsc.federated._fedsc_site import site_sigma

    run = honest_run()
    site = FakeSite(tmp_path / "deployed", run)
    guard = site.guard()
    guard.start(run, None, site.q, site.per_epoch)
    assert guard.run["sigma"] == pytest.approx(json.loads(run["noise-multipliers"])[0])
    assert site_sigma("[2.0, 3.0]", 1) == 3.0
    for values, match in (("[2.0, 3.0]", "one value for every site"), ("[2.0,", "Malformed noise")):
        with pytest.raises(SiteRefusal, match=match):
            site_sigma(values, None)
    listed = {**run, "noise-multipliers": json.dumps([9.0, 9.0])}
    deployed = FakeSite(tmp_path / "listed", listed)
    with pytest.raises(SiteRefusal, match="one value for every site"):
        deployed.guard().start(listed, None, deployed.q, deployed.per_epoch)
    assert deployed.entries() == []
    donors = FakeSite(tmp_path / "donors", run)
    donors.settings.donor_key = "donor"
    donors.refuses(donors.train, 1, match="FedSC protects each cell.*donor_key='donor'")
