"""The federated private clustering: exact secure sums, site-enforced privacy, ledgers, deployment."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import tempfile
import time
from pathlib import Path

import anndata as ad
import numpy as np
import pytest
import scipy.sparse as sp

import dpsc
from dpsc.federated._secagg import LIMBS, from_digit_means, secure_mask, sum_digits, to_digits
from dpsc.federated._site import Site, SiteRefusal, SiteSettings
from dpsc.methods.cluster_plan import ClusterPlan, plan_clustering
from dpsc.methods.cluster_requests import Request
from dpsc.methods.clustering import contribution
from dpsc.privacy import GaussianSum, NoiseSource, distributed_slack


@pytest.fixture
def sites(small_adata, tmp_path):
    """Three sites' files (100 cells each of the small PBMC AnnData) and their settings."""
    out = []
    for k in range(3):
        path = tmp_path / f"site{k}.h5ad"
        ad.AnnData(small_adata.X[k * 100 : (k + 1) * 100], var=small_adata.var[[]].copy()).write_h5ad(path)
        out.append(SiteSettings(data=str(path), epsilon=8.0, budget=20.0))
    return out


def _plan(settings: SiteSettings, n_vars: int = 200, epsilon: float = 8.0):
    return plan_clustering(epsilon, 1e-5, n_vars=n_vars, n_clusters=3)


# -- exact secure sums ---------------------------------------------------------------------------
@pytest.mark.optional_extra
def test_secagg_digits_carry_exact_int64_sums_through_flowers_quantizer():
    pytest.importorskip("flwr")
    from flwr.common.secure_aggregation.quantization import dequantize, quantize

    from dpsc.federated._secagg import CLIP_RANGE, TARGET_RANGE

    rng = np.random.default_rng(0)
    vectors = [rng.integers(-(2**52), 2**52, size=500) for _ in range(5)]
    assert np.array_equal(sum_digits([to_digits(v) for v in vectors]), np.sum(vectors, axis=0))
    # what SecAgg+ does with the floats: quantize (stochastic rounding never rounds them), sum, dequantize,
    # remove the clipping offset, divide by the total weight
    quantized = [quantize(to_digits(v), CLIP_RANGE, TARGET_RANGE) for v in vectors]
    recon = [sum(q[limb] for q in quantized) for limb in range(LIMBS)]
    k = len(vectors)
    means = [(a - (k - 1) * CLIP_RANGE) / k for a in dequantize(recon, CLIP_RANGE, TARGET_RANGE)]
    assert np.array_equal(from_digit_means(means, k), np.sum(vectors, axis=0))


@pytest.mark.optional_extra
def test_secure_masks_replace_flowers_32_bit_seed():
    pytest.importorskip("flwr")
    import importlib

    from flwr.common.secure_aggregation.secaggplus_utils import pseudo_rand_gen as flowers

    from dpsc.federated._secagg import SECAGG_MODULES, use_secure_masks

    use_secure_masks()
    for name in SECAGG_MODULES:  # the generator SecAgg+ calls on both sides is ours
        assert importlib.import_module(name).pseudo_rand_gen is secure_mask
    a, b = bytes(range(32)), bytes(range(4, 32)) + bytes(range(4))  # rotated by one 32-bit word
    shapes = [(1000,)]
    # Flower folds a 256-bit secret into 32 bits by XOR: these two secrets give the same mask ...
    assert np.array_equal(flowers(a, 2**32, shapes)[0], flowers(b, 2**32, shapes)[0])
    # ... ours uses the whole secret
    assert not np.array_equal(secure_mask(a, 2**32, shapes)[0], secure_mask(b, 2**32, shapes)[0])
    mask = secure_mask(a, 2**32, shapes)[0]
    assert mask.min() >= 0 and mask.max() < 2**32 and abs(mask.mean() / 2**31 - 1) < 0.05


