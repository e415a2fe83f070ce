"""One calibration per release and one Poisson DP-SGD loop, checked by counting calls."""

import inspect

import anndata
import numpy as np
import pytest
import torch

import dpsc
from dpsc.privacy import DPSGDEngine, _accounting


@pytest.fixture
def calibrations(monkeypatch):
    """Count every call of Opacus's σ search (the one calibration function, wrapped by dpsc).

    dpsc remembers a search's answer per public settings; the count starts from an empty memory.
    """
    calls = []
    _accounting._searched_sigma.cache_clear()
    original = _accounting.get_noise_multiplier

    def counted(**kwargs):
        calls.append(kwargs)
        return original(**kwargs)

    monkeypatch.setattr(_accounting, "get_noise_multiplier", counted)
    return calls


@pytest.mark.parametrize(("scope", "releases"), [("encoder", 5), ("full", 5), ("paper", 1)])
def test_a_fit_calibrates_each_release_once(small_adata, tiny_fit, calibrations, scope, releases):
    """Proven fits start from the clustering: one σ per release kind (cell sum, PCA, k-means of the
    200-gene clustering, DP-SGD, partition choice), then one common scale. The paper's scope: one."""
    dpsc.tl.fit(small_adata, epsilon=8, scope=scope, noise_seed=0, **tiny_fit)
    assert len(calibrations) == releases
    record = dpsc.privacy.get_record(small_adata, "X_dpdcan")
    assert record["epsilon"] <= 8.0 + 1e-9


def test_the_one_call_clustering_calibrates_each_release_once(small_adata, calibrations):
    dpsc.tl.cluster(small_adata, 3, epsilon=8, noise_seed=0, random_state=0)
    record = dpsc.privacy.get_record(small_adata, "dp_cluster")
    # 200 genes: no gene selection; one σ each for the cell sum, the PCA and the k-means releases
    assert len(calibrations) == len(record["mechanisms"]) == 3
    assert "gene statistics" not in record["statement"]


@pytest.fixture
def loop_callers(monkeypatch):
    """The function that called ``DPSGDEngine.take_step``, once per step."""
    callers = []
    original = DPSGDEngine.take_step

    def recorded(self, *args, **kwargs):
        callers.append(inspect.stack()[1].function)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(DPSGDEngine, "take_step", recorded)
    return callers


def test_classifier_audit_and_federated_site_train_through_the_one_poisson_loop(small_adata, loop_callers):
    from dpsc.audit import gradient_canary_run
    from dpsc.federated._ssl import ClientDP, SSLConfig, SSLNet, local_train_private
    from dpsc.fm import DPSGDClassifier

    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(60, 3)).astype(np.float32), rng.integers(0, 2, 60)
    DPSGDClassifier(epsilon=2.0, epochs=1, batch_size=20, noise_seed=1).fit(X, y)
    classifier = len(loop_callers)
    counts = torch.as_tensor(small_adata.X.toarray(), dtype=torch.float32)
    gradient_canary_run(counts, epsilon=1.0, n_canaries=50, epochs=1, n_hidden=(8,), n_latent=4, noise_seed=1)
    audit = len(loop_callers) - classifier
    cells = np.log1p(rng.poisson(2.0, size=(100, 12)).astype(np.float32))
    local_train_private(SSLNet(12, SSLConfig()), cells, 1, seed=0, dp=ClientDP(2.0), noise_seed=1)
    site = len(loop_callers) - classifier - audit
    assert classifier > 0 and audit > 0 and site > 0
    assert set(loop_callers) == {"poisson_steps"}


def test_calibration_and_accountant_steps_live_only_in_dpsc_privacy():
    """The redesign's rule: every σ comes from a ReleasePlan and every accountant step from dpsc.privacy;
    outside it no code reads an accountant object (a run's history and ε come from its DP-SGD settings)."""
    import re
    from pathlib import Path

    root = Path(dpsc.__file__).parent
    calls = re.compile(
        r"(split_budget|calibrate_noise_multiplier|get_noise_multiplier|spent_epsilon)\("
        r"|accountant\.(step|history)\b|\._accountant\b"
    )
    outside = [
        f"{path.relative_to(root)}:{number}"
        for path in sorted(root.rglob("*.py"))
        if path.relative_to(root).parts[0] != "privacy"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if calls.search(line) and not line.lstrip().startswith(("#", "``", ":"))
    ]
    assert outside == []


