"""A federated site against a hostile server: it serves the plan's schedule and nothing else.

A fake server drives real sites (``Site.contribute``, and the Flower message handler where Flower
is installed) with every attack of the hostile-server review and with random out-of-schedule
sequences. After each: nothing was sent or booked for a refused request, the ledger composes to at
most the site's budget, each release was served at most once and in order, and the site's decision
(serve or refuse) is the same on two neighbouring data sets (one cell added): a refusal may depend
on the server's message, never on the cells.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import tempfile
import time
from pathlib import Path

import anndata as ad
import numpy as np
import pytest
import scipy.sparse as sp

from dpsc.federated._site import Site, SiteRefusal, SiteSettings, run_fallback_epsilon
from dpsc.federated._trust import BudgetSettingError
from dpsc.methods import markers as markers_mechanism
from dpsc.methods.cluster_design import KINDS
from dpsc.methods.cluster_plan import ClusterPlan, plan_clustering
from dpsc.methods.cluster_requests import Request, ScheduleError
from dpsc.methods.clustering import central_release_sum, contribution, run_clustering
from dpsc.methods.kmeans import Assignment
from dpsc.privacy import NoiseSource, compose

N_VARS = 40
HONEST = ("plain", 1, 3)  # mode, threshold, number of sites


@pytest.fixture(scope="module")
def neighbours(tmp_path_factory):
    """D (60 cells) and D' (D plus one cell that expresses only gene 0), as two sites' files."""
    rng = np.random.default_rng(1)
    counts = rng.poisson(rng.gamma(1.0, 2.0, size=(1, N_VARS)), size=(60, N_VARS)).astype(np.float32)
    counts[:, 0] = 0  # no cell of D expresses gene 0
    extra = np.zeros((1, N_VARS), dtype=np.float32)
    extra[0, 0] = 50.0
    folder = tmp_path_factory.mktemp("neighbours")
    paths = []
    for name, X in (("D", counts), ("D_prime", np.vstack([counts, extra]))):
        path = folder / f"{name}.h5ad"
        ad.AnnData(sp.csr_matrix(X)).write_h5ad(path)
        paths.append(path)
    return paths


def plan_for(epsilon: float = 8.0, n_genes: int | None = None, markers: bool = False):
    return plan_clustering(
        epsilon, 1e-5, n_vars=N_VARS, n_clusters=3, n_obs=60, n_genes=n_genes, markers=markers
    )


def changed(plan: ClusterPlan, **config) -> ClusterPlan:
    """The plan as a server would send it with these fields of its config changed."""
    return ClusterPlan.from_config({**plan.to_config(), **config})


def honest_requests(plan, data: Path) -> list[Request]:
    """The requests an honest server makes (recorded from a central run on ``data``)."""
    matrix = ad.read_h5ad(data).X
    central = central_release_sum(matrix, NoiseSource(3))
    seen: list[Request] = []

    def record(request: Request) -> np.ndarray:
        seen.append(request)
        return central(request)

    run_clustering(plan, record)
    return seen


def make_site(data: Path, folder: Path, name: str, **settings) -> Site:
    ledger = folder / f"{name}.ledger.json"
    ledger.unlink(missing_ok=True)
    return Site(SiteSettings(data=str(data), ledger=str(ledger), **{"epsilon": 8.0, **settings}))


def serve(site: Site, steps, state: dict) -> list[bool]:
    """Drive ``site`` with ``steps`` = [(plan, request, mode, threshold, n_sites)]; return its decisions."""
    decisions = []
    for plan, request, mode, threshold, n_sites in steps:
        before = site.ledger.entries()
        try:
            vector = site.contribute(plan, request, mode, threshold, n_sites, state)
        except SiteRefusal:
            assert site.ledger.entries() == before  # nothing booked, nothing returned
            decisions.append(False)
            continue
        assert vector.dtype == np.int64 and np.isfinite(vector.astype(float)).all()
        scheduled = plan.schedule()[request.index]
        assert (request.kind, request.sigma) == (scheduled.kind, scheduled.sigma) and scheduled.sigma > 0
        assert len(site.ledger.entries()) == len(before) + 1  # booked before it was returned
        decisions.append(True)
    return decisions


def check_both(paths, folder: Path, steps, *later_runs, **settings) -> list[bool]:
    """Serve ``steps`` (then each of ``later_runs``, a new run each) on D and on D'.

    The decisions must agree and each ledger stay within its budget; returns the decisions.
    """
    decisions = []
    for data, name in zip(paths, ("D", "D_prime"), strict=True):
        site = make_site(data, folder, name, **settings)
        decisions.append([ok for run in (steps, *later_runs) for ok in serve(site, run, {})])
        spent = compose(site.ledger.entries()).epsilon
        assert spent <= site.budget * (1 + 1e-9), (spent, site.budget)
    assert decisions[0] == decisions[1], "a decision depended on the cells"
    return decisions[0]


def honest_steps(plan, requests, trust=HONEST):
    return [(plan, r, *trust) for r in requests]


# -- the attacks of the review, one by one ----------------------------------------------------------
def test_an_honest_run_is_served_whole_once(neighbours, tmp_path):
    plan = plan_for()
    steps = honest_steps(plan, honest_requests(plan, neighbours[0]))
    assert check_both(neighbours, tmp_path, steps) == [True] * plan.n_releases
    assert check_both(neighbours, tmp_path, steps + steps[:1]) == [True] * plan.n_releases + [False]
    again = check_both(neighbours, tmp_path, steps, steps)  # a second run: past one run's ε
    assert again == [True] * plan.n_releases + [False] * plan.n_releases
    assert check_both(neighbours, tmp_path, steps, steps, budget=40.0) == [True] * 2 * plan.n_releases


def test_the_marker_release_is_scheduled_and_checked(neighbours, tmp_path):
    plan = plan_for(markers=True)
    requests = honest_requests(plan, neighbours[0])
    kinds = ["marker_center", "marker_norms", "markers", "marker_focus_norms", "marker_focus"]
    assert [r.kind for r in requests][-5:] == kinds and len(requests) == plan.n_releases
    assert check_both(neighbours, tmp_path, honest_steps(plan, requests)) == [True] * plan.n_releases
    table = len(requests) - 3  # the first marker table's index

    def refused_at(position: int, hostile: Request) -> None:
        """The site serves every release before ``position`` and refuses the hostile one there."""
        steps = honest_steps(plan, [*requests[:position], hostile])
        assert check_both(neighbours, tmp_path, steps) == [True] * position + [False]

    centroids = requests[table].assignment.matrix.copy()
    centroids[1, 2] = np.nan
    refused_at(table, dataclasses.replace(requests[table], assignment=Assignment("nearest", centroids)))
    frame = requests[table].frame
    assert 0 < frame.sum_bound and 0 < frame.square_bound
    hostile_frames = [  # the centre and the bounds are public inputs too
        *(dataclasses.replace(frame, sum_bound=b) for b in (np.inf, np.nan, 0.0, -1.0, 1e6, None)),
        dataclasses.replace(frame, square_bound=None),
        dataclasses.replace(frame, center=np.full_like(frame.center, -1.0)),
        dataclasses.replace(frame, center=frame.center[:-1]),
        None,
    ]
    for hostile_frame in hostile_frames:
        refused_at(table, dataclasses.replace(requests[table], frame=hostile_frame))
    far = dataclasses.replace(frame, center=frame.center * 0 + 99)
    refused_at(table - 1, dataclasses.replace(requests[table - 1], frame=far))
    # the focused releases: distinct genes of the matrix, with a centre (and bounds) over exactly them
    focus_norms, focus = requests[-2], requests[-1]
    columns = focus.columns
    for hostile_columns in (np.r_[columns, columns[:1]], np.r_[columns[:-1], N_VARS]):  # repeated; absent
        zeros = markers_mechanism.MarkerFrame(np.zeros(len(hostile_columns)))
        refused_at(len(requests) - 2, dataclasses.replace(focus_norms, columns=hostile_columns, frame=zeros))
    refused_at(len(requests) - 2, dataclasses.replace(focus_norms, columns=None))
    short = dataclasses.replace(focus.frame, center=focus.frame.center[:-1])
    refused_at(len(requests) - 1, dataclasses.replace(focus, frame=short))
    # ... and at most FOCUS_GENES of them per cluster (a plan of more genes than that)
    wide = plan_clustering(8.0, 1e-5, n_vars=400, n_clusters=3, n_obs=60, n_genes=40, markers=True)
    release = next(r for r in wide.schedule() if r.kind == "marker_focus_norms")
    most = 3 * markers_mechanism.FOCUS_GENES
    for count, allowed in ((most, True), (most + 1, False)):
        frame = markers_mechanism.MarkerFrame(np.zeros(count))
        request = Request(
            "marker_focus_norms", release.index, release.sigma, frame=frame, columns=np.arange(count)
        )
        if allowed:
            release.check(request, 400, wide.n_genes)
        else:
            with pytest.raises(ScheduleError, match=f"allows 1 to {most}"):
                release.check(request, 400, wide.n_genes)
    without = plan_for()  # a plan without markers: no marker release is served
    extra = dataclasses.replace(requests[-1], index=without.n_releases)
    steps = honest_steps(without, [*honest_requests(without, neighbours[0]), extra])
    assert check_both(neighbours, tmp_path, steps, budget=50.0)[-1] is False


def test_exact_gene_statistics_are_refused_when_the_plan_reads_every_gene(neighbours, tmp_path):
    plan = plan_for(n_genes=N_VARS)  # no gene selection: sigmas["genes"] is 0
    assert not plan.select_genes and plan.sigmas["genes"] == 0
    genes = Request("genes", 0, 0.0)
    assert check_both(neighbours, tmp_path, [(plan, genes, *HONEST)], budget=1.0) == [False]
    selecting = plan_for(n_genes=20)  # a plan that does select genes: its σ, never 0
    zero = Request("genes", 0, 0.0)
    assert check_both(neighbours, tmp_path, [(selecting, zero, *HONEST)]) == [False]
    unnoised = changed(selecting, **{"sigma-genes": 0.0})
    assert check_both(neighbours, tmp_path, [(unnoised, zero, *HONEST)]) == [False]


def test_a_release_is_served_once_whatever_the_server_repeats(neighbours, tmp_path):
    plan = plan_for()
    requests = honest_requests(plan, neighbours[0])
    steps = honest_steps(plan, requests[:3]) + honest_steps(plan, [requests[2]] * 40)
    decisions = check_both(neighbours, tmp_path, steps, budget=50.0)
    assert decisions == [True] * 3 + [False] * 40


def test_kind_index_and_schedule_end_are_checked(neighbours, tmp_path):
    plan = plan_for()
    requests = honest_requests(plan, neighbours[0])
    wrong_kind = dataclasses.replace(requests[1], kind="kmeans")  # index 1 is not a k-means table
    past = dataclasses.replace(requests[-1], index=plan.n_releases)
    steps = honest_steps(plan, [requests[0], wrong_kind, requests[1], requests[3]])
    assert check_both(neighbours, tmp_path, steps, budget=50.0) == [True, False, True, False]  # skip
    steps = honest_steps(plan, [*requests, past, requests[-1]])
    assert check_both(neighbours, tmp_path, steps, budget=50.0) == [True] * plan.n_releases + [False, False]


def test_trust_settings_cannot_change_mid_run(neighbours, tmp_path):
    plan = plan_for()
    requests = honest_requests(plan, neighbours[0])
    steps = [(plan, requests[0], *HONEST), (plan, requests[1], "secure", 50, 60)]
    assert check_both(neighbours, tmp_path, steps, honest_sites=2, budget=50.0) == [True, False]
    steps = [(plan, requests[0], "secure", 3, 3)]  # threshold above the 2 honest sites it trusts
    assert check_both(neighbours, tmp_path, steps, honest_sites=2) == [False]


def test_changed_delta_or_genes_mid_run_is_refused(neighbours, tmp_path):
    plan = plan_for()
    requests = honest_requests(plan, neighbours[0])
    for other in (changed(plan, delta=1e-6), changed(plan, **{"n-genes": N_VARS - 1})):
        steps = [(plan, requests[0], *HONEST), (other, requests[1], *HONEST)]
        assert check_both(neighbours, tmp_path, steps, budget=50.0) == [True, False]


@pytest.mark.parametrize("bad", [np.nan, np.inf, 1e200])
def test_hostile_loadings_and_centroids_are_refused_before_any_cell_is_read(neighbours, tmp_path, bad):
    plan = plan_for()
    requests = honest_requests(plan, neighbours[0])
    pca_at = next(i for i, r in enumerate(requests) if r.kind == "pca")
    loadings = requests[pca_at].loadings.copy()
    loadings[0, 0] = bad  # gene 0: only the extra cell of D' expresses it
    hostile = dataclasses.replace(requests[pca_at], loadings=loadings)
    steps = honest_steps(plan, [*requests[:pca_at], hostile])
    assert check_both(neighbours, tmp_path, steps) == [True] * pca_at + [False]
    lloyd_at = next(i for i, r in enumerate(requests) if r.assignment and r.assignment.kind == "nearest")
    centroids = requests[lloyd_at].assignment.matrix.copy()
    centroids[0, 0] = bad
    hostile = dataclasses.replace(requests[lloyd_at], assignment=Assignment("nearest", centroids))
    steps = honest_steps(plan, [*requests[:lloyd_at], hostile])
    assert check_both(neighbours, tmp_path, steps) == [True] * lloyd_at + [False]
    skewed = requests[lloyd_at - 1].loadings * np.r_[1.0, np.ones(plan.n_comps - 1) * 1.5]  # not orthonormal
    hostile = dataclasses.replace(requests[lloyd_at - 1], loadings=skewed)
    steps = honest_steps(plan, [*requests[: lloyd_at - 1], hostile])
    assert check_both(neighbours, tmp_path, steps) == [True] * (lloyd_at - 1) + [False]


def test_a_cell_whose_contribution_is_not_finite_contributes_zero(neighbours):
    """The per-cell map behind the checks: overflowing loadings give D and D' the same (finite) sum."""
    plan = plan_for()
    genes = np.arange(N_VARS)
    loadings = np.zeros((N_VARS, 1))
    loadings[0, 0] = 1e200
    sums = []
    for path in neighbours:
        request = Request("pca", 1, plan.sigmas["pca"], genes=genes, loadings=loadings)
        sums.append(contribution(request, ad.read_h5ad(path).X))
    assert np.isfinite(sums[1]).all()
    np.testing.assert_array_equal(sums[0], sums[1])  # the extra cell's residual overflowed: zero
    table = Request(
        "kmeans",
        3,
        1.0,
        genes=genes,
        loadings=np.eye(N_VARS)[:, :4] * 1e200,
        assignment=Assignment("nearest", np.eye(4)),
    )
    assert np.isfinite(contribution(table, ad.read_h5ad(neighbours[1]).X)).all()


