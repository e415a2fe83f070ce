"""The DCAN torch module: encoder, ZINB decoder, Student-t clustering layer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from scvi import REGISTRY_KEYS
from scvi.distributions import ZeroInflatedNegativeBinomial
from scvi.module.base import BaseModuleClass, LossOutput, auto_move_data
from torch import nn

from ._clustering import CentroidDistance
from ._losses import (
    dec_kl_per_cell,
    gaussian_nll_per_cell,
    instance_loss_per_cell,
    per_cell_target,
    separation_loss,
    student_t_assignment,
    zinb_nll_per_cell,
)
from ._networks import mlp

Likelihood = Literal["zinb", "gaussian"]
TARGET_SUM = 1e4


DEFAULT_LATENT_SCALE = 3.0  # radius of the latent sphere


def clean_input(x: torch.Tensor, likelihood: Likelihood) -> torch.Tensor:
    """Each cell's row as the model reads it: non-finite values, and negative counts, read as 0.

    A map of each cell alone, so a DP fit never has to look at the values to refuse them.
    """
    x = torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)
    return x.clamp(min=0.0) if likelihood == "zinb" else x


def input_representation(x: torch.Tensor, likelihood: Likelihood) -> torch.Tensor:
    r"""Compute what the encoder sees, from each cell alone.

    For counts (``likelihood="zinb"``): :math:`\log(1 + 10^4\, x_{ig} / \sum_{g'} x_{ig'})`.
    No gene-wise centring or scaling, which would need statistics of the whole (private) data
    set; the reference scripts' z-scoring did not help DP-DCAN even with exact statistics
    (docs, Benchmarks: "Gene z-scoring of DP-DCAN's input"). For non-count data (``"gaussian"``) the
    values are used as given.
    """
    if likelihood == "gaussian":
        return x
    library = x.sum(-1, keepdim=True).clamp(min=1.0)
    return torch.log1p(x / library * TARGET_SUM)


def mask_views(
    rep: torch.Tensor, n_views: int, rate: float, generator: torch.Generator | None
) -> torch.Tensor:
    r"""Random masking augmentation: ``n_views`` copies with each entry zeroed w.p. ``rate``.

    Returns ``(n_cells, n_views, n_genes)``; the masks are drawn independently for every cell.
    The masks are drawn on the generator's device (CPU for ``torch.Generator()``) and moved to
    ``rep``'s device, so a seeded fit draws the same masks on CPU and GPU.
    """
    shape = (rep.shape[0], n_views, rep.shape[1])
    draw_device = generator.device if generator is not None else rep.device
    keep = torch.rand(shape, generator=generator, device=draw_device) >= rate
    return rep.unsqueeze(1) * keep.to(rep.device)


class DCANModule(BaseModuleClass):
    r"""Deep contrastive autoencoder with a ZINB decoder and a Student-t clustering layer.

    Parameters
    ----------
    n_input
        Number of genes :math:`G`.
    n_clusters
        Number of clusters :math:`K`.
    n_latent
        Latent dimension.
    n_hidden
        Hidden widths of the encoder (mirrored in the decoder); the default gives the
        2000→256→64→32 encoder of DP-DCAN.
    likelihood
        ``"zinb"`` for raw counts, ``"gaussian"`` for log-normalised or other continuous data.
    alpha
        Degrees of freedom of the Student-t kernel.
    latent_scale
        If set, latents are projected onto the sphere of this radius,
        :math:`z = s\, h / \lVert h \rVert_2`. This bounds every latent point by construction
        (so the DP k-means needs no data-dependent clipping radius: :math:`\lVert z - c \rVert
        \le 2s`) and keeps the latent scale fixed while DP noise inflates the weights.
        ``None`` keeps the raw linear output.
    input_pcs
        If set, the encoder reads each cell's projection on ``input_pcs`` frozen loadings instead
        of its genes (:meth:`represent`), and the decoder reconstructs that projection (Gaussian
        loss) instead of the counts: the first encoder layer and the gene-wide decoder heads, most
        of the parameters, are replaced by a fixed map. The loadings are a buffer
        (``input_loadings``, genes × ``input_pcs``), zero until
        :meth:`set_input_loadings`; the model fills it with a DP release
        (:meth:`dpsc.model.DPDCAN.train`).
    residual
        If true, the encoder is the input plus a learned correction,
        :math:`h = E\,r + f(r)`, with :math:`E` the fixed map that puts the input's coordinates
        into the first latent coordinates (zero-padded or truncated) and :math:`f`'s last layer
        zero at initialisation, and the latent keeps its length inside the ball of radius
        :math:`s`: :math:`z = s\,h / \max(1, \lVert h\rVert_2)`. An encoder reading DP
        components then reads each cell's projection :math:`V^\top u_i` itself (norm at most 1,
        not scaled to norm 1), so the untrained latent is :math:`s\,V^\top u_i`: the
        clustering's embedding of the cell with its length, which separates types that the unit
        sphere merges. The clusters are read on the sphere, from each latent's direction
        (:meth:`assignment_space`), as the clustering's cosine k-means partitioned the
        directions; an encoder reading points of a public basis (``input_pcs=None``, the
        reference's clustering: Euclidean k-means in the ball) reads them from the latent itself.
        Public: :math:`E` and the initial weights depend on no cell, and every point
        stays within radius :math:`s` (the DP k-means' bound). When the loadings carry fixed
        coordinate weights :math:`w` (:meth:`set_input_loadings`: the clustering's weight of the
        mean coordinate), the latent is written back in the unweighted coordinates,
        :math:`z = s\,h / \max(1, \lVert h\rVert_2) \oslash w` (``latent_weights``), so the
        untrained latent is :math:`s` times the clustering's embedding ``X_dp_cluster``; the
        clusters are read from :math:`z \odot w`, the clustering's k-means points.
    """

    def __init__(
        self,
        n_input: int,
        n_clusters: int = 8,
        n_latent: int = 32,
        n_hidden: Sequence[int] = (256, 64),
        likelihood: Likelihood = "zinb",
        alpha: float = 1.0,
        latent_scale: float | None = DEFAULT_LATENT_SCALE,
        input_pcs: int | None = None,
        residual: bool = False,
    ):
        super().__init__()
        self.input_pcs = input_pcs
        self.residual = residual
        n_features = n_input if input_pcs is None else input_pcs
        if input_pcs is not None:
            self.register_buffer("input_loadings", torch.zeros(n_input, input_pcs))
        self.latent_scale = latent_scale
        self.n_input = n_input
        self.n_latent = n_latent
        self.n_clusters = n_clusters
        self.likelihood = likelihood
        self.alpha = alpha
        hidden = list(n_hidden)
        self.encoder = mlp([n_features, *hidden, n_latent], last_activation=False)
        if residual:
            self.register_buffer("input_to_latent", torch.eye(n_features, n_latent))
            self.register_buffer("latent_weights", torch.ones(n_latent))
            nn.init.zeros_(self.encoder[-1].weight)
            nn.init.zeros_(self.encoder[-1].bias)
        self.decoder = mlp([n_latent, *reversed(hidden)], last_activation=True)
        width = hidden[0]
        self.px_scale = nn.Linear(width, n_features)
        if self.reconstructs_counts:
            self.px_r = nn.Linear(width, n_input)
            self.px_dropout = nn.Linear(width, n_input)
        self.clustering = CentroidDistance(n_clusters, n_latent)

    # -- building blocks -------------------------------------------------------------------
    @property
    def reconstructs_counts(self) -> bool:
        """True when the decoder models the counts (ZINB); else it reconstructs :meth:`represent`."""
        return self.likelihood == "zinb" and self.input_pcs is None

    @torch.no_grad()
    def set_input_loadings(self, loadings: torch.Tensor, weights: torch.Tensor | None = None) -> None:
        """Fix the loadings the encoder reads through (genes × ``input_pcs``).

        ``weights``: fixed public weights of the loadings' columns (the encoder reads
        ``loadings * weights``); a residual latent is written back in the unweighted coordinates
        (class docstring).
        """
        if self.input_pcs is None:
            raise RuntimeError("This module reads genes (input_pcs=None); it has no input loadings.")
        loadings = torch.as_tensor(loadings, dtype=self.input_loadings.dtype)
        if weights is None:
            self.input_loadings.copy_(loadings)
            return
        weights = torch.as_tensor(weights, dtype=loadings.dtype)
        self.input_loadings.copy_(loadings * weights)
        if self.residual:
            shared = min(len(weights), self.n_latent)  # E puts input coordinate j at latent j
            self.latent_weights[:shared] = weights[:shared]

    def public_decoder_modules(self) -> list[nn.Module]:
        """Modules that map the latent space back to its input (the part never shared)."""
        heads = [self.decoder, self.px_scale]
        if self.reconstructs_counts:
            heads += [self.px_r, self.px_dropout]
        return heads

    def encode(self, rep: torch.Tensor) -> torch.Tensor:
        """Return the latent of an input representation (any leading shape).

        On the sphere of radius ``latent_scale`` (a residual encoder: in its ball), if set.
        """
        h = self.encoder(rep)
        if self.residual:
            h = h + rep @ self.input_to_latent
            if self.latent_scale is not None:
                h = self.latent_scale * h / h.norm(dim=-1, keepdim=True).clamp(min=1.0)
            return h / self.latent_weights
        if self.latent_scale is None:
            return h
        return self.latent_scale * F.normalize(h, dim=-1)

    def assignment_space(self, z: torch.Tensor) -> torch.Tensor:
        """Return where the clusters are read from a latent.

        A residual encoder reading DP components: its latent direction on the sphere (cosine, as
        the clustering partitioned its points); the latent itself otherwise (the Euclidean k-means
        of a public basis' points).
        """
        if not self.residual or self.input_pcs is None:
            return z
        z = z * self.latent_weights
        return z if self.latent_scale is None else self.latent_scale * F.normalize(z, dim=-1)

    def represent(self, x: torch.Tensor) -> torch.Tensor:
        r"""Per-cell input representation (see :func:`input_representation`).

        With ``input_pcs``: :math:`y_i = V^\top u_i`, where :math:`u_i` is that representation
        scaled to norm 1 and :math:`V` the frozen loadings, so :math:`\lVert y_i\rVert \le 1`; a
        plain encoder reads :math:`y_i / \lVert y_i\rVert_2` (the cosine geometry of
        :func:`dpsc.tl.kmeans`), a residual one :math:`y_i` itself. A function of cell :math:`i`
        and :math:`V` only, so per-cell gradients stay per cell.
        """
        rep = input_representation(x, self.likelihood)
        if self.input_pcs is None:
            return rep
        projection = F.normalize(rep, dim=-1) @ self.input_loadings
        return projection if self.residual else F.normalize(projection, dim=-1)

    def clustering_points(self, rep: torch.Tensor) -> torch.Tensor:
        """Return the points the start clustering partitioned, from :meth:`represent`'s.

        At norm 1 when the encoder reads DP components (the clustering's cosine k-means points).
        """
        return F.normalize(rep, dim=-1) if self.input_pcs is not None else rep

    def reconstruction_per_cell(self, x: torch.Tensor, rep: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """Reconstruction loss of each cell from its latent.

        ZINB of the counts ``x``, or Gaussian of the representation ``rep`` (non-count data, or
        ``input_pcs``).
        """
        h = self.decoder(z)
        if not self.reconstructs_counts:
            return gaussian_nll_per_cell(rep, self.px_scale(h))
        library = x.sum(-1, keepdim=True)
        mu = torch.softmax(self.px_scale(h), dim=-1) * library
        theta = torch.exp(self.px_r(h).clamp(-12.0, 12.0))
        return zinb_nll_per_cell(x, mu, theta, self.px_dropout(h))

    def soft_assignment(self, z: torch.Tensor) -> torch.Tensor:
        """Student-t soft assignment ``q`` of each latent point to the centroids."""
        return student_t_assignment(self.clustering(self.assignment_space(z)), self.alpha)

    # -- the two training stages -----------------------------------------------------------
    def instance_stage_loss(
        self,
        x: torch.Tensor,
        *,
        rho: float,
        mask_rate: float,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        r"""Per-cell loss of the instance stage (DP-DCAN Alg. 1, stage 1).

        :math:`L_i = \rho\, L^{\mathrm{ZINB}}_i + (1-\rho)\, L^{\mathrm{ins}}_i`, where the clean
        view is reconstructed and the two masked views enter the instance loss. The clean view
        and both masked views go through the encoder as one ``(cells, 3, genes)`` tensor, so a
        private encoder sees each cell once and its per-sample gradient is the sum over that
        cell's views.
        """
        x = clean_input(x, self.likelihood)
        rep = self.represent(x)
        views = torch.cat([rep.unsqueeze(1), mask_views(rep, 2, mask_rate, generator)], dim=1)
        z_all = self.encode(views)
        recon = self.reconstruction_per_cell(x, rep, z_all[:, 0])
        inst = instance_loss_per_cell(z_all[:, 1:])
        loss = rho * recon + (1.0 - rho) * inst
        return loss, {"reconstruction": recon.detach(), "instance": inst.detach()}

    def cluster_stage_loss(
        self,
        x: torch.Tensor,
        *,
        betas: tuple[float, float, float],
        target_power: float = 2.0,
        frequency: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        r"""Per-cell data terms of the cluster stage (DP-DCAN Alg. 1, stage 2).

        :math:`L_i = \beta_1 L^{\mathrm{ZINB}}_i + \beta_2 \mathrm{KL}(p_i \Vert q_i)` with the
        per-cell target :math:`p_i` of :func:`~dpsc.module.per_cell_target` (with the released
        cluster ``frequency``, a constant, when given). The third term of
        the paper's objective, :math:`\beta_3 L^{\mathrm{sep}}`, depends on the centroids only;
        it is returned by :meth:`parameter_penalty` and handled apart (see the training plan).
        """
        x = clean_input(x, self.likelihood)
        rep = self.represent(x)
        z = self.encode(rep)
        recon = self.reconstruction_per_cell(x, rep, z)
        q = self.soft_assignment(z)
        kl = dec_kl_per_cell(q, per_cell_target(q, target_power, frequency))
        loss = betas[0] * recon + betas[1] * kl
        return loss, {"reconstruction": recon.detach(), "clustering": kl.detach()}

    def parameter_penalty(self, betas: tuple[float, float, float]) -> torch.Tensor:
        r"""Data-independent part of the cluster-stage objective, :math:`\beta_3 L^{\mathrm{sep}}(\mu)`.

        It reads no cell, so its gradient is a function of the (already privatised) centroids:
        under DP it is added after the noise, as post-processing, and is not clipped.
        """
        return betas[2] * separation_loss(self.clustering.centroids)

    # -- scvi-tools module interface -------------------------------------------------------
    def _get_inference_input(self, tensors: dict[str, torch.Tensor], **kwargs) -> dict:
        return {"x": tensors[REGISTRY_KEYS.X_KEY]}

    def _get_generative_input(self, tensors, inference_outputs, **kwargs) -> dict:
        return {"z": inference_outputs["z"], "library": inference_outputs["library"]}

    @auto_move_data
    def inference(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """Latent ``z`` (deterministic encoder) and soft cluster assignment ``q``."""
        x = clean_input(x, self.likelihood)
        z = self.encode(self.represent(x))
        return {"z": z, "q": self.soft_assignment(z), "library": x.sum(-1, keepdim=True)}

    @auto_move_data
    def generative(self, z: torch.Tensor, library: torch.Tensor) -> dict[str, torch.Tensor]:
        """Decode: ZINB parameters, or the reconstruction for Gaussian data."""
        h = self.decoder(z)
        if not self.reconstructs_counts:
            return {"x_hat": self.px_scale(h)}
        return {
            "mu": torch.softmax(self.px_scale(h), dim=-1) * library,
            "theta": torch.exp(self.px_r(h).clamp(-12.0, 12.0)),
            "zi_logits": self.px_dropout(h),
        }

    def loss(self, tensors, inference_outputs, generative_outputs, **kwargs) -> LossOutput:
        """Mean reconstruction loss (used for evaluation; training uses the stage losses)."""
        x = clean_input(tensors[REGISTRY_KEYS.X_KEY], self.likelihood)
        recon = self.reconstruction_per_cell(x, self.represent(x), inference_outputs["z"])
        return LossOutput(loss=recon.mean(), reconstruction_loss=recon)

    @torch.inference_mode()
    def sample(self, tensors: dict[str, torch.Tensor], n_samples: int = 1) -> torch.Tensor:
        """Draw counts from the fitted ZINB for the cells in ``tensors``."""
        if not self.reconstructs_counts:
            raise NotImplementedError("Sampling is defined for a ZINB decoder of the genes only.")
        inf = self.inference(tensors[REGISTRY_KEYS.X_KEY])
        gen = self.generative(inf["z"], inf["library"])
        dist = ZeroInflatedNegativeBinomial(mu=gen["mu"], theta=gen["theta"], zi_logits=gen["zi_logits"])
        return dist.sample((n_samples,))