def test_every_booking_outside_privacy_goes_through_release_plan_spend():
    """A scan for direct ``spending(`` calls outside dpsc.privacy: none. Every call books through
    its plan, Gaussian, stated (pure ε, a classifier's own accountant, a fit at group size 2) or a
    reading without noise."""
    import re
    from pathlib import Path

    root = Path(dpsc.__file__).parent
    direct = re.compile(r"\bspending\(")
    callers = {
        str(path.relative_to(root))
        for path in sorted(root.rglob("*.py"))
        if path.relative_to(root).parts[0] != "privacy"
        for line in path.read_text().splitlines()
        if direct.search(line) and not line.lstrip().startswith(("#", "``", ":"))
    }
    assert callers == set()
    spenders = {
        "tl/_cluster.py",
        "tl/_cluster_federated.py",
        "tl/_fit.py",
        "tl/_kmeans.py",
        "model/_dpdcan.py",
        "pp/_dp_pca.py",
        "pp/_dp_hvg.py",
        "tl/_rank_genes_groups.py",
        "tl/_annotate.py",
        "tl/_audit.py",
        "tl/_audit_one_run.py",
        "tl/_federated.py",
        "tl/_regression.py",
    }
    for name in spenders:
        assert ".spend(" in (root / name).read_text(), name


def test_stated_and_reading_plans_compose_and_refuse_what_they_cannot_do():
    from dpsc.privacy import PlannedRelease, ReleasePlan

    pure = ReleasePlan.stated("coefficients", 2.0)
    assert pure.spent() == 2.0 and pure.history() == [] and pure.delta == 0.0
    with pytest.raises(ValueError, match="only Gaussian plans are calibrated"):
        pure.calibrate(4.0, 1e-5)
    with pytest.raises(ValueError, match="epsilon > 0"):
        ReleasePlan.stated("coefficients", 0.0)
    assert ReleasePlan.reading("report").spent() is None
    booked = pure.reservation("regression", "replace-one")
    assert (booked.epsilon, booked.delta, booked.pure_epsilon, booked.relation) == (
        2.0,
        0.0,
        2.0,
        "replace-one",
    )
    grouped = ReleasePlan.stated("audited fit", 4.0, 3e-5).reservation("audit")
    assert (grouped.epsilon, grouped.delta, grouped.pure_epsilon) == (4.0, 3e-5, 0.0)
    with pytest.raises(ValueError, match="Only a stated plan"):
        ReleasePlan.reading("report").reservation("audit")
    gaussian = ReleasePlan.of(PlannedRelease("sum")).calibrate(3.0, 1e-5)
    mixed = ReleasePlan.of(gaussian["sum"], *pure.releases, delta=1e-5)
    assert mixed.spent() == pytest.approx(gaussian.spent() + 2.0)  # basic composition
    with pytest.raises(ValueError, match="draws its own"):
        with pure.spend(anndata.AnnData(np.ones((3, 2))), _pure_record(), "key") as spent:
            spent.stream("coefficients")


def _pure_record():
    from dpsc.privacy import ReleasePlan

    return ReleasePlan.stated("test", 2.0).reservation("test")


def test_the_clustering_and_kmeans_book_through_their_release_plan(small_adata, monkeypatch):
    from dpsc.privacy import ReleasePlan

    spent = []
    original = ReleasePlan.spend

    def counted(self, target, record, key, noise):
        spent.append((key, tuple(r.name for r in self.releases)))
        return original(self, target, record, key, noise)

    monkeypatch.setattr(ReleasePlan, "spend", counted)
    dpsc.tl.cluster(small_adata, 3, epsilon=8, noise_seed=0)
    small_adata.obsm["X_points"] = np.random.default_rng(0).normal(size=(small_adata.n_obs, 4))
    dpsc.tl.kmeans(small_adata, 3, use_rep="X_points", epsilon=8, noise_seed=0, key_added="km")
    assert spent == [("dp_cluster", ("sum", "pca", "kmeans")), ("km", ("tl.kmeans",))]