# -- budget and trust defaults ----------------------------------------------------------------------
def test_the_default_budget_is_one_run_and_a_stored_budget_is_never_raised_silently(neighbours, tmp_path):
    plan = plan_for()
    requests = honest_requests(plan, neighbours[0])
    ledger = tmp_path / "site.ledger.json"
    settings = {"data": str(neighbours[0]), "ledger": str(ledger), "epsilon": 8.0}
    site = Site(SiteSettings(**settings))
    assert site.budget == 8.0  # no budget: one run's ε
    assert serve(site, honest_steps(plan, requests), {}) == [True] * plan.n_releases
    restarted = Site(SiteSettings(**settings))
    with pytest.raises(
        SiteRefusal,
        match=r"one run's epsilon.*--budget with --raise-budget on the command line.*new ledger file",
    ):
        restarted.check_run(plan, *HONEST)
    with pytest.raises(BudgetSettingError, match="raise_budget"):  # the first run stored its cap, 8
        Site(SiteSettings(**settings, budget=10.0))
    restarted_larger = Site(SiteSettings(**{**settings, "epsilon": 16.0}))  # a larger ε, no budget
    assert restarted_larger.budget == 8.0
    with pytest.raises(SiteRefusal, match="budget stored in its ledger file"):
        restarted_larger.check_run(plan_for(16.0), *HONEST)
    Site(SiteSettings(**settings, budget=10.0, raise_budget=True))
    assert Site(SiteSettings(**settings)).budget == 8.0  # min(one run's ε, stored 10)
    Site(SiteSettings(**settings, budget=9.0))  # lowering is fine
    with pytest.raises(BudgetSettingError, match="raise_budget"):
        Site(SiteSettings(**settings, budget=16.0))  # raising is an explicit act
    assert Site(SiteSettings(**settings, budget=16.0, raise_budget=True)).budget == 16.0
    low = Site(SiteSettings(**{**settings, "epsilon": 8.0}))
    assert low.budget == 8.0
    small = tmp_path / "small.ledger.json"
    Site(SiteSettings(data=str(neighbours[0]), ledger=str(small), epsilon=8.0, budget=1.2))
    capped = Site(SiteSettings(data=str(neighbours[0]), ledger=str(small), epsilon=8.0))
    assert capped.budget == 1.2  # restarted without a budget: the stored 1.2, not 8
    with pytest.raises(SiteRefusal, match="budget stored in its ledger file"):
        capped.check_run(plan, *HONEST)


