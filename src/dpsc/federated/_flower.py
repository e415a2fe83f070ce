"""Flower apps of FedSC (Message API; rounds through :mod:`._rounds`) and the simulation launcher.

The apps read their settings from a dict given to :func:`fedsc_apps`, overridden by Flower's
``run_config``; each site reads its cells from its own settings (in memory in a simulation, its
own ``.h5ad`` when deployed), never from a path the run configuration names. The same apps run in
Flower's simulation engine (:func:`run_federation`) and in a real deployment (``dpsc federate
server/site --task fedsc``: each site answers with the apps of its own installation).
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from .._api import renamed_arguments
from .._validation import get_matrix
from ..methods import dp_kmeans_centroids, split_table
from ..methods.cluster_design import CLIP_NORM, KMEANS_PLAN
from ..methods.kmeans import Assignment, nearest_centroid, table_release
from ..module import clean_input, input_representation
from ._ema import calibrate_lambda, divergence, divergence_aware_update, ema_weight
from ._fedsc_site import KMEANS_STEPS, FedSCGuard
from ._pipeline import site_settings_from
from ._requires import require_flwr
from ._rounds import send_to_sites
from ._run_config import run_settings
from ._scaling import apply_scaling, pooled_scaling, site_sums
from ._simulation import ray_session, resolve_shared, shared, simulate
from ._site import SiteRefusal
from ._ssl import ClientDP, SSLConfig, SSLNet, dp_schedule, embed, local_train, local_train_private

#: Where a FedSC site keeps its run's state (:class:`FedSCGuard`'s ``run``) in Flower's context.
RUN_STATE = "dpsc-fedsc-run"


def _ssl_config(s: dict[str, Any]) -> SSLConfig:
    return SSLConfig(
        method=str(s["method"]),
        lr=float(s["lr"]),
        batch_size=int(s["batch-size"]),
        mask_rate=float(s["mask-rate"]),
    )


def check_settings(settings: dict[str, Any]) -> None:
    """Refuse settings whose messages the client-level DP guarantee would not cover.

    ``scale-genes`` sends each site's per-gene sums without noise; with ``noise-multipliers``
    (DP-SGD at the sites) those sums would leak outside the per-site (ε, δ).
    """
    if bool(settings["scale-genes"]) and settings["noise-multipliers"]:
        raise ValueError(
            "scale-genes sends each site's per-gene sums without noise, which the client-level DP "
            "guarantee (noise-multipliers) would not cover; set scale-genes to false."
        )


def fedsc_apps(
    settings: dict[str, Any] | None,
    site_settings: dict[int, Any] | None = None,
    sink: dict[str, Any] | None = None,
):
    """Build FedSC's ``(ServerApp, ClientApp)`` pair (through :func:`dpsc.federated.make_apps`).

    ``site_settings`` maps a partition id to its site's :class:`~dpsc.federated.SiteSettings`
    (simulation); without it, each SuperNode's ``node_config`` names its settings file. A site's
    privacy and cells come from its settings, never from the run configuration
    (:mod:`._fedsc_site`, :meth:`FedSCSite.raw_cells`). With ``sink`` (a simulation in this
    process) the server also puts the global model (``"state"``), the rounds' metrics
    (``"history"``), the pooled gene scaling (``"scaling"``), the centroids and the k-means
    releases there; with no ``out-dir`` it writes no file. Sites in memory keep their labels to
    themselves (the caller labels its cells from the centroids); a deployed site writes its own
    output (:func:`write_site_output`).
    """
    require_flwr()
    from flwr.clientapp import ClientApp
    from flwr.serverapp import ServerApp

    base = run_settings("fedsc", settings or {})
    server_app, client_app = ServerApp(), ClientApp()
    server_app.main()(FedSCServer(base, sink).main)
    site = FedSCSite(base, site_settings)
    client_app.query()(site.query)
    client_app.train()(site.train)
    return server_app, client_app


class FedSCServer:
    """FedSC's server: gene scaling (optional), FedAvg rounds, the federated DP k-means, the finish."""

    def __init__(self, base: dict[str, Any], sink: dict[str, Any] | None) -> None:
        self.base, self.sink = base, sink

    def main(self, grid, context) -> None:
        """Run the whole FedSC job over the grid's sites (the ServerApp's ``main``).

        Its summary is written last (``summary.json``): the run's settings, sites and releases, or
        the reason it stopped (``"error"``), which ``dpsc federate server`` prints.
        """
        s = run_settings("fedsc", self.base, dict(context.run_config))
        check_settings(s)
        save = _fedsc_saver(self.sink, s["out-dir"])
        started, n = time.perf_counter(), int(s["n-sites"])
        run = {key: s[key] for key in ("method", "rounds", "local-epochs", "n-clusters")}
        try:
            releases = self.run(grid, s, save)
        except Exception as err:
            save(summary={**run, "n_sites": n, "error": str(err), "wall_s": time.perf_counter() - started})
            raise
        save(summary={**run, "n_sites": n, "releases": releases, "wall_s": time.perf_counter() - started})

    def run(self, grid, s: dict[str, Any], save) -> list[dict[str, int]]:
        """Scale genes (optional), train by FedAvg, cluster by federated DP k-means; return its releases."""
        from flwr.app import ArrayRecord, ConfigRecord
        from flwr.serverapp.strategy import FedAvg

        n_genes, n = _sites_and_genes(s)
        torch.manual_seed(int(s["seed"]))
        net = SSLNet(n_genes, _ssl_config(s))
        train_config = ConfigRecord({"local-epochs": int(s["local-epochs"])})
        if bool(s["scale-genes"]):
            mean, std = self.pooled_gene_statistics(grid, n)
            save(scaling=(mean, std))
            train_config["gene-mean"], train_config["gene-std"] = mean.tolist(), std.tolist()
        strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=n, min_available_nodes=n)
        result = strategy.start(
            grid=grid,
            initial_arrays=ArrayRecord(net.shared_state()),
            num_rounds=int(s["rounds"]),
            train_config=train_config,
        )
        history = {
            int(r): {k: float(v) for k, v in m.items()} for r, m in result.train_metrics_clientapp.items()
        }
        if len(history) < int(s["rounds"]):  # FedAvg goes on when every site refused or failed
            raise RuntimeError(
                f"FedSC: only {len(history)} of the {s['rounds']} training rounds had a site's reply; each "
                "site's refusal or error is in the server's run.log and in that site's own log."
            )
        save(state=result.arrays.to_torch_state_dict(), history=history)
        centroids, releases = self.federated_kmeans(grid, n, result.arrays, s, net.config.n_latent)
        save(centroids=centroids)
        self.send(grid, n, {"task": "finish"}, result.arrays, extra={"centroids": centroids})
        save(kmeans=releases)
        return releases

    @staticmethod
    def send(grid, n: int, config: dict, arrays, extra: dict | None = None) -> list:
        """One query round to every site (:func:`~._rounds.send_to_sites`); the replies, or a clear error."""
        from flwr.app import ArrayRecord, ConfigRecord, RecordDict

        payload = {"weights": arrays, "config": ConfigRecord(config)}
        if extra:
            payload["extra"] = ArrayRecord({k: torch.as_tensor(v) for k, v in extra.items()})
        replies, failed, _ = send_to_sites(grid, RecordDict(payload), "query", n, None)
        if failed:
            raise RuntimeError(f"{config['task']}: {len(failed)} site(s) refused or failed: {failed}")
        return replies

    def federated_kmeans(self, grid, n: int, arrays, s: dict, d: int):
        """Return DP k-means centroids of the sites' embedded cells (plain: full noise at each site)."""
        sigmas = json.loads(s["kmeans-noise-multipliers"]) if s["kmeans-noise-multipliers"] else [0.0]
        sigmas = sigmas * n if len(sigmas) == 1 else sigmas  # one value: every site's
        sigma_sum = float(np.sqrt(np.sum(np.square(sigmas))))
        releases: list[dict[str, int]] = []

        def release_table(assignment: Assignment):
            index = len(releases)
            config = {"task": "kmeans", "index": index, "assignment": assignment.kind}
            replies = self.send(grid, n, config, arrays, extra={"matrix": assignment.matrix})
            total = np.sum([r.content["table"]["vector"].numpy() for r in replies], axis=0)
            spec = table_release(
                assignment.n_rows, d, CLIP_NORM, KMEANS_PLAN["count_scale"], max(sigma_sum, 1e-12)
            )
            releases.append(
                {"index": index, "contributors": len(replies), "bytes_per_site": int(spec.size * 8)}
            )
            return split_table(
                spec.decode(total), assignment.n_rows, d, CLIP_NORM, KMEANS_PLAN["count_scale"]
            )

        centroids = dp_kmeans_centroids(
            release_table,
            int(s["n-clusters"]),
            d,
            noise_multiplier=sigma_sum,
            clip_norm=CLIP_NORM,
            random_state=int(s["seed"]),
            **KMEANS_PLAN,
        )
        return centroids, releases

    @staticmethod
    def pooled_gene_statistics(grid, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Ask every site for its per-gene sums; return the pooled mean and std."""
        from flwr.app import RecordDict

        replies, failed, sent = send_to_sites(grid, RecordDict({}), "query", n, None)
        if failed or len(replies) != sent:
            missing = sent - len(replies)
            raise RuntimeError(f"Gene statistics: {missing} site(s) did not reply; errors: {failed}")
        return pooled_scaling([reply.content["sums"].to_torch_state_dict() for reply in replies])


def _sites_and_genes(s: dict[str, Any]) -> tuple[int, int]:
    """Return ``(n_genes, n_sites)`` from the run configuration."""
    return int(s["n-genes"]), int(s["n-sites"])


def write_site_output(settings: Any, s: dict[str, Any], points: np.ndarray, labels: np.ndarray) -> Path:
    """Write a deployed site's embedding and labels to its own output file.

    The file its settings name (``SiteSettings.output``), never a path the server names: its cells
    with ``obsm["X_fedsc"]``, ``obs["dp_cluster"]`` and the run's settings in
    ``uns["dpsc"]["X_fedsc"]`` (what it spent is in its ledger).
    """
    import anndata as ad
    import pandas as pd

    adata = ad.read_h5ad(settings.data)
    adata.obsm["X_fedsc"] = np.asarray(points, dtype=np.float32)
    adata.obs["dp_cluster"] = pd.Categorical(np.asarray(labels).astype(str))
    run = {key: s[key] for key in ("method", "rounds", "local-epochs", "n-clusters")}
    adata.uns["dpsc"] = {"X_fedsc": {**run, "ledger": str(settings.ledger)}}
    adata.write_h5ad(settings.output)
    return Path(settings.output)


def represent_cells(matrix: Any, likelihood: str) -> np.ndarray:
    """Per-cell input representation (log1p CP10k for counts), as DP-DCAN reads it (``clean_input``)."""
    dense = matrix.toarray() if sp.issparse(matrix) else np.asarray(matrix)
    cells = clean_input(torch.as_tensor(dense, dtype=torch.float32), likelihood)
    return input_representation(cells, likelihood).numpy()


class FedSCSite:
    """FedSC's site: its local training rounds and its answers to queries, checked by its guard."""

    def __init__(self, base: dict[str, Any], site_settings: dict[int, Any] | None) -> None:
        self.base, self.site_settings = base, site_settings

    def guard(self, context, n_cells: int) -> FedSCGuard:
        """Return the site's checks, from its own settings (never from the run configuration).

        The run's state (what it accepted, served and booked) is kept by Flower for this run at this
        site (``context.state``), so every message is checked against the whole run.
        """
        settings = site_settings_from(dict(context.node_config), self.site_settings)
        records = context.state.config_records
        run = json.loads(records[RUN_STATE]["json"]) if RUN_STATE in records else {}
        return FedSCGuard(settings, n_cells, run)

    @staticmethod
    def keep(guard: FedSCGuard, context) -> None:
        """Store the run's state of ``guard`` for the next message (after what it served and booked)."""
        from flwr.app import ConfigRecord

        context.state.config_records[RUN_STATE] = ConfigRecord({"json": json.dumps(guard.run)})

    def raw_cells(self, context) -> np.ndarray:
        """Return the site's represented cells, named by its own settings only.

        In a simulation, the cells its settings hold; deployed, its own ``.h5ad``
        (``SiteSettings.data``, its ``layer``), represented as :func:`dpsc.tl.fit_federated` does
        (:func:`represent_cells`). The run configuration names no path a site reads. A value that
        is not a count reads as 0 (``dpsc.module.clean_input``, a map of each cell alone): the site
        never refuses because of what its cells hold.
        """
        settings = site_settings_from(dict(context.node_config), self.site_settings)
        if settings.in_memory:
            return resolve_shared(settings.data)
        import anndata as ad

        return represent_cells(get_matrix(ad.read_h5ad(settings.data), settings.layer), "zinb")

    def cells(self, s: dict, context) -> np.ndarray:
        """Return the site's cells as it trains on them (scaled when the run scales genes)."""
        X = self.raw_cells(context)
        if "scaling" in context.state:
            scaling = context.state["scaling"]
            X = apply_scaling(X, np.asarray(scaling["mean"]), np.asarray(scaling["std"]))
        return X

    def query(self, msg, context):
        """Answer a query: gene sums, a k-means table or the finish (the ClientApp's ``query``)."""
        from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

        s = run_settings("fedsc", self.base, dict(context.run_config))
        X = self.cells(s, context)
        guard = self.guard(context, X.shape[0])
        config = msg.content.config_records.get("config", ConfigRecord({}))
        task = str(config.get("task", "gene sums"))
        if task == "gene sums":
            guard.refuse_statistics()
            return Message(content=RecordDict({"sums": ArrayRecord(site_sums(X))}), reply_to=msg)
        net = SSLNet(X.shape[1], _ssl_config(s))
        net.load_shared(msg.content["weights"].to_torch_state_dict())
        points = embed(net, X)
        extra = msg.content["extra"].to_torch_state_dict()
        if task == "finish":
            settings = site_settings_from(dict(context.node_config), self.site_settings)
            if not settings.in_memory:  # a simulation in memory labels the cells from the centroids itself
                write_site_output(settings, s, points, nearest_centroid(points, extra["centroids"].numpy()))
            return Message(content=RecordDict({}), reply_to=msg)
        if task != "kmeans":
            raise SiteRefusal(f"Unknown request {task!r}; nothing was sent.")
        assignment = Assignment(str(config["assignment"]), extra["matrix"].numpy())
        try:
            vector = guard.kmeans_table(points, assignment, int(config["index"]), int(s["n-clusters"]))
        finally:
            self.keep(guard, context)
        return Message(
            content=RecordDict({"table": ArrayRecord({"vector": torch.as_tensor(vector)})}), reply_to=msg
        )

    def train(self, msg, context):
        """One round of local training from the global model (the ClientApp's ``train``)."""
        from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict

        torch.set_num_threads(1)
        s = run_settings("fedsc", self.base, dict(context.run_config))
        # a simulation's partition id; a deployed site has none (the server sends one σ for all)
        partition = (
            int(context.node_config["partition-id"]) if "partition-id" in context.node_config else None
        )
        config = msg.content["config"]
        X = self._scaled_for_training(self.raw_cells(context), config, context)
        net = SSLNet(X.shape[1], _ssl_config(s))
        mu = _start_from_global(net, msg.content["arrays"].to_torch_state_dict(), s, context)
        server_round, epochs = int(config["server-round"]), int(config["local-epochs"])
        seed = int(s["seed"]) * 100_003 + 1009 * (partition or 0) + server_round
        metrics = {"mu": mu, "num-examples": int(X.shape[0])}
        guard = self.guard(context, X.shape[0])
        q, per_epoch = dp_schedule(X.shape[0], int(s["batch-size"]))
        guard.start(s, partition, q, per_epoch)  # the site's own checks of the run, at its first round
        guard.check_round(server_round, epochs)
        sigma, total = float(guard.run["sigma"]), int(guard.run["steps"])
        if sigma > 0:
            dp = ClientDP(sigma, float(s["max-grad-norm"]), str(s["dp-optimizer"]), float(s["dp-lr"]))
            steps = epochs * per_epoch
            try:
                guard.book([(sigma, q, steps)], f"round {server_round}", steps / (total + KMEANS_STEPS))
            finally:
                self.keep(guard, context)
            # no loss in the reply: under DP it would be an un-noised statistic of the site's cells
            metrics["dp-steps"] = local_train_private(
                net, X, epochs, seed, dp, noise_seed=guard.settings.noise_seed
            )
        else:
            metrics["loss"] = local_train(net, X, epochs, random_state=seed)
        guard.run["served"] = server_round
        self.keep(guard, context)
        context.state["local"] = ArrayRecord(net.state_dict())
        reply = RecordDict({"arrays": ArrayRecord(net.shared_state()), "metrics": MetricRecord(metrics)})
        return Message(content=reply, reply_to=msg)

    @staticmethod
    def _scaled_for_training(X: np.ndarray, config, context) -> np.ndarray:
        """Scale the cells by the pooled gene statistics when the round sends them; remember them."""
        from flwr.app import ConfigRecord

        if "gene-mean" not in config:
            return X
        context.state["scaling"] = ConfigRecord(
            {"mean": list(config["gene-mean"]), "std": list(config["gene-std"])}
        )
        return apply_scaling(X, np.asarray(config["gene-mean"]), np.asarray(config["gene-std"]))


def _start_from_global(net: SSLNet, global_state: dict, s: dict[str, Any], context) -> float:
    """Load the round's start into ``net``; return FedSC's EMA weight μ (0 for the other methods).

    First round: the global model (and the target network from the online one). Later rounds:
    the site's own last model, whose shared part FedSC moves towards the global one by the
    divergence-aware EMA (:mod:`._ema`); the other methods take the global shared part.
    """
    from flwr.app import ConfigRecord

    if "local" not in context.state:
        net.load_shared(global_state)
        net.target.load_state_dict(net.online.state_dict())
        return 0.0
    net.load_state_dict(context.state["local"].to_torch_state_dict())
    if s["method"] != "fedsc":
        net.load_shared(global_state)
        return 0.0
    local_state = net.shared_state()
    div = divergence(global_state, local_state)
    if "fedsc" not in context.state:
        context.state["fedsc"] = ConfigRecord({"lambda": calibrate_lambda(float(s["alpha"]), div)})
    mu = ema_weight(float(context.state["fedsc"]["lambda"]), div)
    net.load_shared(divergence_aware_update(local_state, global_state, mu))
    return mu


def _fedsc_saver(sink: dict[str, Any] | None, out_dir: str):
    """Return ``save(**results)``: into ``sink`` and/or as files in ``out_dir``.

    ``sink``: a simulation in this process; ``out_dir``: ``global.pt``, ``history.json``,
    ``scaling.npz``, ``centroids.npy``, ``kmeans.json`` and, last, ``summary.json``.
    """
    if sink is None and not out_dir:
        raise ValueError("The server needs an out-dir (run configuration) to write its results to.")
    out = Path(out_dir) if out_dir else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)

    def save(**results: Any) -> None:
        if sink is not None:
            sink.update(results)
        if out is None:
            return
        for name, value in results.items():
            if name == "scaling":
                np.savez(out / "scaling.npz", mean=value[0], std=value[1])
            elif name == "state":
                torch.save(value, out / "global.pt")
            elif name == "centroids":
                np.save(out / "centroids.npy", value)
            else:  # history, kmeans, summary
                (out / f"{name}.json").write_text(json.dumps(value))

    return save