def test_a_release_plan_calibrates_once_and_composes_to_the_asked_epsilon(calibrations):
    from dpsc.privacy import PlannedRelease, ReleasePlan

    plan = ReleasePlan.of(
        PlannedRelease("sum", share=0.2),
        PlannedRelease("steps", share=0.8, sample_rate=0.01, steps=500),
    ).calibrate(4.0, 1e-5)
    assert len(calibrations) == 2  # one σ search per release, then one common scale
    assert plan.spent() == pytest.approx(4.0, rel=0.01) and plan.spent() <= 4.0 + 1e-9
    assert list(plan.sigmas) == ["sum", "steps"] and plan.history()[1][1:] == (0.01, 500)
    alone = ReleasePlan.of(PlannedRelease("one")).calibrate(2.0, 1e-5)
    assert alone.spent() == pytest.approx(2.0, abs=0.02)
    assert ReleasePlan.of(PlannedRelease("one")).calibrate(None, 1e-5).sigmas == {"one": 0.0}
    stated = ReleasePlan.of(PlannedRelease("one")).with_sigmas(1e-5, one=3.0)
    assert stated.sigma("one") == 3.0 and len(calibrations) == 3  # a stated σ searches nothing
    with pytest.raises(ValueError, match="distinct names"):
        ReleasePlan.of(PlannedRelease("a"), PlannedRelease("a"))
    with pytest.raises(ValueError, match="not calibrated"):
        ReleasePlan.of(PlannedRelease("a")).history()


def test_a_release_left_out_gives_its_share_to_the_others_and_is_never_searched(calibrations):
    from dpsc.privacy import PlannedRelease, ReleasePlan

    planned = ReleasePlan.of(
        PlannedRelease("genes", share=0.1),
        PlannedRelease("sum", share=0.3),
        PlannedRelease("steps", share=0.6, sample_rate=0.01, steps=500),
    )
    nominal = planned.nominal_sigma("sum", 4.0, 1e-5)
    rest = planned.calibrate(4.0, 1e-5, keep=("sum", "steps"))
    assert len(calibrations) == 2  # sum (remembered from the nominal σ) and steps; genes never
    assert list(rest.sigmas) == ["sum", "steps"] and rest.sigma("sum") < nominal
    assert rest.spent() <= 4.0 + 1e-9 and rest.spent() == pytest.approx(4.0, rel=0.01)
    whole = planned.calibrate(4.0, 1e-5)
    assert len(calibrations) == 3 and whole.sigma("sum") <= nominal
    ratio = [rest.sigma(n) / whole.sigma(n) for n in ("sum", "steps")]
    assert ratio[0] < 1 and ratio[0] == pytest.approx(ratio[1], rel=2e-3)  # less noise, proportions kept
    with pytest.raises(KeyError, match="keep names releases"):
        planned.calibrate(4.0, 1e-5, keep=("markers",))
    assert planned.calibrate(None, 1e-5, keep=("steps",)).sigmas == {"steps": 0.0}


def test_a_fit_whose_gene_rule_keeps_every_gene_searches_each_sigma_once(calibrations):
    """More genes than the rule's floor, so the plan first holds a gene release; enough cells that
    the rule keeps every gene, so it is dropped by a common scale, not a second split."""
    from dpsc.model._dcan_privacy import TrainSettings, start_parts

    settings = TrainSettings(epsilon=8.0)
    plan, fit_plan = start_parts(settings, 1e-5, n_obs=20_000, n_vars=300, n_clusters=8, training=(0.02, 200))
    training_sigma, choice_sigma = fit_plan.sigma("training"), fit_plan.sigma("selection")
    assert plan.n_genes == 300 and plan.sigmas["genes"] == 0.0
    assert len(calibrations) == 5  # cell sum, PCA, k-means, training, choice: once each, genes never
    assert training_sigma > 0 and choice_sigma > 0