def test_a_secure_run_records_and_caps_the_fallback_epsilon(neighbours, tmp_path):
    plan = plan_for()
    fallbacks = [run_fallback_epsilon(plan, "secure", t) for t in (2, 3, 5)]
    assert plan.spent() < fallbacks[0] < fallbacks[1] < fallbacks[2]
    assert run_fallback_epsilon(plan, "plain", 5) == pytest.approx(plan.spent())
    site = make_site(neighbours[0], tmp_path, "fallback", budget=100.0)
    site.check_run(plan, "secure", 2, 5)  # fallback at t = 2 is below 2 ε
    with pytest.raises(SiteRefusal, match="fallback epsilon"):
        site.check_run(plan, "secure", 5, 5)  # ε 8 becomes about 22 if four sites collude
    trusting = make_site(neighbours[0], tmp_path, "trusting", budget=100.0, max_fallback_epsilon=30.0)
    trusting.check_run(plan, "secure", 5, 5)
    from dpsc.federated._site import site_record

    record = site_record(plan, "secure", 5, 5, 60, NoiseSource())
    assert record.details["fallback_epsilon"] == pytest.approx(fallbacks[2])
    assert "semi-honest" in record.statement and "fallback" in record.statement


def test_a_second_secure_run_on_a_spent_budget_is_refused_for_the_budget_with_the_fresh_start(
    neighbours, tmp_path
):
    """The simplest true reason first: a spent budget, not the fallback ε it also exceeds."""
    plan = plan_for()
    requests = honest_requests(plan, neighbours[0])
    site = make_site(neighbours[0], tmp_path, "spent")  # its budget: one run's ε
    assert serve(site, [(plan, r, "secure", 2, 2) for r in requests], {}) == [True] * plan.n_releases
    with pytest.raises(SiteRefusal, match=r"budget refuses the run.*epsilon left: 0.*--ledger") as refused:
        site.check_run(plan, "secure", 2, 2)
    assert "fallback" not in str(refused.value)


