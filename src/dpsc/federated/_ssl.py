r"""Self-supervised networks and per-cell losses of FedSC and its baselines (Mo et al., §3).

All methods see two randomly masked views :math:`v_1, v_2` of the same cell. The losses are
computed per cell except where a method needs negatives (SimCLR, MoCo), which by construction
compare a cell with the other cells of its batch.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .._api import renamed_arguments

#: FedSC and its self-supervised peers (``method=`` of :func:`dpsc.tl.fit_federated`).
METHODS = ("fedsc", "fedbyol", "fedsimsiam", "fedsimclr", "fedmoco", "fedmocov2")
#: The methods whose loss has no cross-cell term, so that per-cell DP-SGD applies (``epsilon=``).
PER_CELL_METHODS = ("fedsc", "fedbyol", "fedsimsiam")


@dataclass(frozen=True)
class SSLConfig:
    """Hyper-parameters of local training (defaults: the paper's, except the rounds)."""

    method: str = "fedsc"
    hidden: tuple[int, ...] = (200, 40)
    n_latent: int = 60
    lr: float = 0.032
    momentum: float = 0.5
    weight_decay: float = 5e-4
    batch_size: int = 128
    mask_rate: float = 0.2
    tau: float = 0.99  # EMA rate of the target / momentum encoder
    temperature: float = 0.2  # SimCLR / MoCo


def _mlp(n_in: int, hidden: tuple[int, ...], n_out: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    sizes = [n_in, *hidden]
    for a, b in itertools.pairwise(sizes):
        layers += [nn.Linear(a, b), nn.ReLU()]
    layers.append(nn.Linear(sizes[-1], n_out))
    return nn.Sequential(*layers)


class SSLNet(nn.Module):
    """Online encoder, predictor, and (for BYOL/FedSC/MoCo) a momentum target encoder.

    Encoder: ``n_genes → 200 → 40 → 60`` (the paper's three linear layers with ReLU between);
    predictor: one linear layer ``60 → 60``. Only ``online`` and ``predictor`` travel to the
    server (:meth:`shared_state`); the target encoder stays at the site.
    """

    def __init__(self, n_genes: int, config: SSLConfig) -> None:
        super().__init__()
        if config.method not in METHODS:
            raise ValueError(f"Unknown method {config.method!r}; choose one of {METHODS}.")
        self.config = config
        self.online = _mlp(n_genes, config.hidden, config.n_latent)
        self.predictor = nn.Linear(config.n_latent, config.n_latent)
        self.target = copy.deepcopy(self.online)
        for p in self.target.parameters():
            p.requires_grad_(False)

    def shared_state(self) -> dict[str, torch.Tensor]:
        """Parameters the server averages: online encoder and predictor."""
        return {k: v.detach().clone() for k, v in self.state_dict().items() if not k.startswith("target.")}

    def load_shared(self, state: dict[str, torch.Tensor]) -> None:
        """Overwrite online encoder and predictor with ``state``."""
        missing = self.load_state_dict(state, strict=False)
        if missing.unexpected_keys:
            raise ValueError(f"Unexpected keys in the global model: {missing.unexpected_keys}")

    @torch.no_grad()
    def update_target(self) -> None:
        r"""EMA target: :math:`\xi \leftarrow \tau\xi + (1-\tau)\theta`."""
        for t, o in zip(self.target.parameters(), self.online.parameters(), strict=True):
            t.mul_(self.config.tau).add_(o.detach(), alpha=1 - self.config.tau)

    def per_cell_loss(self, v1: torch.Tensor, v2: torch.Tensor) -> torch.Tensor:
        """Loss of each cell, ``(B,)``, for the methods without negatives (:data:`PER_CELL_METHODS`).

        Cell ``i``'s term depends only on its own two views, so per-sample gradients are really
        per cell (the target encoder is a no-grad copy and adds no coupling). Both views go through
        the online encoder and predictor as one ``(cells, 2, genes)`` tensor, so each module sees
        each cell once (what Opacus's ghost clipping needs; its per-cell norm covers both views).
        """
        m = self.config.method
        if m not in PER_CELL_METHODS:
            raise ValueError(f"method={m!r} compares cells within a batch; it has no per-cell loss.")
        z = self.online(torch.stack([v1, v2], dim=1))
        p = self.predictor(z)
        z1, z2, p1, p2 = z[:, 0], z[:, 1], p[:, 0], p[:, 1]
        if m == "fedsimsiam":
            return (byol_loss(p1, z2.detach()) + byol_loss(p2, z1.detach())) / 2
        with torch.no_grad():
            t1, t2 = self.target(v1), self.target(v2)
        return byol_loss(p1, t2) + byol_loss(p2, t1)

    def loss(self, v1: torch.Tensor, v2: torch.Tensor) -> torch.Tensor:
        """Mean over cells of the method's symmetrised loss for views ``v1``, ``v2``."""
        m = self.config.method
        z1, z2 = self.online(v1), self.online(v2)
        if m in ("fedsc", "fedbyol"):
            p1, p2 = self.predictor(z1), self.predictor(z2)
            with torch.no_grad():
                t1, t2 = self.target(v1), self.target(v2)
            return (byol_loss(p1, t2) + byol_loss(p2, t1)).mean()
        if m == "fedsimsiam":
            p1, p2 = self.predictor(z1), self.predictor(z2)
            return (byol_loss(p1, z2.detach()) + byol_loss(p2, z1.detach())).mean() / 2
        if m == "fedsimclr":
            return nt_xent(z1, z2, self.config.temperature)
        q1, q2 = (self.predictor(z1), self.predictor(z2)) if m == "fedmocov2" else (z1, z2)
        with torch.no_grad():
            k1, k2 = self.target(v1), self.target(v2)
        return (info_nce(q1, k2, self.config.temperature) + info_nce(q2, k1, self.config.temperature)) / 2


def byol_loss(p: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    r"""Per-cell BYOL loss :math:`2 - 2\cos(p, z)` (Mo et al., Eq. 1)."""
    return 2 - 2 * F.cosine_similarity(p, z, dim=-1)


def nt_xent(z1: torch.Tensor, z2: torch.Tensor, temperature: float) -> torch.Tensor:
    """SimCLR's NT-Xent over the ``2B`` views of a batch (negatives: the other cells)."""
    z = F.normalize(torch.cat([z1, z2]), dim=-1)
    sim = z @ z.T / temperature
    sim.fill_diagonal_(float("-inf"))
    n = z1.shape[0]
    targets = torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)])
    return F.cross_entropy(sim, targets)