def test_noise_shares_sum_to_the_central_noise():
    release = GaussianSum("x", 20_000, 1.0, 1.3)
    t = 4
    shares = [release.noise(NoiseSource(7).stream("share", k), shares=t) for k in range(t)]
    total = np.sum(shares, axis=0)
    assert np.std(total) == pytest.approx(release.lattice_std, rel=0.02)
    assert np.std(shares[0]) == pytest.approx(release.lattice_std / np.sqrt(t), rel=0.02)
    assert distributed_slack(release, t) < -100  # Kairouz-Liu-Steinke slack: negligible
    assert release.noise_std <= 1.001 * 1.3  # the lattice costs at most 0.1 %


def test_a_sum_over_sites_equals_the_sum_over_cells(sites):
    matrix = sp.vstack([ad.read_h5ad(s.data).X for s in sites])
    direction = np.random.default_rng(0).normal(size=(200, 1))
    for request in (
        Request("sum", 1, 0.0, genes=np.arange(200)),
        Request("pca", 2, 0.0, genes=np.arange(200), loadings=direction / np.linalg.norm(direction)),
    ):
        parts = [contribution(request, ad.read_h5ad(s.data).X) for s in sites]
        np.testing.assert_allclose(np.sum(parts, axis=0), contribution(request, matrix), atol=1e-9)


# -- site-enforced privacy -----------------------------------------------------------------------
def test_site_refuses_what_its_settings_do_not_allow(sites):
    site = Site(sites[0])
    plan = _plan(sites[0])
    site.check_run(plan, "secure", 3, 3)  # its own calibration: accepted
    weaker = plan_clustering(16.0, 1e-5, n_vars=200, n_clusters=3)  # less noise than ε = 8 needs
    with pytest.raises(SiteRefusal, match="below this site's own calibration"):
        site.check_run(weaker, "secure", 3, 3)
    with pytest.raises(SiteRefusal, match="un-noised"):
        site.check_run(plan_clustering(None, 1e-5, n_vars=200, n_clusters=3), "secure", 3, 3)
    cautious = Site(SiteSettings(data=sites[0].data, epsilon=8.0, honest_sites=2))
    with pytest.raises(SiteRefusal, match="trusts at most 2"):
        cautious.check_run(plan, "secure", 3, 3)
    with pytest.raises(SiteRefusal, match="genes"):
        site.check_run(_plan(sites[0], n_vars=150), "secure", 3, 3)
    with pytest.raises(SiteRefusal, match="Malformed plan"):  # more genes to read than there are
        site.check_run(ClusterPlan.from_config({**plan.to_config(), "n-genes": 201}), "secure", 3, 3)
    fewer = plan_clustering(8.0, 1e-5, n_vars=200, n_clusters=3, n_genes=100)  # the server chose 100 genes
    site.check_run(fewer, "secure", 3, 3)  # calibrated by the site for a plan with gene selection
    with pytest.raises(SiteRefusal, match="below this site's own calibration"):
        without = {f"sigma-{kind}": sigma for kind, sigma in plan.sigmas.items()}  # σ without selection
        site.check_run(ClusterPlan.from_config({**fewer.to_config(), **without}), "secure", 3, 3)
    with pytest.raises(SiteRefusal, match="next release of the run's plan is 0"):
        site.contribute(plan, Request("kmeans", 99, plan.sigmas["kmeans"]), "secure", 3, 3)
    assert site.ledger.entries() == []  # nothing was booked by a refusal


@pytest.mark.optional_extra
def test_a_round_carries_a_request_and_a_reply_unchanged(sites):
    """The one layout of a round (``_rounds``): what the server sends is what a site's handler
    reads, and what the site answers is what the server reads back (both modes use it)."""
    pytest.importorskip("flwr")
    from flwr.app import Context, RecordDict

    from dpsc.federated._pipeline import SiteHandler
    from dpsc.federated._rounds import read_reply, read_request, reply_content, request_content

    plan = _plan(sites[0])
    config = {"task": "pipeline", "mode": "plain", "threshold": 1, "n-sites": 3, **plan.to_config()}
    config |= {"kind": "describe", "index": 0, "sigma": 0.5}
    payload = [np.arange(200), np.full((200, 1), 200**-0.5), np.zeros((0, 0)), np.zeros(0)]
    arrays, received = read_request(request_content(config, payload))
    assert received == config and all(np.array_equal(a, b) for a, b in zip(arrays, payload, strict=True))
    context = Context(run_id=1, node_id=1, node_config={"partition-id": 1}, state=RecordDict(), run_config={})
    answer, _, _ = SiteHandler(context, dict(enumerate(sites))).fit(arrays, received)
    (described,) = read_reply(reply_content(answer))
    assert described.tolist() == [200, 100]  # the site's genes and cells, public facts of the plan


