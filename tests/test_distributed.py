"""Data-parallel DP-SGD on 2 CPU processes (gloo): same mechanism, same accounting as one process.

Each test starts two processes with ``torch.multiprocessing.spawn``; every rank writes what it
saw to a JSON file that the test then compares across ranks and against one process.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

WORLD = 2
SIGMA, C, Q = 2.0, 0.5, 0.1
#: The tiny DP-DCAN fit run on two processes and on one.
FIT = {
    "epsilon": 4,
    "n_clusters": 3,
    "instance_epochs": 2,
    "cluster_epochs": 1,
    "accelerator": "cpu",
    "progress_bar": False,
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _settings(expected_batch_size: float):
    from dpsc.privacy import DPSGDSettings, NoiseSource, make_accountant

    return DPSGDSettings(
        noise_multiplier=SIGMA,
        max_grad_norm=C,
        sample_rate=Q,
        expected_batch_size=expected_batch_size,
        accountant=make_accountant("rdp"),
        noise=NoiseSource(None),
    )


def _engine_worker(rank: int, port: int, out: str) -> None:
    """Noise-only steps, then one data step with σ = 0 on rank-specific cells."""
    from dpsc.privacy import DPSGDEngine

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    torch.manual_seed(0)  # the same initial weights on both ranks
    layer = nn.Linear(2000, 10)
    batch = 16.0
    engine = DPSGDEngine([layer], torch.optim.SGD(layer.parameters(), lr=0.0), _settings(batch))
    noise_std = []
    for _ in range(3):
        engine.empty_step()
        summed = torch.cat([p.grad.flatten() for p in layer.parameters()]) * batch
        noise_std.append(float(summed.std()))
    # a noise-free step on 3 + 2 cells split across the ranks
    engine.optimizer.noise_multiplier = 0.0
    x = torch.randn(5, 2000, generator=torch.Generator().manual_seed(1)) * 0.05
    mine = x[:3] if rank == 0 else x[3:]
    engine.zero_grad()
    engine.backward(layer(mine).pow(2).sum(1))
    engine.step()
    reduced = torch.cat([p.grad.flatten() for p in layer.parameters()]) * batch
    engine.close()
    history = engine.settings.accountant.history
    Path(out, f"rank{rank}.json").write_text(
        json.dumps({"noise_std": noise_std, "reduced": reduced.tolist(), "history": history})
    )
    dist.destroy_process_group()


def _clipped_sum(x: torch.Tensor) -> torch.Tensor:
    """Reference on one process: Σ_i clip_C(∇ L_i) with one autograd call per cell."""
    torch.manual_seed(0)
    layer = nn.Linear(2000, 10)
    rows = []
    for xi in x:
        grads = torch.autograd.grad(layer(xi[None]).pow(2).sum(), list(layer.parameters()))
        g = torch.cat([t.flatten() for t in grads])
        rows.append(g * min(1.0, C / (float(g.norm()) + 1e-6)))
    return torch.stack(rows).sum(0)


def _spawn(worker, *args) -> None:
    mp.spawn(worker, args=args, nprocs=WORLD, join=True)


def test_two_processes_add_noise_once_and_sum_clipped_gradients(tmp_path):
    _spawn(_engine_worker, _free_port(), str(tmp_path))
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    # the noise of one global step has std σC in total (not σC·√2: one rank adds it)
    for std in ranks[0]["noise_std"]:
        assert std == pytest.approx(SIGMA * C, rel=0.05)
    assert ranks[0]["noise_std"] == ranks[1]["noise_std"], "every rank holds the same noisy gradient"
    # with σ = 0 the reduced gradient is the single-process sum of clipped per-cell gradients
    x = torch.randn(5, 2000, generator=torch.Generator().manual_seed(1)) * 0.05
    expected = _clipped_sum(x)
    for r in ranks:
        np.testing.assert_allclose(r["reduced"], expected.numpy(), rtol=1e-4, atol=1e-6)
    # each rank's accountant holds the steps of one process: 4 steps at (σ, q)
    for r in ranks:
        assert r["history"] == [[SIGMA, Q, 3], [0.0, Q, 1]] or r["history"] == [[SIGMA, Q, 4]]


def _cells(n_cells: int):
    """Simulated cells (the same on every rank), genes with counts only."""
    import dpsc

    adata = dpsc.datasets.simulate(n_cells, random_state=0, n_jobs=1)
    return adata[:, np.asarray(adata.X.sum(0)).ravel() > 0].copy()


def _fit_worker(rank: int, port: int, out: str, n_cells: int, scope: str) -> None:
    """``tl.fit`` with Lightning's DDP strategy, processes launched outside Lightning."""
    import warnings

    import dpsc

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(rank), NODE_RANK="0")
    torch.set_num_threads(1)
    adata = _cells(n_cells)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = dpsc.tl.fit(adata, **FIT, scope=scope, devices=WORLD, strategy="ddp", return_model=True)
    record = dpsc.privacy.get_record(adata, "X_dpdcan")
    weights = torch.cat([p.detach().flatten() for p in model.module.parameters()])
    Path(out, f"fit{rank}.json").write_text(
        json.dumps(
            {
                "record": {k: record[k] for k in ("epsilon", "noise_multiplier", "sample_rate", "steps")},
                "weights": weights.tolist(),
                "loadings": model.module.input_loadings.flatten().tolist() if scope != "paper" else [],
                "labels": adata.obs["dp_cluster"].astype(str).tolist(),
                "params": {k: str(v) for k, v in adata.uns["dpsc"]["X_dpdcan"]["params"].items()},
            }
        )
    )


