r"""DP-DCAN on a public reference: pretrained on the reference's cells, fine-tuned privately.

With a public reference (:mod:`dpsc.methods.public_basis`), a cell is read as its point
:math:`p_i = V^\top y_i / \max(R, \lVert V^\top y_i \rVert)` in the reference's basis, a map of
the cell and public values (norm at most 1). The model is DCAN on these points (a Gaussian
decoder of the point, :data:`REFERENCE_MODEL`):

1. **Pretraining** (:func:`pretrained_state`): the cluster stage (:data:`PRETRAIN_EPOCHS`), every
   parameter, no noise, on the reference's own points (at most :data:`PRETRAIN_MAX_CELLS` of them,
   a seeded sample: its time does not grow with an atlas): a function of public cells only, so it
   costs no ε and may be saved and reused (:func:`save_pretrained` / :func:`load_pretrained`,
   keyed by the reference's fingerprint, the basis' genes and the architecture). The network is
   residual, so before pretraining it embeds each point where the reference-guided clustering
   does.
2. **Private fine-tuning** (:meth:`dpsc.model.DPDCAN.train` with ``scope="encoder"``): the
   module starts from the pretrained weights, DP-SGD trains only the encoder and the centroids on
   the private points, and the decoder stays at its pretrained, public values.

**Privacy argument.** DP-SGD's guarantee for the encoder and centroids needs every other input
of the per-cell loss to be independent of the private cells: the decoder here depends on the
reference alone (public by the caller's declaration), and each point on its cell alone, so the
per-cell gradients are per cell and the proof applies unchanged ("proven").
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import anndata as ad
import numpy as np
import torch

from ..methods.public_basis import PublicBasis

#: The network on a reference's points: the points' components → 64 hidden units → 16 latent
#: dimensions, the decoder reconstructing the point (the default fit's :data:`dpsc.tl._fit.PC_MODEL`
#: shape on the reference's components instead of DP ones). Residual: untrained, it embeds each cell
#: at its point (times the latent scale), where ``tl.cluster(reference=...)`` embeds it.
REFERENCE_MODEL: dict[str, Any] = {
    "n_hidden": (64,),
    "n_latent": 16,
    "likelihood": "gaussian",
    "residual": True,
}
#: Pretraining epochs on the reference (no noise): DCAN's 40 cluster-stage epochs and no instance
#: stage, whose contrastive views of masked coordinates blur the points' neighbourhoods. Chosen by
#: leave one pair out on the embedding's kNN label purity among this, the residual model with 50 + 40
#: and the plain (non-residual) one with 50 + 40 (docs, Benchmarks: "``tl.fit(reference=...)``").
PRETRAIN_EPOCHS = {"instance_epochs": 0, "cluster_epochs": 40}
#: Most reference points the pretraining reads: a larger reference gives a uniform sample of this
#: many, drawn with the fit's ``random_state`` (public cells, public seed: no ε). The pretraining's
#: steps grow with the points it reads; past this many they repeat a distribution the sample covers.
PRETRAIN_MAX_CELLS = 100_000
PRETRAINED_WEIGHTS = "dpdcan_reference.pt"
PRETRAINED_META = "dpdcan_reference.json"


def points_anndata(points: np.ndarray) -> ad.AnnData:
    """Return the points (cells × components) as the AnnData a reference model trains on."""
    points = np.asarray(points, dtype=np.float32)
    cells = ad.AnnData(points)
    cells.var_names = [f"component_{j + 1}" for j in range(points.shape[1])]
    return cells


def pretraining_key(
    fingerprint: str, basis: PublicBasis, gene_names: Any, n_clusters: int, random_state: int
) -> dict:
    """Return what a pretrained model depends on: the reference, its basis' genes and the architecture.

    ``gene_names`` are the private matrix's gene names (public metadata): the basis' genes and the
    shared genes whose totals it reads are named, so a saved model is reused only for the same ones.
    """
    names = np.asarray(gene_names).astype(str)
    genes = hashlib.sha256("\n".join(names[basis.genes]).encode()).hexdigest()
    shared = hashlib.sha256("\n".join(names[basis.shared]).encode()).hexdigest()
    return {
        "reference_fingerprint": fingerprint,
        "basis_genes_sha256": genes,
        "shared_genes_sha256": shared,
        "n_comps": basis.n_comps,
        "n_clusters": int(n_clusters),
        "random_state": int(random_state),
        **{k: list(v) if isinstance(v, tuple) else v for k, v in REFERENCE_MODEL.items()},
        **PRETRAIN_EPOCHS,
        "max_cells": PRETRAIN_MAX_CELLS,
    }


def pretrained_state(
    reference_points: np.ndarray, n_clusters: int, random_state: int, progress_bar: bool = False
) -> dict[str, torch.Tensor]:
    """Train DCAN without noise on the reference's points and return its module's weights (public).

    A reference of more than :data:`PRETRAIN_MAX_CELLS` points is sampled to that many (uniformly,
    without replacement, seeded by ``random_state``).
    """
    from ._dpdcan import DPDCAN

    n_points = len(reference_points)
    if n_points > PRETRAIN_MAX_CELLS:
        rng = np.random.default_rng(random_state)
        reference_points = reference_points[np.sort(rng.choice(n_points, PRETRAIN_MAX_CELLS, replace=False))]
    cells = points_anndata(reference_points)
    DPDCAN.setup_anndata(cells)
    torch.manual_seed(random_state)
    model = DPDCAN(cells, n_clusters=n_clusters, **REFERENCE_MODEL)
    model.train(
        epsilon=None, scope="full", random_state=random_state, progress_bar=progress_bar, **PRETRAIN_EPOCHS
    )
    return {k: v.detach().cpu().clone() for k, v in model.module.state_dict().items()}


def load_pretrained(directory: str | Path, key: dict) -> dict[str, torch.Tensor] | None:
    """Return the weights saved in ``directory`` for ``key``, or ``None`` when it holds none for it."""
    directory = Path(directory)
    meta, weights = directory / PRETRAINED_META, directory / PRETRAINED_WEIGHTS
    if not (meta.exists() and weights.exists()):
        return None
    if json.loads(meta.read_text()).get("key") != key:
        return None
    return torch.load(weights, weights_only=True)


def save_pretrained(directory: str | Path, key: dict, state: dict[str, torch.Tensor]) -> Path:
    """Save pretrained weights and their key in ``directory`` (created); return it."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    torch.save(state, directory / PRETRAINED_WEIGHTS)
    meta = {"model": "DPDCAN pretrained on a public reference", "key": key}
    (directory / PRETRAINED_META).write_text(json.dumps(meta, indent=1))
    return directory