@pytest.mark.parametrize(("n_obs", "selects"), [(200_000, False), (2_000, True)])
def test_the_clustering_at_2000_genes_searches_each_sigma_once(calibrations, n_obs, selects):
    """2,000 genes: one σ search per release that runs. When the PCA's nominal σ keeps every gene,
    the gene release leaves the plan unsearched (cell sum, PCA, k-means); when it selects, four. A
    site told the plan's gene count rebuilds the same σ."""
    from dpsc.methods.cluster_plan import plan_clustering

    plan = plan_clustering(8.0, 1e-5, n_vars=2000, n_clusters=8, n_obs=n_obs)
    assert len(calibrations) == len(plan.releases.releases) == (4 if selects else 3)
    assert (plan.n_genes < 2000) is selects
    assert ("genes" in plan.releases) is selects
    assert plan.releases.spent() <= 8.0 + 1e-6
    site = plan_clustering(8.0, 1e-5, n_vars=2000, n_clusters=8, n_genes=plan.n_genes)
    assert site.releases.sigmas == pytest.approx(plan.releases.sigmas, rel=1e-12)


def test_tl_cluster_at_2000_genes_calibrates_once_per_planned_release(calibrations):
    adata = dpsc.datasets.simulate(1500, random_state=0)
    assert adata.n_vars == 2000
    dpsc.tl.cluster(adata, 4, epsilon=8, noise_seed=0)
    kinds = dpsc.privacy.get_record(adata, "dp_cluster")["mechanisms"]
    assert len(calibrations) == len(kinds) == 4  # 1,500 cells select genes: genes, sum, PCA, k-means


def test_a_clustering_with_markers_searches_once_per_release_that_runs(calibrations):
    """Cell sum, PCA, k-means and the marker releases; releases of equal share and steps share a σ."""
    from dpsc.methods.cluster_plan import plan_clustering

    plan = plan_clustering(8.0, 1e-5, n_vars=2000, n_clusters=8, n_obs=200_000, markers=True)
    assert "genes" not in plan.releases and len(plan.kinds) == 8
    distinct = {(r.share, r.sample_rate, r.steps) for r in plan.releases.releases}
    assert len(calibrations) == len(distinct)


def test_a_gated_plan_searches_each_shared_release_once(calibrations):
    """A gated plan's branches share the count and the markers: searched once; each k-means once."""
    from dpsc.methods.cluster_design import BRANCHES
    from dpsc.methods.cluster_plan import plan_clustering
    from dpsc.methods.public_basis import PublicBasis

    rng = np.random.default_rng(0)
    genes, loadings = np.arange(50), rng.normal(size=(50, 8))
    start = rng.normal(size=(4, 8))
    basis = PublicBasis(
        genes, np.zeros(50), np.ones(50), loadings, genes, start=start, start_radii=np.ones(4)
    )
    plan = plan_clustering(8.0, 1e-5, n_vars=50, n_clusters=4, public_basis=basis, markers=True)
    assert plan.gated and plan.kinds[0] == "type_count"
    settings = {(r.share, r.steps) for b in plan.branches for r in b.releases}
    assert len(calibrations) == len(settings)  # each shared release once, each branch's k-means once
    for name in BRANCHES:
        branch = plan.branch(name)
        assert branch.releases.spent() <= 8.0 + 1e-6
        assert {k: v for k, v in branch.sigmas.items() if k != "kmeans"} == {
            k: v for k, v in plan.sigmas.items() if k != "kmeans"
        }


def test_spending_a_plan_books_first_and_refuses_releases_it_does_not_hold(small_adata):
    from dpsc.pp._dp_pca import pca_record
    from dpsc.privacy import NoiseSource, PlannedRelease, ReleasePlan

    plan = ReleasePlan.of(PlannedRelease("pp.pca")).calibrate(1.0, 1e-5)
    noise = NoiseSource(0)
    record = pca_record(plan.sigma("pp.pca"), 1.0, 1e-5, small_adata.n_obs, noise)
    with plan.spend(small_adata, record, "probe", noise) as releases:
        assert dpsc.privacy.ledger_frame(small_adata)["key"].tolist() == ["probe"]  # booked before
        releases.stream("pp.pca")
        with pytest.raises(KeyError, match="not in the plan"):
            releases.stream("pp.pca_again")
        releases.booking.settle(record)