@renamed_arguments("dpsc.federated.run_federation", n_clients="n_sites")
def run_federation(
    settings: dict[str, Any],
    n_sites: int,
    n_cpus: int = 2,
    site_settings: dict[int, Any] | None = None,
) -> tuple[dict, dict]:
    """Run the apps in Flower's simulation engine (Ray backend), one SuperNode per site.

    Returns ``(global_state, history)`` where ``history`` maps round → aggregated client metrics
    (:func:`simulate_federation` returns every result of the run).
    """
    results = simulate_federation(settings, n_sites, n_cpus, site_settings)
    return results["state"], results["history"]


@renamed_arguments("dpsc.federated.simulate_federation", n_clients="n_sites")
def simulate_federation(
    settings: dict[str, Any],
    n_sites: int,
    n_cpus: int = 2,
    site_settings: dict[int, Any] | None = None,
) -> dict[str, Any]:
    """Run the apps in Flower's simulation engine and return the server's results, in memory.

    A site whose settings hold its cells gets them through Ray's object store
    (``shared``); the server hands its results back to this process:
    ``"state"`` (the global model), ``"history"`` (round → aggregated site metrics),
    ``"centroids"``, ``"kmeans"`` (the releases) and, with ``scale-genes``, ``"scaling"`` (the
    pooled gene mean and std). With an ``out-dir`` in ``settings`` the server also writes them there.
    ``n_sites``: the sites (SuperNodes) of the run.
    """
    require_flwr()
    sink: dict[str, Any] = {}
    with ray_session(n_cpus):
        if site_settings is not None:
            site_settings = {
                k: replace(v, data=shared(v.data)) if v.in_memory else v for k, v in site_settings.items()
            }
        server_app, client_app = fedsc_apps(settings, site_settings, sink)
        simulate(server_app, client_app, n_sites, n_cpus)
    if "state" not in sink:
        raise RuntimeError("The Flower run ended without a global model; see the Flower log above.")
    sink["history"] = {int(k): v for k, v in sink["history"].items()}
    return sink