@pytest.mark.optional_extra
def test_site_handler_refuses_a_server_seed_and_a_secure_request_outside_secagg(sites):
    pytest.importorskip("flwr")
    from flwr.app import Context, RecordDict

    from dpsc.federated._pipeline import SiteHandler

    context = Context(run_id=1, node_id=1, node_config={"partition-id": 0}, state=RecordDict(), run_config={})
    handler = SiteHandler(context, dict(enumerate(sites)))
    plan = _plan(sites[0])
    config = {"task": "pipeline", "mode": "secure", "threshold": 3, "n-sites": 3, **plan.to_config()}
    config |= {"kind": "sum", "index": 0, "sigma": plan.sigmas["sum"]}
    payload = [np.arange(200), np.zeros((0, 0)), np.zeros((0, 0)), np.zeros(0)]  # the genes of the cell sum
    with pytest.raises(SiteRefusal, match="Malformed"):
        pca = {**config, "mode": "plain", "kind": "pca", "sigma": plan.sigmas["pca"]}  # not release 0
        handler.fit([np.arange(200), np.full((200, 1), 200**-0.5), np.zeros((0, 0)), np.zeros(0)], pca)
    short = [np.arange(150), np.zeros((0, 0)), np.zeros((0, 0)), np.zeros(0)]  # not the plan's 200 genes
    with pytest.raises(SiteRefusal, match="plan reads 200 distinct genes"):
        handler.fit(short, {**config, "mode": "plain"})
    repeated = [np.zeros(200, dtype=np.int64), *payload[1:]]
    with pytest.raises(SiteRefusal, match="distinct genes"):
        handler.fit(repeated, {**config, "mode": "plain"})
    with pytest.raises(SiteRefusal, match="noise seed"):
        handler.fit(payload, {**config, "noise-seed": 7})
    with pytest.raises(SiteRefusal, match="outside SecAgg"):
        handler.fit(payload, config)
    with pytest.raises(SiteRefusal, match="Malformed"):
        handler.fit(payload, {k: v for k, v in config.items() if k != "n-clusters"})
    assert Site(sites[0]).ledger.entries() == []
    vector, _, _ = handler.fit(payload, {**config, "mode": "plain", "threshold": 1})  # plain: full noise
    assert vector[0].dtype == np.int64 and len(Site(sites[0]).ledger.entries()) == 1


def test_site_ledger_survives_a_restart_composes_and_refuses_past_the_budget(sites):
    settings = SiteSettings(data=sites[1].data, epsilon=8.0, budget=9.0)
    plan = _plan(settings)

    def one_run(site: Site) -> None:
        state: dict = {}
        genes = np.arange(200)
        site.contribute(plan, Request("sum", 0, plan.sigmas["sum"], genes=genes), "plain", 1, 3, state)
        direction = np.full((200, 1), 200**-0.5)
        pca = Request("pca", 1, plan.sigmas["pca"], genes=genes, loadings=direction)
        site.contribute(plan, pca, "plain", 1, 3, state)

    one_run(Site(settings))
    restarted = Site(settings)  # a new process: the ledger is read back from its file
    assert len(restarted.ledger.entries()) == 2
    first = dpsc.privacy.compose(restarted.ledger.entries()).epsilon
    with pytest.raises(SiteRefusal, match="budget refuses the run"):
        one_run(restarted)  # the whole run (about 8) on top of what was spent passes 9
    assert len(restarted.ledger.entries()) == 2
    assert 0 < first < 8.0
    text = Path(settings.ledger).read_text()
    assert json.loads(text)["budget"]["epsilon"] == 9.0  # a plain, atomic JSON file beside the data


