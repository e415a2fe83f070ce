r"""A public reference for the private clustering: its basis, the k-means start, and cluster names.

``dpsc.tl.cluster(adata, k, reference=ref)`` takes the genes, gene scales and components of a
public reference of the same tissue (:mod:`dpsc.methods.public_basis`): public cells cost no ε,
so the whole budget goes to the DP k-means. With ``reference_key`` the k-means starts from the
reference types' mean points (:func:`~dpsc._public_reference.type_start`) when a released count
of the cells within their spreads chooses them (:mod:`dpsc.methods.type_gate`), and each released
centroid is named after the reference type whose spread holds it (:mod:`dpsc._public_reference`):
maps of the released centroids and the public reference only (post-processing).

The reference is an input the caller declares public: cells of another donor, study or condition
that must not contain the private cells; it is read and checked by :mod:`dpsc._public_reference`.
"""

from __future__ import annotations

import os
from pathlib import Path

import anndata as ad

from .._prepared_reference import open_reference, save_prepared
from .._public_reference import (  # noqa: F401  (the tools' names for them)
    UNMATCHED,
    PublicReference,
    name_centroids,
    name_clusters,
    read_reference,
    reference_points,
    type_radii,
    type_start,
    write_names,
)
from .._public_reference import fingerprint as fingerprint
from ..methods.public_basis import PublicBasis


def reference_basis(
    reference: ad.AnnData | str | os.PathLike | None,
    reference_key: str | None,
    adata: ad.AnnData,
    tool: str,
    markers: bool = False,
    n_clusters: int | None = None,
) -> tuple[PublicReference | None, PublicBasis | None]:
    """Read and check the public reference and compute its basis (reads the reference only).

    ``markers``: the basis also holds the reference's marker centre (the tool ranks markers).
    ``n_clusters``: the basis also holds the DP k-means' public start, the means of the reference's
    types when it has them (:func:`~dpsc._public_reference.type_start`), and their radii, which the
    count that chooses the start reads (:mod:`dpsc.methods.type_gate`).
    """
    public = optional_reference(reference, reference_key, adata, tool)
    if public is None:
        return None, None
    basis = public.basis(markers=markers)
    if n_clusters is not None:
        k = int(n_clusters)
        basis = basis.with_start(type_start(public, basis, k), type_radii(public, basis, k))
    return public, basis


def optional_reference(
    reference: ad.AnnData | str | os.PathLike | None, reference_key: str | None, adata: ad.AnnData, tool: str
) -> PublicReference | None:
    """Read and check the public reference a tool was given, if any (reads the reference only)."""
    if reference is None:
        if reference_key is not None:
            raise ValueError("reference_key names a column of the reference; pass reference=... as well.")
        return None
    return open_reference(reference, adata, reference_key, tool)


def prepare_reference(
    reference: ad.AnnData | str | os.PathLike,
    adata: ad.AnnData,
    path: str | os.PathLike,
    *,
    reference_key: str | None = None,
    overwrite: bool = False,
) -> None:
    """Read a public reference once and save what dpsc reads of it, for cohorts with ``adata``'s genes.

    Passing the folder ``path`` as ``reference=`` to :func:`dpsc.tl.cluster`,
    :func:`dpsc.tl.cluster_federated`, :func:`dpsc.tl.fit` or :func:`dpsc.tl.rank_genes_groups`
    (or to a site's ``--reference``) then gives the same results as the reference itself, in seconds
    for an atlas of millions of cells: the folder holds the public basis with its marker centre, the
    reference cells' points in it, their types and each type's best genes, and a manifest with the
    reference's fingerprint (recorded as before), the cohort's gene names and the arrays' sha256,
    checked on every load (a changed folder, or cells with other genes, are refused).

    Parameters
    ----------
    reference
        The public reference: an AnnData of raw counts or an ``.h5ad`` path (as ``tl.cluster``'s).
    adata
        The cells the reference will be used on; only ``adata.var_names`` is read (no cell).
    path
        The folder to write (created).
    reference_key
        ``reference.obs`` column of cell types, to start the k-means from and name clusters by.
    overwrite
        Replace the files of an existing prepared reference at ``path``.
    """
    folder = Path(path)
    if folder.exists() and any(folder.iterdir()) and not overwrite:
        raise ValueError(
            f"dpsc.tl.prepare_reference: {os.fspath(path)!r} exists and is not empty; pass overwrite=True "
            "or another path."
        )
    public = read_reference(reference, adata, reference_key, "dpsc.tl.prepare_reference")
    save_prepared(public, adata.var_names, folder)