def info_nce(q: torch.Tensor, k: torch.Tensor, temperature: float) -> torch.Tensor:
    """MoCo's InfoNCE with the momentum keys of the *batch* as negatives (no queue)."""
    logits = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).T / temperature
    return F.cross_entropy(logits, torch.arange(q.shape[0]))


def masked_view(x: torch.Tensor, rate: float, generator: torch.Generator) -> torch.Tensor:
    """Zero each entry independently with probability ``rate``."""
    return x * (torch.rand(x.shape, generator=generator) >= rate)


@renamed_arguments("dpsc.federated.local_train", seed="random_state")
def local_train(net: SSLNet, X: np.ndarray, epochs: int, random_state: int = 0) -> float:
    """Train ``net`` for ``epochs`` passes over the site's cells; return the mean loss of the last pass.

    ``random_state`` seeds the batches and masks.
    """
    cfg = net.config
    opt = torch.optim.SGD(
        [p for p in net.parameters() if p.requires_grad],
        lr=cfg.lr,
        momentum=cfg.momentum,
        weight_decay=cfg.weight_decay,
    )
    gen = torch.Generator().manual_seed(random_state)
    data = torch.as_tensor(X, dtype=torch.float32)
    n = data.shape[0]
    net.train()
    last = float("nan")
    for _ in range(epochs):
        order = torch.randperm(n, generator=gen)
        losses = []
        for start in range(0, n, cfg.batch_size):
            batch = data[order[start : start + cfg.batch_size]]
            if batch.shape[0] < 2:
                continue
            loss = net.loss(masked_view(batch, cfg.mask_rate, gen), masked_view(batch, cfg.mask_rate, gen))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if cfg.method != "fedsimsiam" and cfg.method != "fedsimclr":
                net.update_target()
            losses.append(float(loss.detach()))
        last = float(np.mean(losses)) if losses else last
    return last