def test_the_fallback_epsilon_composes_over_runs_and_is_capped_as_a_total(neighbours, tmp_path):
    """Two secure runs (threshold 3) under budget 16: each run's fallback is below the cap, not both."""
    plan = plan_for()
    requests = honest_requests(plan, neighbours[0])
    one = run_fallback_epsilon(plan, "secure", 3)
    site = make_site(neighbours[0], tmp_path, "twice", budget=16.0, max_fallback_epsilon=1.3 * one)
    assert serve(site, [(plan, r, "secure", 3, 3) for r in requests], {}) == [True] * plan.n_releases
    lines = site.ledger.entries()
    for line in lines:
        assert line["fallback_history"][0][0] == pytest.approx(line["history"][0][0] / 3**0.5)
    with pytest.raises(SiteRefusal, match="with every earlier run of its ledger"):
        site.check_run(plan, "secure", 3, 3)
    assert compose(site.ledger.entries()).epsilon <= 8.0 * (1 + 1e-9)
    default = make_site(neighbours[0], tmp_path, "default", budget=16.0)  # 2 × ε per run, 2 × budget in all
    assert serve(default, [(plan, r, "secure", 3, 3) for r in requests], {}) == [True] * plan.n_releases
    default.check_run(plan, "secure", 3, 3)