def test_a_refusal_file_appears_only_with_its_whole_reason(tmp_path, monkeypatch):
    """``dpsc federate site`` acts on the file's existence: it must never see it empty or partial."""
    settings = SiteSettings(data=str(tmp_path / "site.h5ad"), epsilon=8.0)
    target = settings.refusal_file
    written = Path.write_text

    def write_while_watched(path, text, *args, **kwargs):
        assert path != target, "the watched file is opened (empty) before its reason is written"
        return written(path, text, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write_while_watched)
    settings.record_refusal("The server's noise multiplier is below this site's own.")
    assert target.read_text() == "The server's noise multiplier is below this site's own."
    settings.record_refusal("A second reason replaces the first.")
    assert target.read_text() == "A second reason replaces the first."
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]


def test_a_site_holding_its_cells_in_memory_checks_and_books_the_same_and_writes_no_file(sites, tmp_path):
    from dpsc.privacy import MemoryLedger

    cells = ad.read_h5ad(sites[2].data)
    before = sorted(tmp_path.iterdir())
    settings = SiteSettings(data=cells, epsilon=8.0)
    assert settings.in_memory and settings.ledger is None and settings.refusal_file is None
    site = Site(settings)
    assert isinstance(site.ledger, MemoryLedger)
    plan = _plan(settings)
    state: dict = {}
    site.contribute(plan, Request("sum", 0, plan.sigmas["sum"], genes=np.arange(200)), "plain", 1, 3, state)
    assert len(site.ledger.entries()) == 1
    with pytest.raises(SiteRefusal, match="each release is served once"):  # a replay, refused the same
        site.contribute(
            plan, Request("sum", 0, plan.sigmas["sum"], genes=np.arange(200)), "plain", 1, 3, state
        )
    with pytest.raises(SiteRefusal, match="budget refuses the run"):  # a second run passes one run's ε
        site.contribute(plan, Request("sum", 0, plan.sigmas["sum"], genes=np.arange(200)), "plain", 1, 3, {})
    assert len(site.ledger.entries()) == 1
    assert site.write_results(None, plan, "plain", 1, 3) is None
    assert sorted(tmp_path.iterdir()) == before  # no ledger, output or refusal file
    assert not list(Path.cwd().glob("*.refusal"))