def test_a_plan_writes_its_own_record():
    """The record's ε is the plan's composed history at δ; a release without noise means no guarantee."""
    from dpsc.privacy import NoiseSource, PlannedRelease, ReleasePlan

    plan = ReleasePlan.of(PlannedRelease("a", share=0.3), PlannedRelease("b", share=0.7, steps=3))
    plan = plan.calibrate(2.0, 1e-5)
    words = {"unit": "one cell", "mechanism": "two Gaussian sums", "covered": "the sums"}
    record = plan.record("probe", noise=NoiseSource(0), **words)
    assert record.guarantee == "proven" and record.epsilon == pytest.approx(plan.spent())
    assert record.history == plan.history() and record.steps == 4 and record.target_epsilon == 2.0
    assert record.mechanisms == [f"{name}: sigma={sigma:.4g}" for name, sigma in plan.sigmas.items()]
    exact = plan.calibrate(None, 1e-5).record("probe", **words)
    assert exact.guarantee == "none" and exact.spent == float("inf")


def test_a_plans_record_composes_its_history_once(monkeypatch):
    """The record's ε is composed once, from the one history it states: the plan's, or what ran."""
    from dpsc.privacy import PlannedRelease, ReleasePlan

    plan = ReleasePlan.of(PlannedRelease("a", share=0.3), PlannedRelease("b", share=0.7, steps=3))
    plan = plan.calibrate(2.0, 1e-5)
    composed = []
    original = _accounting.history_epsilon

    def counted(history, *args, **kwargs):
        composed.append(list(history))
        return original(history, *args, **kwargs)

    monkeypatch.setattr(_accounting, "history_epsilon", counted)
    words = {"unit": "one cell", "mechanism": "two Gaussian sums", "covered": "the sums"}
    planned = plan.record("probe", **words)
    assert composed == [plan.history()]
    ran = plan.history()[:1]
    stopped = plan.record("probe", history=ran, **words)
    assert composed == [plan.history(), ran] and stopped.epsilon < planned.epsilon


def test_the_clustering_and_the_fit_are_plans_of_the_one_plan_type(small_adata):
    """`tl.cluster`'s record is its plan's; a fit's planned history is its ReleasePlan's, in order."""
    from dpsc.model._dcan_privacy import TrainSettings, plan_fit
    from dpsc.tl._cluster import plan_for_cells

    adata = small_adata.copy()
    dpsc.tl.cluster(adata, 4, epsilon=4.0, noise_seed=0)
    record = adata.uns["dpsc"]["dp_cluster"]["privacy"]
    plan = plan_for_cells(adata, 4, 4.0, record["delta"], 0)
    assert record["epsilon"] == pytest.approx(plan.releases.spent()) == pytest.approx(plan.spent())
    assert [tuple(h) for h in record["history"]] == [tuple(h) for h in plan.releases.history()]
    assert [r.name for r in plan.releases.releases] == ["sum", "pca", "kmeans"]  # 200 genes: no selection

    fit = plan_fit(
        TrainSettings(epsilon=8.0), 20_000, n_clusters=8, input_pcs=None, latent_scale=1.0, start_n_vars=300
    )
    names = [r.name for r in fit.releases.releases]
    assert names[-2:] == ["training", "selection"] and names[: len(fit.start.kinds)] == list(fit.start.kinds)
    assert fit.planned_history() == fit.releases.history()
    assert fit.planned_record(20_000).epsilon == pytest.approx(fit.releases.spent())
    assert fit.releases.spent() <= 8.0 + 1e-6


def test_every_sigma_of_a_clustering_or_a_fit_lives_in_its_release_plan():
    """A clustering plan holds its σ only as its ReleasePlan (releases that match its settings, sent
    and received unchanged); a fit's plan holds the clustering it starts from as its first part."""
    import dataclasses

    from dpsc.methods.cluster_plan import ClusterPlan, plan_clustering
    from dpsc.model._dcan_privacy import TrainSettings, plan_fit

    plan = plan_clustering(8.0, 1e-5, n_vars=300, n_clusters=5, n_genes=100)
    assert [r.name for r in plan.releases.releases] == ["genes", "sum", "pca", "kmeans"]
    assert plan.sigmas == {**dict.fromkeys(plan.sigmas, 0.0), **plan.releases.sigmas}
    assert ClusterPlan.from_config(plan.to_config()) == plan
    with pytest.raises(ValueError, match="makes the releases"):  # every gene read: no gene release
        dataclasses.replace(plan, n_genes=300)

    fit = plan_fit(
        TrainSettings(epsilon=8.0), 20_000, n_clusters=8, input_pcs=None, latent_scale=1.0, start_n_vars=5000
    )
    start = fit.start.history()  # the same releases with the same σ, first
    assert fit.releases.history()[: len(start)] == start and fit.start.select_genes
    assert [r.name for r in fit.releases.releases][: len(start)] == list(fit.start.kinds)
    assert fit.settings.noise_multiplier == fit.sigma("training") > 0 and fit.sigma("loadings") is None
    exact = plan_fit(TrainSettings(epsilon=None), 2_000, n_clusters=8, input_pcs=16, latent_scale=1.0)
    assert exact.settings is None and exact.sigma("loadings") == 0.0 and exact.releases.spent() is None