def test_a_data_parallel_fit_not_launched_together_is_refused_before_anything_is_booked(monkeypatch):
    import dpsc

    monkeypatch.delenv("LOCAL_RANK", raising=False)
    adata = _cells(200)
    with pytest.raises(ValueError, match="torchrun --nproc-per-node 2"):
        dpsc.tl.fit(adata, **FIT, devices=2, strategy="ddp")
    assert dpsc.privacy.ledger_frame(adata).empty and "X_dpdcan" not in adata.obsm


def test_processes_of_one_group_draw_alike_and_sample_apart(tmp_path):
    _spawn(_noise_worker, _free_port(), str(tmp_path))
    ranks = [json.loads((tmp_path / f"noise{r}.json").read_text()) for r in range(WORLD)]
    assert ranks[0]["release"] == ranks[1]["release"]  # one release, drawn alike
    assert ranks[0]["sample"] != ranks[1]["sample"]  # each rank's own Poisson stream


def _noise_worker(rank: int, port: int, out: str) -> None:
    from dpsc.privacy import shared_noise_source

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    noise = shared_noise_source()
    draws = {
        "release": noise.stream("tl.fit.choice").standard_normal(8).tolist(),
        "sample": noise.stream("sampling", rank).uniform(8).tolist(),
    }
    Path(out, f"noise{rank}.json").write_text(json.dumps(draws))
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("scope", ["encoder", "paper"])
def test_ddp_fit_matches_one_process_accounting(tmp_path, scope):
    import dpsc

    n_cells = 400
    _spawn(_fit_worker, _free_port(), str(tmp_path), n_cells, scope)
    ranks = [json.loads((tmp_path / f"fit{r}.json").read_text()) for r in range(WORLD)]
    np.testing.assert_array_equal(ranks[0]["weights"], ranks[1]["weights"])
    # the proven scopes' input loadings are one release (rank 0's), not one per process
    np.testing.assert_array_equal(ranks[0]["loadings"], ranks[1]["loadings"])
    # every release made outside DP-SGD (the start, the partition choice) is one draw, alike on
    # each process: each process writes the same labels and the same choice
    assert ranks[0]["labels"] == ranks[1]["labels"] and ranks[0]["params"] == ranks[1]["params"]
    assert (scope != "paper") == (len(ranks[0]["loadings"]) > 0)
    adata = _cells(n_cells)
    dpsc.tl.fit(adata, **FIT, scope=scope)
    single = dpsc.privacy.get_record(adata, "X_dpdcan")
    for r in ranks:
        got = r["record"]
        assert got["steps"] == single["steps"]
        assert got["noise_multiplier"] == pytest.approx(single["noise_multiplier"])
        assert got["sample_rate"] == pytest.approx(single["sample_rate"])
        assert got["epsilon"] == pytest.approx(single["epsilon"])