# -- Flower: simulation and a real deployment ----------------------------------------------------
@pytest.mark.slow
@pytest.mark.optional_extra
def test_secure_federated_clustering_reproduces_the_central_one(small_adata):
    pytest.importorskip("flwr")
    adata = small_adata.copy()
    dpsc.pp.partition(adata, 3, random_state=0)
    fed, central = adata.copy(), adata.copy()
    # seed 5 puts one cell within float32 round-off of a k-means sketch hyperplane: its side then
    # depends on the block shapes of the projection (sites against all cells), and the clusterings
    # part; seeds 1-4, 6 and 7 agree whole
    dpsc.tl.cluster_federated(fed, "site", 3, epsilon=8.0, noise_seed=4, markers=True)
    dpsc.tl.cluster(central, 3, epsilon=8.0, noise_seed=4, markers=True)
    for group in ("0", "1", "2"):  # the marker table: the central one up to the sites' round-off
        ours, theirs = fed.uns["dp_cluster_markers"], central.uns["dp_cluster_markers"]
        assert list(ours["names"][group][:10]) == list(theirs["names"][group][:10])
        np.testing.assert_allclose(ours["scores"][group], theirs["scores"][group], rtol=1e-3, atol=1e-3)
    focused = [a.uns["dpsc"]["dp_cluster"]["markers"]["focus_genes"] for a in (fed, central)]
    assert focused[0] == focused[1] > 0  # the same focused table over the same genes
    np.testing.assert_allclose(
        fed.varm["dp_cluster_loadings"], central.varm["dp_cluster_loadings"], atol=1e-4
    )
    np.testing.assert_allclose(
        fed.uns["dpsc"]["dp_cluster"]["centroids"], central.uns["dpsc"]["dp_cluster"]["centroids"], atol=1e-4
    )
    assert (fed.obs["dp_cluster"] == central.obs["dp_cluster"]).mean() > 0.99
    in_use = fed.uns["dpsc"]["dp_cluster"]["clusters_in_use"]
    assert 1 <= in_use <= 3 and in_use == central.uns["dpsc"]["dp_cluster"]["clusters_in_use"]
    record = dpsc.privacy.get_record(fed, "dp_cluster")
    assert record["guarantee"] == "proven" and "SecAgg+" in record["statement"]
    assert dpsc.privacy.spent(fed).epsilon == pytest.approx(dpsc.privacy.spent(central).epsilon)
    releases = fed.uns["dpsc"]["dp_cluster"]["releases"]  # stored as columns (h5ad-safe)
    assert list(releases["contributors"]) == [3] * len(releases["contributors"])


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.optional_extra
def test_loopback_deployment_in_separate_processes(sites, tmp_path, launch_dpsc):
    """SuperLink + 2 SuperNodes on loopback in separate processes, bounded in time, stopping by themselves."""
    pytest.importorskip("flwr")
    from dpsc.federated._deploy import free_port, write_site_settings

    port = free_port()
    start = time.monotonic()
    server = launch_dpsc(
        [
            "federate",
            "server",
            "--sites",
            "2",
            "--mode",
            "plain",
            "--n-clusters",
            "3",
            "--n-vars",
            "200",
            "--port",
            str(port),
            "--out",
            str(tmp_path / "fed"),
            "--timeout",
            "170",
        ],
        tmp_path / "server.log",
    )
    files = [write_site_settings(s, tmp_path / f"site{k}.toml") for k, s in enumerate(sites[:2])]
    nodes = [
        launch_dpsc(
            [
                "federate",
                "site",
                "--settings",
                str(f),
                "--superlink",
                f"127.0.0.1:{port}",
                "--timeout",
                "170",
            ],
            tmp_path / f"site{k}.log",
        )
        for k, f in enumerate(files)
    ]
    codes = [p.wait(timeout=190) for p in [server, *nodes]]
    wall = time.monotonic() - start
    assert codes == [0, 0, 0], (tmp_path / "server.log").read_text()[-2000:]
    summary = json.loads((tmp_path / "fed" / "result" / "summary.json").read_text())
    assert [r["contributors"] for r in summary["releases"]] == [2] * len(summary["releases"])
    for s in sites[:2]:
        out = ad.read_h5ad(s.output)
        assert out.obs["dp_cluster"].notna().all() and out.varm["dp_cluster_loadings"].shape == (
            200,
            out.obsm["X_dp_cluster"].shape[1],
        )
        claimed = out.uns["dpsc"]["dp_cluster"]["privacy"]["epsilon"]
        assert 0 < claimed <= 8.0 and dpsc.privacy.spent(out).epsilon == pytest.approx(claimed, rel=0.05)
    for node in nodes:  # a completed site removes its SuperNode's temporary log
        assert not list(Path(tempfile.gettempdir()).glob(f"dpsc-site-{node.pid}-*.log"))
    for k in range(2):  # what a data manager reads: its own app, each release and the ε left
        text = (tmp_path / f"site{k}.log").read_text()
        assert "This site runs only its own dpsc app, task 'pipeline' (fingerprint" in text
        assert "Release 1 of" in text and "left." in text and "Results written to" in text
    print(f"loopback deployment: {wall:.0f} s")
    assert wall < 180