# -- random out-of-schedule sequences ------------------------------------------------------------
MUTATIONS = (
    "repeat",
    "skip",
    "reorder",
    "wrong kind",
    "sigma 0",
    "sigma below plan",
    "bad loadings",
    "bad centroids",
    "threshold above honest",
    "changed delta",
    "changed genes",
)


def mutate(rng: np.random.Generator, plan, steps: list, kind: str) -> list:
    steps = list(steps)
    i = int(rng.integers(len(steps)))
    p, request, mode, threshold, n_sites = steps[i]
    if kind == "repeat":
        steps.insert(int(rng.integers(i, len(steps) + 1)), steps[i])
    elif kind == "skip":
        del steps[i]
    elif kind == "reorder":
        j = int(rng.integers(len(steps)))
        steps[i], steps[j] = steps[j], steps[i]
    elif kind == "wrong kind":
        other = [k for k in KINDS if k != request.kind]
        steps[i] = (p, dataclasses.replace(request, kind=str(rng.choice(other))), mode, threshold, n_sites)
    elif kind == "sigma 0":
        steps[i] = (p, dataclasses.replace(request, sigma=0.0), mode, threshold, n_sites)
    elif kind == "sigma below plan":
        steps[i] = (p, dataclasses.replace(request, sigma=0.5 * request.sigma), mode, threshold, n_sites)
    elif kind == "bad loadings" and request.loadings is not None:
        loadings = request.loadings.copy()
        loadings[int(rng.integers(loadings.shape[0])), 0] = rng.choice([np.nan, np.inf, -1e200, 1e200])
        steps[i] = (p, dataclasses.replace(request, loadings=loadings), mode, threshold, n_sites)
    elif kind == "bad centroids" and request.assignment is not None:
        matrix = request.assignment.matrix.copy()
        matrix.flat[int(rng.integers(matrix.size))] = rng.choice([np.nan, np.inf, 1e200])
        hostile = Assignment(request.assignment.kind, matrix)
        steps[i] = (p, dataclasses.replace(request, assignment=hostile), mode, threshold, n_sites)
    elif kind == "threshold above honest":
        steps[i] = (p, request, "secure", 3, 3)
    elif kind == "changed delta":
        steps[i] = (changed(p, delta=p.delta * 10), request, mode, threshold, n_sites)
    elif kind == "changed genes":
        steps[i] = (changed(p, **{"n-genes": p.n_genes - 1}), request, mode, threshold, n_sites)
    return steps


