"""A public reference prepared once and reused from disk: its basis, points and types, no cells.

Everything a call reads of a reference (:class:`~dpsc._public_reference.PublicReference`) is a
function of the public reference and the private cells' gene names: the public basis with its
marker centre, the reference cells' points in it, their types and each type's best genes.
:func:`save_prepared` writes them to a folder with a manifest; :func:`load_prepared` reads them
back in seconds however many cells the reference had, so an atlas is read once, not per call.

**Integrity.** The manifest holds the reference's fingerprint (sha256 of its counts and genes, as
recorded by every call that uses it), the gene names of the cohort it was prepared for, and the
sha256 of the arrays file. Loading recomputes that hash and refuses a folder whose arrays changed
after saving, or a cohort whose gene names differ (the basis indexes the private columns). No
private cell is read or written: the folder holds public values only.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import anndata as ad
import numpy as np
import pandas as pd

from ._public_reference import Prepared, PublicReference, read_reference
from .methods.public_basis import PublicBasis

FORMAT = "dpsc-prepared-reference-1"
MANIFEST = "manifest.json"
ARRAYS = "arrays.npz"
#: The basis fields saved as arrays; ``target_sum`` and ``radius`` are numbers in the manifest.
BASIS_ARRAYS = ("genes", "means", "scales", "loadings", "shared", "marker_center")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for piece in iter(lambda: file.read(1 << 24), b""):
            digest.update(piece)
    return digest.hexdigest()


def save_prepared(public: PublicReference, gene_names: pd.Index, path: str | os.PathLike) -> None:
    """Write ``public``'s basis (with marker centre), points, types and focus genes to the folder ``path``.

    Reads the public reference only (one pass per part: basis, points, and with types their best
    genes); ``gene_names`` are the cohort's ``var_names``, which the basis' columns index.
    """
    basis = public.basis(markers=True)
    arrays: dict[str, Any] = {f"basis_{name}": getattr(basis, name) for name in BASIS_ARRAYS}
    arrays["points"] = public.points(basis)
    arrays["reference_genes"], arrays["private_genes"] = public.reference_genes, public.private_genes
    if public.labels is not None:
        types = pd.Categorical(public.labels.astype(str))
        arrays["type_codes"], arrays["type_names"] = types.codes, np.asarray(types.categories, dtype=str)
        arrays["focus_genes"] = public.focus_genes()
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    np.savez(folder / ARRAYS, **arrays)
    manifest = {
        "format": FORMAT,
        "name": public.name,
        "fingerprint": public.fingerprint,
        "reference_key": public.reference_key,
        "target_sum": basis.target_sum,
        "radius": basis.radius,
        "gene_names": [str(g) for g in gene_names],
        "arrays_sha256": _sha256(folder / ARRAYS),
    }
    (folder / MANIFEST).write_text(json.dumps(manifest))


def open_reference(
    reference: ad.AnnData | str | os.PathLike, adata: ad.AnnData, reference_key: str | None, tool: str
) -> PublicReference:
    """Return a reference aligned to ``adata``: a prepared folder loaded, else read and checked.

    The one entry of every tool and site that takes ``reference=``: an AnnData or ``.h5ad`` path
    (:func:`~dpsc._public_reference.read_reference`), or the folder of :func:`save_prepared`.
    """
    if isinstance(reference, str | os.PathLike) and Path(reference).is_dir():
        return load_prepared(reference, adata, reference_key, tool)
    return read_reference(reference, adata, reference_key, tool)


def load_prepared(
    path: str | os.PathLike, adata: ad.AnnData, reference_key: str | None, tool: str
) -> PublicReference:
    """Return the prepared reference in the folder ``path`` for ``adata``'s genes (reads no cell).

    Raises ``ValueError`` with the fix for a folder that is not a prepared reference, whose arrays
    changed after saving (their sha256 differs from the manifest's), that was prepared for other
    gene names, or that holds no types, or another ``reference_key``'s, where ``reference_key`` is given.
    """
    folder = Path(path)
    manifest = read_manifest(folder, tool)
    _check_genes(manifest["gene_names"], adata.var_names, os.fspath(path), tool)
    if reference_key is not None and reference_key != manifest["reference_key"]:
        raise ValueError(
            f"{tool}: the prepared reference at {os.fspath(path)!r} holds the types of "
            f"reference_key={manifest['reference_key']!r}, not {reference_key!r}; pass that "
            "reference_key, or prepare the reference again with the one you want."
        )
    with np.load(folder / ARRAYS, allow_pickle=False) as saved:
        arrays = {name: saved[name] for name in saved.files}
    basis = PublicBasis(
        **{name: arrays[f"basis_{name}"] for name in BASIS_ARRAYS},
        target_sum=manifest["target_sum"],
        radius=manifest["radius"],
    )
    labels = None
    if reference_key is not None:  # saved types serve a call that names them
        labels = pd.Series(arrays["type_names"][arrays["type_codes"]].astype(object))
    return PublicReference(
        None,
        f"{manifest['name']} (prepared at {os.fspath(path)})",
        manifest["fingerprint"],
        arrays["reference_genes"],
        arrays["private_genes"],
        labels,
        reference_key,
        Prepared(basis, arrays["points"], arrays.get("focus_genes") if labels is not None else None),
    )


def read_manifest(folder: Path, tool: str) -> dict[str, Any]:
    """Return a prepared folder's manifest once its arrays' sha256 is checked against it."""
    if not (folder / MANIFEST).is_file() or not (folder / ARRAYS).is_file():
        raise ValueError(
            f"{tool}: reference={os.fspath(folder)!r} is a folder but not a prepared reference (no "
            f"{MANIFEST} and {ARRAYS}); make one with dpsc.tl.prepare_reference, or pass an .h5ad path."
        )
    manifest = json.loads((folder / MANIFEST).read_text())
    if manifest.get("format") != FORMAT or _sha256(folder / ARRAYS) != manifest.get("arrays_sha256"):
        raise ValueError(
            f"{tool}: the prepared reference at {os.fspath(folder)!r} does not match its manifest (its "
            "arrays were changed or written by another dpsc version); prepare it again with "
            "dpsc.tl.prepare_reference."
        )
    return manifest


def _check_genes(saved: list[str], genes: pd.Index, path: str, tool: str) -> None:
    if len(saved) == len(genes) and (pd.Index(saved) == genes.astype(str)).all():
        return
    raise ValueError(
        f"{tool}: the prepared reference at {path!r} was made for {len(saved)} genes and adata has "
        f"{len(genes)} others (or in another order); prepare it for these cells' genes with "
        "dpsc.tl.prepare_reference(reference, adata, path), or pass the reference's .h5ad."
    )