@pytest.mark.optional_extra
def test_fedsc_is_deployed_by_name_and_each_site_runs_its_own_app(sites, tmp_path, launch_dpsc):
    """``dpsc federate server/site --task fedsc``: FedSC on loopback, each site on its own DP plan."""
    pytest.importorskip("flwr")
    from dpsc.federated._deploy import free_port, write_site_settings

    port = free_port()
    common = ["--port", str(port), "--out", str(tmp_path / "fed"), "--timeout", "170"]
    server = launch_dpsc(
        [
            *("federate", "server", "--task", "fedsc", "--sites", "2", "--rounds", "2"),
            *("--n-vars", "200", "--n-clusters", "3", "--noise-multiplier", "20", *common),
        ],
        tmp_path / "server.log",
    )
    files = [write_site_settings(s, tmp_path / f"site{k}.toml") for k, s in enumerate(sites[:2])]
    nodes = [
        launch_dpsc(
            [
                *("federate", "site", "--task", "fedsc", "--settings", str(f)),
                *("--superlink", f"127.0.0.1:{port}", "--timeout", "170"),
            ],
            tmp_path / f"site{k}.log",
        )
        for k, f in enumerate(files)
    ]
    codes = [p.wait(timeout=190) for p in [server, *nodes]]
    logs = [(tmp_path / f"{name}.log").read_text() for name in ("server", "site0", "site1")]
    assert codes == [0, 0, 0], "\n".join(log[-1500:] for log in logs)
    fingerprint = logs[0].split("app (fingerprint ")[1][:16]
    assert "Submitting dpsc's own 'fedsc' app" in logs[0] and "FedSC over 2 sites: 2 rounds" in logs[0]
    summary = json.loads((tmp_path / "fed" / "result" / "summary.json").read_text())
    assert summary["rounds"] == 2 and [r["contributors"] for r in summary["releases"]] == [2] * len(
        summary["releases"]
    )
    for settings, log in zip(sites[:2], logs[1:], strict=True):
        assert f"This site runs only its own dpsc app, task 'fedsc' (fingerprint {fingerprint})" in log
        out = ad.read_h5ad(settings.output)
        assert out.obsm["X_fedsc"].shape[0] == 100 and out.obs["dp_cluster"].notna().all()
        booked = [line["key"] for line in json.loads(Path(settings.ledger).read_text())["entries"].values()]
        releases = [f"k-means release {i}" for i in range(len(summary["releases"]))]
        assert booked == ["round 1", "round 2", *releases]  # each message booked at the site, in order


@pytest.mark.slow
@pytest.mark.optional_extra
def test_a_site_killed_mid_run_leaves_every_ledger_consistent(sites, tmp_path, launch_dpsc):
    """A site killed after it booked its first release: the run ends with the two others.

    The server leaves the killed site out once the SuperLink reports it: after Flower's heartbeat
    patience (60 s) or, when it died while sending, the object-push session lifetime (180 s).
    """
    pytest.importorskip("flwr")
    from dpsc.federated._deploy import free_port, write_site_settings

    port = free_port()
    data_digest = _digest(Path(sites[2].data))
    server = launch_dpsc(
        [
            "federate",
            "server",
            "--sites",
            "3",
            "--mode",
            "plain",
            "--n-clusters",
            "3",
            "--n-vars",
            "200",
            "--port",
            str(port),
            "--out",
            str(tmp_path / "fed"),
            "--timeout",
            "320",
        ],
        tmp_path / "server.log",
    )
    files = [write_site_settings(s, tmp_path / f"site{k}.toml") for k, s in enumerate(sites)]
    nodes = [
        launch_dpsc(
            [
                "federate",
                "site",
                "--settings",
                str(f),
                "--superlink",
                f"127.0.0.1:{port}",
                "--timeout",
                "320",
            ],
            tmp_path / f"site{k}.log",
        )
        for k, f in enumerate(files)
    ]
    victim = Path(sites[2].ledger)
    deadline = time.monotonic() + 200
    while time.monotonic() < deadline and not (victim.exists() and json.loads(victim.read_text())["entries"]):
        time.sleep(0.5)
    os.killpg(nodes[2].pid, signal.SIGKILL)  # the site and its SuperNode stop mid-run
    codes = [p.wait(timeout=340) for p in [server, nodes[0], nodes[1]]]
    assert codes == [0, 0, 0], (tmp_path / "server.log").read_text()[-2000:]
    summary = json.loads((tmp_path / "fed" / "result" / "summary.json").read_text())
    contributors = [r["contributors"] for r in summary["releases"]]
    assert contributors[-1] == 2 and contributors[0] in (2, 3)
    killed = json.loads(victim.read_text())["entries"]
    assert 1 <= len(killed) <= contributors.count(3) + 1  # booked just before sending: never less than sent
    assert _digest(Path(sites[2].data)) == data_digest and not Path(sites[2].output).exists()
    for s in sites[:2]:  # the others booked every release they sent, and wrote their results
        assert len(json.loads(Path(s.ledger).read_text())["entries"]) == len(contributors)
        assert Path(s.output).exists()


