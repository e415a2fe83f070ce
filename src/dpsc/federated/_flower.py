"""Flower ``ServerApp`` / ``ClientApp`` of FedSC (Message API) and the simulation launcher.

The apps read their settings from a dict given to :func:`make_apps`, overridden by Flower's
``run_config``; each site reads its cells from ``{data-dir}/client_{partition-id}.npy``. The
same apps therefore run in Flower's simulation engine (:func:`run_federation`) and in a real
deployment (``flwr run`` with one SuperNode per site; see the docs).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ._ema import calibrate_lambda, divergence, divergence_aware_update, ema_weight
from ._scaling import apply_scaling, pooled_scaling, site_sums
from ._ssl import ClientDP, SSLConfig, SSLNet, local_train, local_train_private

DEFAULTS: dict[str, Any] = {
    "method": "fedsc",
    "rounds": 250,
    "local-epochs": 1,
    "alpha": 0.7,
    "seed": 0,
    "data-dir": "",
    "out-dir": "",
    "lr": 0.032,
    "batch-size": 128,
    "mask-rate": 0.2,
    # one "query" round first: sites send per-gene sums, all z-score with the pooled statistics
    # (off for the bare apps; dpsc.tl.fit_federated turns it on unless the sites train with DP)
    "scale-genes": False,
    # client-level DP (off when "noise-multipliers" is empty): JSON list of σ per partition-id
    "noise-multipliers": "",
    "max-grad-norm": 1.0,
    # -1: every site seeds its DP noise and sampling from OS entropy (the server never sets it);
    # >= 0: an opt-in for tests and benchmarks, the guarantee then does not hold against its holder
    "noise-seed": -1,
    "dp-optimizer": "sgd",
    "dp-lr": 0.032,
}


def require_flwr() -> None:
    """Raise a clear error when Flower is not installed."""
    try:
        import flwr  # noqa: F401
    except ImportError as err:
        raise ImportError(
            "Federated training runs on Flower, which is not installed: pip install 'dpsc[federated]'."
        ) from err


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


def make_apps(settings: dict[str, Any]):
    """Build the ``(ServerApp, ClientApp)`` pair for the given settings."""
    require_flwr()
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg

    base = {**DEFAULTS, **settings}
    server_app, client_app = ServerApp(), ClientApp()

    @server_app.main()
    def server_main(grid: Grid, context: Context) -> None:
        s = {**base, **dict(context.run_config)}
        check_settings(s)
        meta = json.loads((Path(s["data-dir"]) / "meta.json").read_text())
        torch.manual_seed(int(s["seed"]))
        net = SSLNet(int(meta["n_genes"]), _ssl_config(s))
        n = int(meta["n_clients"])
        out = Path(s["out-dir"])
        out.mkdir(parents=True, exist_ok=True)
        train_config = ConfigRecord({"local-epochs": int(s["local-epochs"])})
        if bool(s["scale-genes"]):
            mean, std = _pooled_gene_statistics(grid, n)
            np.savez(out / "scaling.npz", mean=mean, std=std)
            train_config["gene-mean"], train_config["gene-std"] = mean.tolist(), std.tolist()
        strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=n, min_available_nodes=n)
        result = strategy.start(
            grid=grid,
            initial_arrays=ArrayRecord(net.shared_state()),
            num_rounds=int(s["rounds"]),
            train_config=train_config,
        )
        torch.save(result.arrays.to_torch_state_dict(), out / "global.pt")
        history = {
            int(r): {k: float(v) for k, v in m.items()} for r, m in result.train_metrics_clientapp.items()
        }
        (out / "history.json").write_text(json.dumps(history))

    def _pooled_gene_statistics(grid: Grid, n: int) -> tuple[np.ndarray, np.ndarray]:
        while len(nodes := list(grid.get_node_ids())) < n:  # SuperNodes register asynchronously
            time.sleep(0.1)
        queries = [Message(content=RecordDict({}), dst_node_id=node, message_type="query") for node in nodes]
        replies = list(grid.send_and_receive(queries))
        failed = [reply.error for reply in replies if reply.has_error()]
        if failed or len(replies) != len(nodes):
            missing = len(nodes) - len(replies)
            raise RuntimeError(f"Gene statistics: {missing} site(s) did not reply; errors: {failed}")
        return pooled_scaling([reply.content["sums"].to_torch_state_dict() for reply in replies])

    @client_app.query()
    def client_sums(msg: Message, context: Context) -> Message:
        s = {**base, **dict(context.run_config)}
        X = np.load(Path(s["data-dir"]) / f"client_{int(context.node_config['partition-id'])}.npy")
        return Message(content=RecordDict({"sums": ArrayRecord(site_sums(X))}), reply_to=msg)

    @client_app.train()
    def client_train(msg: Message, context: Context) -> Message:
        torch.set_num_threads(1)
        s = {**base, **dict(context.run_config)}
        pid = int(context.node_config["partition-id"])
        X = np.load(Path(s["data-dir"]) / f"client_{pid}.npy")
        config = msg.content["config"]
        if "gene-mean" in config:
            X = apply_scaling(X, np.asarray(config["gene-mean"]), np.asarray(config["gene-std"]))
        server_round = int(config["server-round"])
        net = SSLNet(X.shape[1], _ssl_config(s))
        global_state = msg.content["arrays"].to_torch_state_dict()
        mu = 0.0
        if "local" in context.state:
            net.load_state_dict(context.state["local"].to_torch_state_dict())
            local_state = net.shared_state()
            if s["method"] == "fedsc":
                div = divergence(global_state, local_state)
                if "fedsc" not in context.state:
                    lam = calibrate_lambda(float(s["alpha"]), div)
                    context.state["fedsc"] = ConfigRecord({"lambda": lam})
                mu = ema_weight(float(context.state["fedsc"]["lambda"]), div)
                net.load_shared(divergence_aware_update(local_state, global_state, mu))
            else:
                net.load_shared(global_state)
        else:
            net.load_shared(global_state)
            net.target.load_state_dict(net.online.state_dict())
        epochs = int(config["local-epochs"])
        seed = int(s["seed"]) * 100_003 + 1009 * pid + server_round
        metrics = {"mu": mu, "num-examples": int(X.shape[0])}
        if s["noise-multipliers"]:
            sigma = float(json.loads(s["noise-multipliers"])[pid])
            dp = ClientDP(sigma, float(s["max-grad-norm"]), str(s["dp-optimizer"]), float(s["dp-lr"]))
            noise_seed = int(s["noise-seed"])
            site_seed = None if noise_seed < 0 else noise_seed * 100_003 + 1009 * pid + server_round
            # no loss in the reply: under DP it would be an un-noised statistic of the site's cells
            metrics["dp-steps"] = local_train_private(net, X, epochs, seed, dp, noise_seed=site_seed)
        else:
            metrics["loss"] = local_train(net, X, epochs, seed=seed)
        context.state["local"] = ArrayRecord(net.state_dict())
        reply = RecordDict({"arrays": ArrayRecord(net.shared_state()), "metrics": MetricRecord(metrics)})
        return Message(content=reply, reply_to=msg)

    return server_app, client_app


def write_client_data(data_dir: Path, parts: list[np.ndarray]) -> None:
    """Write each site's represented cells and a ``meta.json`` for the apps."""
    data_dir.mkdir(parents=True, exist_ok=True)
    for i, X in enumerate(parts):
        np.save(data_dir / f"client_{i}.npy", X.astype(np.float32))
    meta = {"n_clients": len(parts), "n_genes": int(parts[0].shape[1])}
    (data_dir / "meta.json").write_text(json.dumps(meta))