@dataclass(frozen=True)
class ClientDP:
    """DP-SGD settings of one site: noise multiplier σ, clipping norm C, update rule, lr, accountant."""

    noise_multiplier: float
    max_grad_norm: float = 1.0
    optimizer: str = "sgd"
    lr: float = 0.032
    accountant: str = "rdp"


def dp_schedule(n_cells: int, batch_size: int) -> tuple[float, int]:
    """Poisson rate ``q = min(1, B/n)`` and steps per local epoch ``⌈1/q⌉`` of a site."""
    q = min(1.0, batch_size / n_cells)
    return q, int(np.ceil(1.0 / q))


def local_train_private(
    net: SSLNet, X: np.ndarray, epochs: int, seed: int, dp: ClientDP, noise_seed: int | None = None
) -> int:
    r"""DP-SGD local training of the online encoder and predictor; returns the steps taken.

    Each step draws a Poisson batch (every cell independently with probability ``q``, from the
    site's own secret sampling stream), computes the per-cell losses
    (:meth:`SSLNet.per_cell_loss`), and lets :class:`~dpsc.privacy.DPSGDEngine` clip each cell's
    gradient to ``C`` and add :math:`N(0, σ^2C^2)` before the update rule
    (:func:`dpsc.optim.make_optimizer`). An empty batch still takes a pure-noise step, as the
    accountant assumes. The EMA target encoder follows the (already private) online weights:
    post-processing. ``seed`` drives the masks only; the noise and the samples come from the
    site's own :class:`~dpsc.privacy.NoiseSource` (secret unless ``noise_seed``), never from a
    value the server sends. No loss is returned: an exact mean loss is an un-noised statistic of
    the site's cells.
    """
    from ..optim import make_optimizer
    from ..privacy import DPSGDEngine, DPSGDSettings, NoiseSource, poisson_steps

    cfg = net.config
    data = torch.as_tensor(X, dtype=torch.float32)
    n = data.shape[0]
    q, steps_per_epoch = dp_schedule(n, cfg.batch_size)
    mask_gen = torch.Generator().manual_seed(seed)
    settings = DPSGDSettings.from_sigma(
        n_obs=n,
        sample_rate=q,
        noise_multiplier=dp.noise_multiplier,
        max_grad_norm=dp.max_grad_norm,
        accountant=dp.accountant,
        noise=NoiseSource(noise_seed),
    )
    private = [net.online, net.predictor]
    params = [p for m in private for p in m.parameters() if p.requires_grad]
    engine = DPSGDEngine(private, make_optimizer(dp.optimizer, params, dp.lr), settings)
    net.train()

    def per_cell_loss(indices: torch.Tensor) -> torch.Tensor:
        batch = data[indices]
        return net.per_cell_loss(
            masked_view(batch, cfg.mask_rate, mask_gen), masked_view(batch, cfg.mask_rate, mask_gen)
        )

    after = None if cfg.method == "fedsimsiam" else net.update_target
    try:
        return poisson_steps(engine, n, epochs * steps_per_epoch, per_cell_loss, after_step=after)
    finally:
        engine.close()


@torch.no_grad()
def embed(net: SSLNet, X: np.ndarray, batch_size: int = 1024) -> np.ndarray:
    """Online-encoder embeddings of ``X`` (cells × genes, already represented)."""
    net.eval()
    data = torch.as_tensor(X, dtype=torch.float32)
    return torch.cat([net.online(data[i : i + batch_size]) for i in range(0, len(data), batch_size)]).numpy()