def test_fedsc_site_enforces_its_own_privacy(sites):
    from dpsc.federated._fedsc_site import KMEANS_STEPS, FedSCGuard, fedsc_plan

    guard = FedSCGuard(SiteSettings(data=sites[0].data, epsilon=4.0, budget=4.5, max_rounds=20), 100)
    q, steps = 0.5, 40
    plan = fedsc_plan(4.0, guard.delta, q, steps)
    own = (plan.sigma("training"), plan.sigma("kmeans"))
    run = {
        "rounds": 10,
        "local-epochs": 1,
        "noise-multipliers": json.dumps([own[0]]),
        "kmeans-noise-multipliers": json.dumps([own[1]]),
    }
    assert guard.check_run(run, 0, q, steps) == pytest.approx(own)
    with pytest.raises(SiteRefusal, match="noise seed"):
        guard.check_run({**run, "noise-seed": 3}, 0, q, steps)
    with pytest.raises(SiteRefusal, match="below this site's own calibration"):
        guard.check_run({**run, "noise-multipliers": json.dumps([0.5 * own[0]])}, 0, q, steps)
    with pytest.raises(SiteRefusal, match="without noise"):
        guard.check_run({**run, "noise-multipliers": ""}, 0, q, steps)
    with pytest.raises(SiteRefusal, match="at most 20"):
        guard.check_run({**run, "rounds": 30}, 0, q, steps)
    with pytest.raises(SiteRefusal, match="exact per-gene sums"):
        guard.refuse_statistics()
    guard.book([(own[0], q, steps)], "a whole run", steps / (steps + KMEANS_STEPS))
    with pytest.raises(SiteRefusal, match="budget"):  # a second whole run passes the budget of 4.5
        guard.check_run(run, 0, q, steps)


def test_a_fedsc_site_calibrates_with_its_own_accountant_whatever_the_run_says(sites):
    """The accountant is the site's setting: a run planned (and labelled) with another one whose σ
    is smaller than the site's own calibration is refused; at the site's own σ it is served."""
    from dpsc.federated._fedsc_site import FedSCGuard, fedsc_plan

    q, steps = 0.5, 40
    by = {name: fedsc_plan(4.0, 1e-5, q, steps, name) for name in ("rdp", "prv")}
    strict, lenient = sorted(by, key=lambda name: -by[name].sigma("training"))
    assert by[strict].sigma("training") > by[lenient].sigma("training") * (1 + 1e-6)
    settings = SiteSettings(data=sites[0].data, epsilon=4.0, delta=1e-5, max_rounds=20, accountant=strict)
    guard = FedSCGuard(settings, 100)

    def run(plan):
        return {
            "rounds": 10,
            "local-epochs": 1,
            "accountant": lenient,  # what a server might say; the site does not read it
            "noise-multipliers": json.dumps([plan.sigma("training")]),
            "kmeans-noise-multipliers": json.dumps([plan.sigma("kmeans")]),
        }

    with pytest.raises(SiteRefusal, match="below this site's own calibration"):
        guard.check_run(run(by[lenient]), 0, q, steps)
    assert guard.check_run(run(by[strict]), 0, q, steps)[0] == pytest.approx(by[strict].sigma("training"))
    with pytest.raises(ValueError, match="accountant must be 'rdp' or 'prv'"):
        SiteSettings(data=sites[0].data, accountant="gdp")