def test_random_out_of_schedule_sequences(neighbours, tmp_path):
    """200 random mutations of an honest run (and of two runs back to back)."""
    rng = np.random.default_rng(2026)
    plan = plan_for()
    steps = honest_steps(plan, honest_requests(plan, neighbours[0]))
    counts = dict.fromkeys(MUTATIONS, 0)
    for trial in range(200):
        runs = []
        for _ in range(1 + trial % 2):  # one run, or two runs back to back
            sequence = steps * (1 + trial % 3 // 2)  # sometimes the whole run twice in one run
            for _ in range(int(rng.integers(1, 4))):
                kind = str(rng.choice(MUTATIONS))
                counts[kind] += 1
                sequence = mutate(rng, plan, sequence, kind)
            runs.append(sequence)
        budget = None if trial % 3 else 40.0  # the default (one run) or room for several runs
        decisions = iter(check_both(neighbours, tmp_path, *runs, honest_sites=2, budget=budget))
        for sequence in runs:  # within a run: each index at most once, in order
            served = [step[1].index for step in sequence if next(decisions)]
            assert served == list(range(len(served))), served
    assert min(counts.values()) >= 10, counts


# -- through Flower's message handler -----------------------------------------------------------------
@pytest.mark.optional_extra
def test_the_message_handler_refuses_what_the_site_refuses(neighbours, tmp_path):
    pytest.importorskip("flwr")
    from flwr.app import Context, RecordDict

    from dpsc.federated._pipeline import SiteHandler, _payload

    plan = plan_for()
    requests = honest_requests(plan, neighbours[0])
    settings = SiteSettings(data=str(neighbours[1]), ledger=str(tmp_path / "h.ledger.json"), epsilon=8.0)
    context = Context(run_id=1, node_id=1, node_config={"partition-id": 0}, state=RecordDict(), run_config={})
    handler = SiteHandler(context, {0: settings})
    common = {"task": "pipeline", "mode": "plain", "threshold": 1, "n-sites": 3, **plan.to_config()}

    def message(request: Request, **changes):
        config = {**common, "kind": request.kind, "index": request.index, "sigma": request.sigma, **changes}
        if request.assignment is not None:
            config["assignment"] = request.assignment.kind
        return _payload(request), config

    handler.fit(*message(requests[0]))
    for hostile in (
        message(requests[0]),  # served before
        message(requests[1], sigma=0.0),
        message(requests[1], kind="genes"),
        message(requests[1], threshold=2, mode="secure"),
        message(requests[2]),  # skips release 1
    ):
        with pytest.raises(SiteRefusal):
            handler.fit(*hostile)
    ledger = Site(settings).ledger.entries()
    assert len(ledger) == 1 and math.isfinite(compose(ledger).epsilon)


# -- a deployment on loopback: what the data manager and the coordinator read -------------------------
def _server_args(port: int, out: Path, *extra: str, timeout: int = 150) -> list[str]:
    common = ["--n-clusters", "3", "--n-vars", str(N_VARS), "--port", str(port), "--out", str(out)]
    return ["federate", "server", *common, "--timeout", str(timeout), *extra]


def _site_args(data: Path, port: int, *extra: str, timeout: int = 150) -> list[str]:
    where = ["--data", str(data), "--superlink", f"127.0.0.1:{port}"]
    return ["federate", "site", *where, "--timeout", str(timeout), *extra]


@pytest.mark.optional_extra
def test_a_refusal_reaches_both_terminals_in_plain_words(neighbours, tmp_path, launch_dpsc):
    """The site prints its own reason in flag terms; the server names the release and that reason."""
    pytest.importorskip("flwr")
    from dpsc.federated._deploy import free_port

    data = tmp_path / "site.h5ad"
    data.write_bytes(neighbours[0].read_bytes())
    port = free_port()
    server = launch_dpsc(
        _server_args(port, tmp_path / "fed", "--sites", "1", "--mode", "plain"), tmp_path / "s.log"
    )
    site = launch_dpsc(_site_args(data, port, "--epsilon", "4"), tmp_path / "site.log")
    assert site.wait(timeout=120) == 2 and server.wait(timeout=60) == 2
    site_text = " ".join((tmp_path / "site.log").read_text().split())
    server_text = " ".join((tmp_path / "s.log").read_text().split())
    assert "This site refused the run: The server's noise multiplier" in site_text
    assert "--epsilon 4" in site_text and "raise SiteRefusal" not in site_text
    assert "Release 0 (sum): 0 of the 1 connected sites contributed" in server_text
    assert "refused: The server's noise multiplier" in server_text
    assert not list(Path(tempfile.gettempdir()).glob(f"dpsc-site-{site.pid}-*.log"))  # no log kept
    assert (
        not Path(str(data) + ".dpsc-ledger.json").exists()
        or json.loads(Path(str(data) + ".dpsc-ledger.json").read_text())["entries"] == {}
    )


@pytest.mark.optional_extra
def test_secure_mode_with_one_site_is_refused_with_the_fix(tmp_path, launch_dpsc):
    pytest.importorskip("flwr")
    server = launch_dpsc(_server_args(1, tmp_path / "fed", "--sites", "1"), tmp_path / "s.log")
    assert server.wait(timeout=60) == 2
    assert "--mode plain" in (tmp_path / "s.log").read_text()


@pytest.mark.optional_extra
def test_sites_stop_within_seconds_when_the_server_stops(neighbours, tmp_path, launch_dpsc):
    """The server crashes after the first release: every site exits, with the reason, within 15 s."""
    pytest.importorskip("flwr")
    from dpsc.federated._deploy import free_port

    port = free_port()
    datas = []
    for k in range(2):
        datas.append(tmp_path / f"site{k}.h5ad")
        datas[-1].write_bytes(neighbours[k].read_bytes())
    server = launch_dpsc(
        _server_args(port, tmp_path / "fed", "--sites", "2", "--mode", "plain"), tmp_path / "s.log"
    )
    sites = [
        launch_dpsc(_site_args(d, port, "--budget", "20"), tmp_path / f"site{k}.log")
        for k, d in enumerate(datas)
    ]
    ledger = Path(str(datas[0]) + ".dpsc-ledger.json")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (ledger.exists() and json.loads(ledger.read_text())["entries"]):
        time.sleep(0.3)
    os.killpg(server.pid, signal.SIGKILL)  # the coordinator's machine dies mid-run
    killed = time.monotonic()
    codes = [s.wait(timeout=60) for s in sites]
    print(f"sites stopped {time.monotonic() - killed:.1f} s after the server")
    assert time.monotonic() - killed < 15 and codes == [2, 2]  # about 7 s: 4 s of silence, then stop
    for k in range(2):
        text = " ".join((tmp_path / f"site{k}.log").read_text().split())
        assert "server stopped before this site's run ended" in text


@pytest.mark.slow
@pytest.mark.optional_extra
def test_a_secure_run_that_loses_a_site_ends_everywhere_with_the_reason(neighbours, tmp_path, launch_dpsc):
    """Threshold 3 of 3, one site killed mid-run: the server says which release failed and why, and
    the two other sites exit within 30 s of the server's end instead of waiting for their timeout.

    Flower reports the killed site after its heartbeat patience (60 s) or, when it died while
    sending, the object-push session lifetime (180 s): the run's timeout leaves room for both.
    """
    pytest.importorskip("flwr")
    from dpsc.federated._deploy import free_port

    port = free_port()
    datas = []
    for k in range(3):
        datas.append(tmp_path / f"site{k}.h5ad")
        datas[-1].write_bytes(neighbours[k % 2].read_bytes())
    server = launch_dpsc(
        _server_args(port, tmp_path / "fed", "--sites", "3", timeout=400), tmp_path / "s.log"
    )
    sites = [
        launch_dpsc(_site_args(d, port, timeout=500), tmp_path / f"site{k}.log") for k, d in enumerate(datas)
    ]
    ledger = Path(str(datas[2]) + ".dpsc-ledger.json")
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline and not (ledger.exists() and json.loads(ledger.read_text())["entries"]):
        time.sleep(0.3)
    os.killpg(sites[2].pid, signal.SIGKILL)
    assert server.wait(timeout=450) == 2
    ended = time.monotonic()
    codes = [s.wait(timeout=60) for s in sites[:2]]
    assert time.monotonic() - ended < 30 and codes == [2, 2]
    server_text = " ".join((tmp_path / "s.log").read_text().split())
    assert "The federated run stopped" in server_text and "contributed, fewer than the 3" in server_text
    for k in range(2):
        assert "server stopped" in " ".join((tmp_path / f"site{k}.log").read_text().split())


def test_a_simulated_site_answered_by_two_workers_books_every_release_in_each(neighbours, tmp_path):
    """Flower's simulation may hand one site's messages to different worker processes, each with its
    own copy of the in-memory site: the run's bookings travel with the run's state (JSON, as Flower
    keeps it), and each copy adopts those it lacks before it checks the next release."""
    plan = plan_for(epsilon=2.0, markers=True)
    requests = honest_requests(plan, neighbours[0])
    cells = ad.read_h5ad(neighbours[0])
    workers = [Site(SiteSettings(data=cells, epsilon=2.0)) for _ in range(2)]
    state: dict = {}
    for request in requests:  # the second worker answers one release only (the split seen in a run)
        worker = workers[int(request.index == plan.n_releases - 2)]
        worker.contribute(plan, request, *HONEST, state)
        state = json.loads(json.dumps(state))
    first, second = (w.ledger.entries() for w in workers)
    assert len(first) == plan.n_releases and len(second) == 1 + (plan.n_releases - 2)
    assert compose(first).epsilon == pytest.approx(plan.spent(), rel=1e-9) and plan.spent() <= 2.0
    filed = Site(SiteSettings(data=cells, epsilon=2.0, ledger=str(tmp_path / "cells.ledger.json")))
    run: dict = {}
    for request in requests[:2]:  # cells in memory, ledger in a file that every worker shares
        filed.contribute(plan, request, *HONEST, run)
    assert len(filed.ledger.entries()) == 2


# -- marker bounds a server cannot bend -----------------------------------------------------------------
@pytest.mark.parametrize("sparse", [True, False])
def test_a_centre_on_a_target_cell_with_the_smallest_bound_moves_the_table_by_at_most_delta(sparse):
    """The server centres the table on a target cell (+1e-3 on one gene) and asks for tiny bounds.

    Bounds below the smallest an honest run releases are refused before any cell is read; at that
    smallest bound, adding the target moves the exact table by at most Δ (the clip norm is computed
    term by term: no centre makes it cancel).
    """
    rng = np.random.default_rng(3)
    counts = rng.poisson(1.0, size=(30, N_VARS)).astype(np.float64)
    target = rng.poisson(3.0, size=(1, N_VARS)).astype(np.float64)
    target[0, :5] = 0.0
    x = markers_mechanism._log_expression(target)[0]
    center = x.copy()
    center[7] += 1e-3
    for tiny in (1e-300, 5.8e-9, 0.5 * markers_mechanism.bound_floor(1)):
        with pytest.raises(markers_mechanism.BoundError, match="the smallest bound an honest run releases"):
            markers_mechanism.MarkerFrame(center, tiny, 1.0).check(N_VARS)
    frame = markers_mechanism.MarkerFrame(
        center, markers_mechanism.bound_floor(1), markers_mechanism.bound_floor(2)
    )
    table = markers_mechanism.MarkerTable(2, N_VARS, frame)
    as_matrix = sp.csr_matrix if sparse else np.asarray
    groups = np.r_[np.zeros(15, int), np.ones(15, int)]
    before = markers_mechanism.group_table(as_matrix(counts), groups, table)
    after = markers_mechanism.group_table(as_matrix(np.vstack([counts, target])), np.r_[groups, 0], table)
    moved = float(np.linalg.norm(after - before))
    assert 0 < moved <= table.sensitivity * (1 + 1e-9), moved


def test_sparse_clip_norms_are_upper_bounds_of_the_direct_ones():
    rng = np.random.default_rng(4)
    counts = sp.random(50, N_VARS, density=0.3, random_state=5, format="csr") * 20
    x = markers_mechanism._sparse_log_expression(counts)
    dense = x.toarray()
    for center in (np.zeros(N_VARS), dense[3] + 1e-7, rng.uniform(0, 9, N_VARS)):
        g = markers_mechanism.gene_weights(center)
        norm_y, norm_q = markers_mechanism._sparse_norms(x, center, g)
        y = g * (dense - center)
        exact_y, exact_q = np.sqrt((y**2).sum(1)), np.sqrt((y**4).sum(1))
        assert (norm_y >= exact_y * (1 - 1e-15)).all() and (norm_q >= exact_q * (1 - 1e-15)).all()
        slack = markers_mechanism.NORM_SLACK * float((g**2 * center**2).sum())
        assert (norm_y**2 <= exact_y**2 * (1 + 1e-12) + 2 * slack).all()


def test_honest_frames_are_never_below_the_floor(neighbours):
    """Every frame an honest run releases passes the floor (random centres and histograms)."""
    rng = np.random.default_rng(6)
    for _ in range(50):
        center = rng.uniform(0, markers_mechanism.MAX_LOG_EXPRESSION, N_VARS) * rng.integers(0, 2, N_VARS)
        histograms = rng.normal(0, 5, 2 * markers_mechanism.NORM_BINS)
        histograms[rng.integers(0, markers_mechanism.NORM_BINS)] += 100
        first = markers_mechanism.released_frame(histograms, center)
        first.check(N_VARS)
        columns = np.sort(rng.choice(N_VARS, 10, replace=False))
        markers_mechanism.focused_frame(histograms, first, columns).check(10)


def test_a_tiny_marker_bound_is_refused_on_both_neighbours(neighbours, tmp_path):
    plan = plan_for(markers=True)
    requests = honest_requests(plan, neighbours[0])
    table = len(requests) - 3
    data = ad.read_h5ad(neighbours[1]).X
    target_center = markers_mechanism._log_expression(data[-1:])[0]
    target_center[1] += 1e-3
    for bound in (1e-300, 5.8e-9):
        frame = markers_mechanism.MarkerFrame(target_center, bound, bound)
        steps = honest_steps(plan, [*requests[:table], dataclasses.replace(requests[table], frame=frame)])
        assert check_both(neighbours, tmp_path, steps) == [True] * table + [False]


def test_finish_belongs_to_the_run_the_site_served(neighbours, tmp_path):
    """``finish`` without a run, before its end, with another plan, twice: refused, nothing written."""
    pytest.importorskip("flwr")
    from flwr.app import Context, RecordDict

    from dpsc.federated._pipeline import SiteHandler, _payload

    plan = plan_for()
    requests = honest_requests(plan, neighbours[0])
    data = tmp_path / "site.h5ad"
    data.write_bytes(neighbours[1].read_bytes())
    settings = SiteSettings(data=str(data), ledger=str(tmp_path / "f.ledger.json"), epsilon=8.0)
    output = Path(settings.output)
    context = Context(run_id=1, node_id=1, node_config={"partition-id": 0}, state=RecordDict(), run_config={})
    handler = SiteHandler(context, {0: settings})
    common = {"task": "pipeline", "mode": "plain", "threshold": 1, "n-sites": 3}

    def message(request: Request, run_plan=plan):
        config = {**common, **run_plan.to_config(), "kind": request.kind, "index": request.index}
        config["sigma"] = request.sigma
        if request.assignment is not None:
            config["assignment"] = request.assignment.kind
        return _payload(request), config

    def finish(run_plan=plan):
        result = run_clustering(run_plan, central_release_sum(ad.read_h5ad(data).X, NoiseSource(2)))
        arrays = [result.genes, result.loadings, result.eigenvalues, result.centroids, result.centroid_noise]
        return arrays, {**common, **run_plan.to_config(), "kind": "finish", "index": 0, "sigma": 0.0}

    with pytest.raises(SiteRefusal, match="did not serve"):
        handler.fit(*finish())
    handler.fit(*message(requests[0]))
    with pytest.raises(SiteRefusal, match="after 1 of the run's"):
        handler.fit(*finish())
    for request in requests[1:]:
        handler.fit(*message(request))
    louder = changed(plan, **{f"sigma-{k}": 20 * v for k, v in plan.sigmas.items()})
    with pytest.raises(SiteRefusal, match="another plan"):
        handler.fit(*finish(louder))
    assert not output.exists()
    handler.fit(*finish())
    written = output.stat().st_mtime_ns
    with pytest.raises(SiteRefusal, match="once"):
        handler.fit(*finish())
    assert output.stat().st_mtime_ns == written
    out = ad.read_h5ad(output)
    claimed = out.uns["dpsc"]["dp_cluster"]["privacy"]["epsilon"]
    ledger = compose(Site(settings).ledger.entries()).epsilon
    assert claimed == pytest.approx(ledger, rel=0.05) and ledger <= 8.0 * (1 + 1e-9)
