"""``dpsc.tl.fit(reference=...)``: the public reference of a fit, its pretrained model and its names.

The reference is read and checked as :func:`dpsc.tl.cluster` reads it (:mod:`._reference`); the
model pretrained on it (:mod:`dpsc.model._dcan_reference`) is public, so it is made without ε
and may be saved and reused; the names are post-processing of released values and the reference.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import anndata as ad
import numpy as np
import pandas as pd

from .._validation import get_matrix
from ..methods import selection as _selection
from ..methods.public_basis import PublicBasis
from ..model import (
    DPDCAN,
    REFERENCE_MODEL,
    load_pretrained,
    points_anndata,
    pretrained_state,
    pretraining_key,
    save_pretrained,
)
from ._reference import PublicReference, name_centroids, reference_basis, reference_points, write_names

__all__ = [
    "REFERENCE_FINE_TUNING_EPOCHS",
    "REFERENCE_FINE_TUNING_RATE",
    "REFERENCE_MODEL",
    "ReferenceFit",
    "reference_for_fit",
    "reference_outputs",
]

#: Private fine-tuning of a model pretrained on a reference, unless given: no instance stage (the
#: encoder is pretrained), 4 cluster-stage epochs at Poisson rate q = 0.5 (8 noisy steps of half
#: the cells each). Chosen by leave one pair out among these, q = 0.25 and 10 + 10 epochs at
#: q = 0.1: the best model partition among the schedules whose call
#: takes at most twice a fit without a reference (docs, Benchmarks: "``tl.fit(reference=...)`` on
#: reference / private pairs").
REFERENCE_FINE_TUNING_EPOCHS = {"instance_epochs": 0, "cluster_epochs": 4}
REFERENCE_FINE_TUNING_RATE = 0.5


@dataclass
class ReferenceFit:
    """The public side of a fit on a reference: the reference, its basis and where its model is kept."""

    reference: PublicReference
    basis: PublicBasis
    gene_names: pd.Index
    directory: str | os.PathLike | None = None

    @property
    def summary(self) -> dict[str, Any]:
        """What the record states about the reference."""
        return self.reference.summary(self.basis)

    def points(self) -> np.ndarray:
        """Return the reference cells' points in the basis (public)."""
        return reference_points(self.reference, self.basis)

    def pretrained(self, n_clusters: int, random_state: int, progress_bar: bool) -> dict:
        """Return the weights pretrained on the reference: loaded from the directory, or trained (no ε)."""
        key = pretraining_key(
            self.reference.fingerprint, self.basis, self.gene_names, n_clusters, random_state
        )
        if self.directory is not None:
            state = load_pretrained(self.directory, key)
            if state is not None:
                return state
        state = pretrained_state(self.points(), n_clusters, random_state, progress_bar)
        if self.directory is not None:
            save_pretrained(self.directory, key, state)
        return state

    def model(self, matrix: Any, n_clusters: int, random_state: int, progress_bar: bool) -> DPDCAN:
        """Return a DP-DCAN on these cells' points in the basis, started from the pretrained weights.

        Each point is a map of its cell and public values (:mod:`dpsc.methods.public_basis`), so
        training on the points is training on the cells with per-cell gradients.
        """
        state = self.pretrained(n_clusters, random_state, progress_bar)
        cells = points_anndata(np.asarray(self.basis.points(matrix)))
        DPDCAN.setup_anndata(cells)
        model = DPDCAN(cells, n_clusters=n_clusters, **REFERENCE_MODEL)
        model.module.load_state_dict(state)
        model.reads_reference_points_ = True  # not genes: export_shared refuses it
        return model


def reference_for_fit(
    reference: ad.AnnData | str | os.PathLike | None,
    reference_key: str | None,
    directory: str | os.PathLike | None,
    adata: ad.AnnData,
    scope: str,
    input_pcs: Any,
    likelihood: str,
    n_clusters: int,
) -> ReferenceFit | None:
    """Read and check ``tl.fit``'s reference (reads the reference and the gene names only).

    The basis holds the start clustering's public start (the reference types' means, with types).
    """
    if reference is None:
        if directory is not None:
            raise ValueError(
                "dpsc.tl.fit: reference_model is where the model pretrained on a reference is kept; "
                "pass reference=... as well."
            )
        reference_basis(None, reference_key, adata, "dpsc.tl.fit")  # refuses reference_key alone
        return None
    if scope != "encoder" or input_pcs != "auto" or likelihood != "zinb":
        raise ValueError(
            "dpsc.tl.fit(reference=...) pretrains the default model on the reference and trains only its "
            "encoder privately; pass scope='encoder', input_pcs='auto' and likelihood='zinb' (the "
            f"defaults), not scope={scope!r}, input_pcs={input_pcs!r}, likelihood={likelihood!r}."
        )
    public, basis = reference_basis(reference, reference_key, adata, "dpsc.tl.fit", n_clusters=n_clusters)
    return ReferenceFit(public, basis, adata.var_names, directory)


def reference_outputs(
    target: ad.AnnData,
    public: ReferenceFit,
    model: DPDCAN,
    selection: _selection.Selection | None,
    call: dict[str, Any],
) -> dict[str, Any]:
    """Return the reference's summary for ``uns`` and, with a ``reference_key``, write the names.

    Each cluster of the kept partition is named from its released centroid: the clustering's in
    the basis' points, the model's in the latent space, where the reference's cells are embedded
    by the trained (released) encoder: post-processing either way. Each cell is then named in
    the same space, from its own point (``obsm[call["key_added"]]`` in the latent).
    """
    extra: dict[str, Any] = {"reference": public.summary}
    if public.reference.labels is None:
        return extra
    labels = public.reference.labels.to_numpy()
    points = public.points()
    if selection is not None and selection.kept == "clustering":
        centroids = model.partition_centroids_
        cells = public.basis.points(get_matrix(target, call["layer"]))
    else:
        points = model.get_latent_representation(points_anndata(points))
        centroids = model.module.clustering.centroids.detach().cpu().double().numpy()
        cells = target.obsm[call["key_added"]]
    names = name_centroids(centroids, points, labels)
    extra["cluster_names"] = write_names(target, call["cluster_key"], names, cells)
    return extra