def run_federation(settings: dict[str, Any], n_clients: int, n_cpus: int = 2) -> tuple[dict, dict]:
    """Run the apps in Flower's simulation engine (Ray backend), one SuperNode per site.

    Returns ``(global_state, history)`` where ``history`` maps round → aggregated client metrics.
    """
    require_flwr()
    import logging

    from flwr.simulation import run_simulation

    server_app, client_app = make_apps(settings)
    flwr_logger = logging.getLogger("flwr")
    level = flwr_logger.level
    flwr_logger.setLevel(logging.WARNING)  # Flower logs every round at INFO
    try:
        run_simulation(
            server_app=server_app,
            client_app=client_app,
            num_supernodes=n_clients,
            backend_config={
                "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                "init_args": {"num_cpus": n_cpus, "include_dashboard": False, "log_to_driver": False},
            },
        )
    finally:
        flwr_logger.setLevel(level)
    out = Path(settings["out-dir"])
    if not (out / "global.pt").exists():
        raise RuntimeError("The Flower run ended without a global model; see the Flower log above.")
    state = torch.load(out / "global.pt", weights_only=True)
    history = {int(k): v for k, v in json.loads((out / "history.json").read_text()).items()}
    return state, history


def read_scaling(out_dir: str | Path) -> tuple[np.ndarray, np.ndarray] | None:
    """Return the pooled gene ``(mean, std)`` a run with ``scale-genes`` saved, else ``None``."""
    path = Path(out_dir) / "scaling.npz"
    if not path.exists():
        return None
    with np.load(path) as saved:
        return saved["mean"], saved["std"]