def test_a_federated_fits_record_is_its_worst_sites_plan():
    """FedSC's record is written by the plan of the site that spent most (parallel composition)."""
    from dpsc.federated._fedsc_site import FedSCPrivacy, federated_record, federation_plan, fedsc_plan

    plans = {"0": fedsc_plan(8.0, 1e-5, 0.01, 300), "1": fedsc_plan(6.0, 1e-5, 0.02, 200)}
    options = FedSCPrivacy(8.0, 1e-5, "sgd", "rdp", 1.0, 1000, dpsc.privacy.NoiseSource(3), False)
    record = federated_record(plans, options)
    spent = {name: plan.spent() for name, plan in plans.items()}
    assert spent["0"] == pytest.approx(8.0, rel=1e-2) and spent["1"] == pytest.approx(6.0, rel=1e-2)
    assert federation_plan(plans) is plans["0"] and record.epsilon == pytest.approx(spent["0"])
    assert [tuple(h) for h in record.history] == plans["0"].history()
    assert record.details["epsilon_per_site"] == pytest.approx(spent)
    assert record.details["steps_per_site"] == {"0": 300, "1": 200}
    assert federation_plan(None).spent() is None  # no DP: a reading


@pytest.mark.parametrize("markers", [False, True])
def test_a_clusterings_schedule_is_its_planned_releases_step_by_step(markers):
    """What a site serves is what the plan accounts for: each scheduled step is one draw of a planned
    release (its σ read from there), and each release is served exactly its planned number of steps."""
    import dataclasses
    from collections import Counter

    from dpsc.methods.cluster_plan import plan_clustering

    plan = plan_clustering(8.0, 1e-5, n_vars=3000, n_clusters=6, n_obs=3000, markers=markers)
    schedule = plan.schedule()
    assert Counter(step.kind for step in schedule) == {r.name: r.steps for r in plan.releases.releases}
    assert all(
        step.planned is plan.releases[step.kind] and step.sigma == plan.sigmas[step.kind] for step in schedule
    )
    assert [step.index for step in schedule] == list(range(len(schedule)))
    fewer = dataclasses.replace(plan.releases["kmeans"], steps=plan.releases["kmeans"].steps - 1)
    short = dataclasses.replace(
        plan.releases, releases=tuple(fewer if r.name == "kmeans" else r for r in plan.releases.releases)
    )
    with pytest.raises(ValueError, match="does not expand the plan"):
        object.__setattr__(plan, "releases", short)  # a plan whose k-means accounts one step less
        plan.schedule()


def test_a_plan_at_fixed_sigma_books_what_its_steps_compose_to_at_most_its_cap():
    from dpsc.privacy import PlannedRelease, ReleasePlan

    release = PlannedRelease("classifier", sample_rate=0.1, steps=100, sigma=1.0)
    plan = ReleasePlan.of(release, accountant="prv", delta=1e-5)
    booked = plan.reservation("annotate")
    assert booked.epsilon == pytest.approx(plan.spent()) and booked.epsilon > 0
    assert (booked.delta, booked.history, booked.pure_epsilon) == (1e-5, [(1.0, 0.1, 100)], 0.0)
    assert plan.reservation("annotate", cap=booked.epsilon / 2).epsilon == pytest.approx(booked.epsilon / 2)
    mixed = ReleasePlan.of(release, *ReleasePlan.stated("coefficients", 2.0).releases, delta=1e-5)
    with pytest.raises(ValueError, match="Only a stated plan"):
        mixed.reservation("annotate")
