r"""A public reference read, checked and fingerprinted, aligned to the private cells' genes.

The reference is an input the caller (or a site's data manager) declares public: cells of another
donor, study or condition that must not contain the private cells. Every check here reads the
reference and the private cells' gene names only; :meth:`PublicReference.basis` computes the
public basis (:mod:`dpsc.methods.public_basis`) from the reference alone.

**Names for private clusters** (:func:`name_clusters`): each released centroid is named after the
public reference type it lies in, in the points of the public basis, or :data:`UNMATCHED` where
it lies outside every type's spread. Reads released centroids and the public reference only: no ε. The
central tools (:mod:`dpsc.tl._reference`) and a federated site (:mod:`dpsc.federated._site`) name
clusters with it, so both write the same names. Each cell then takes its cluster's name, or
:data:`UNMATCHED` when its own point lies outside that type (:meth:`ClusterNames.cell_names`): a
map of the cell alone, as its cluster label is, written beside it and never released.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from dataclasses import dataclass, field, replace
from typing import Any

import anndata as ad
import numpy as np
import pandas as pd
import scipy.sparse as sp
from anndata.abc import CSRDataset

from .methods import public_basis as _public_basis
from .methods.cluster_design import MAX_GENES, N_COMPS
from .methods.markers import FOCUS_GENES
from .methods.public_basis import PublicBasis, basis_from_reference
from .methods.public_markers import reference_center, reference_focus_genes

MIN_SHARED_GENES = 200  # fewer shared genes than this: another gene naming, or another species
MIN_TYPE_CELLS = 50  # a reference type with fewer cells has a noisy mean point: warn


@dataclass(frozen=True)
class Prepared:
    """What a call reads of a reference, computed once, loaded from disk (:mod:`dpsc._prepared_reference`)."""

    basis: PublicBasis  # with the marker centre
    points: np.ndarray  # the reference cells' points in ``basis``
    focus_genes: np.ndarray | None  # :func:`~dpsc.methods.public_markers.reference_focus_genes`, with types


@dataclass(frozen=True)
class PublicReference:
    """A public reference aligned to the private cells' genes (everything here is public)."""

    counts: Any  # reference cells × its genes (raw counts); None for a prepared reference
    name: str
    fingerprint: str  # sha256 of the matrix and the gene list
    reference_genes: np.ndarray  # shared genes: columns in the reference …
    private_genes: np.ndarray  # … and the same genes' columns in the private matrix
    labels: pd.Series | None  # the reference_key column, when given
    reference_key: str | None
    #: a prepared reference's basis, points and focus genes, loaded from disk (its cells are not kept)
    prepared: Prepared | None = None
    #: the reference cells' points per basis map (:meth:`points`), computed once per call
    _points: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def n_obs(self) -> int:
        """Cells of the reference."""
        return int((self.prepared.points if self.counts is None else self.counts).shape[0])

    def cells(self) -> Any:
        """Return the reference's counts; a prepared reference has none: say what to pass instead."""
        if self.counts is None:
            raise ValueError(
                f"reference={self.name!r} is a prepared reference: it keeps the basis, points and types "
                "dpsc.tl.prepare_reference computed, not the cells this call reads; pass the reference's "
                "AnnData or .h5ad."
            )
        return self.counts

    def summary(self, basis: PublicBasis | None = None) -> dict[str, Any]:
        """Return what the record states about the reference (public): genes of ``basis``, else shared."""
        return {
            "name": self.name,
            "fingerprint": self.fingerprint,
            "n_obs": self.n_obs,
            "n_genes": len(self.private_genes if basis is None else basis.genes),
            "reference_key": self.reference_key or "",
        }

    def basis(self, *, markers: bool = True) -> PublicBasis:
        """Return the public basis (:mod:`dpsc.methods.public_basis`) in the private columns.

        ``markers``: also hold the reference's marker centre (:meth:`marker_center`), which a
        clustering with markers measures its statistics from (one more pass over the reference).
        A prepared reference returns the basis it was saved with.
        """
        if self.prepared is not None:
            basis = self.prepared.basis
            return basis if markers else replace(basis, marker_center=None)
        quantile = _public_basis.RADIUS_QUANTILE
        basis = basis_from_reference(
            self.counts, self.reference_genes, self.private_genes, MAX_GENES, N_COMPS, quantile
        )
        return replace(basis, marker_center=self.marker_center()) if markers else basis

    def marker_center(self) -> np.ndarray:
        """Return the reference's mean log1p(CP10k) on the shared genes (:func:`reference_center`)."""
        if self.prepared is not None:
            return self.prepared.basis.marker_center
        n_shared = len(self.reference_genes)
        return reference_center(self.counts, self.reference_genes, np.arange(n_shared), n_shared)

    def private_marker_center(self, n_vars: int) -> np.ndarray:
        """Return the marker centre on all ``n_vars`` private genes (0 on a gene the reference lacks).

        A prepared reference gives the centre it was saved with, placed in the private columns.
        """
        if self.prepared is not None:
            return self.prepared.basis.marker_center_for(n_vars)
        return reference_center(self.counts, self.reference_genes, self.private_genes, n_vars)

    def focus_genes(self, per_group: int = FOCUS_GENES) -> np.ndarray:
        """Return the union of each type's ``per_group`` best shared genes (private columns; needs types).

        A prepared reference holds them for :data:`~dpsc.methods.markers.FOCUS_GENES` per type.
        """
        if self.prepared is not None and self.prepared.focus_genes is not None and per_group == FOCUS_GENES:
            return self.prepared.focus_genes
        labels, columns = self.labels.to_numpy(), (self.reference_genes, self.private_genes)
        return reference_focus_genes(self.cells(), labels, *columns, per_group)

    def points(self, basis: PublicBasis) -> np.ndarray:
        """Return the reference cells' points in ``basis`` (public), computed once per map.

        The k-means start and the cluster names of one call read them both; a basis that differs
        only in its start (:meth:`~dpsc.methods.public_basis.PublicBasis.with_start`) is the same map.
        A prepared reference holds the points of its own basis.
        """
        own = self.prepared
        if own is not None and basis.loadings is own.basis.loadings and basis.genes is own.basis.genes:
            return own.points
        key = (id(basis.loadings), id(basis.genes), basis.radius)
        cached = self._points.get(key)
        if cached is None or cached[0] is not basis.loadings or cached[1] is not basis.genes:
            points = np.asarray(self.own_basis(basis).points(self.cells()))
            cached = self._points[key] = (basis.loadings, basis.genes, points)  # holds the arrays keyed
        return cached[2]

    def own_basis(self, basis: PublicBasis) -> PublicBasis:
        """Return the same basis in the reference's own columns (to map the reference's cells)."""
        columns = dict(zip(self.private_genes.tolist(), self.reference_genes.tolist(), strict=True))
        genes = np.array([columns[g] for g in basis.genes.tolist()], dtype=np.int64)
        return basis.with_columns(genes, self.reference_genes)


def read_reference(
    reference: ad.AnnData | str | os.PathLike, adata: ad.AnnData, reference_key: str | None, tool: str
) -> PublicReference:
    """Return ``reference`` (an AnnData of raw counts or an ``.h5ad`` path) aligned to ``adata``'s genes.

    Raises ``ValueError`` (with the fix) for a reference that is not raw counts, shares too few
    genes with ``adata`` (another naming or species), or lacks ``reference_key``; warns for a type
    with fewer than :data:`MIN_TYPE_CELLS` cells. Reads the reference and ``adata.var_names`` only.
    """
    name = None
    if isinstance(reference, str | os.PathLike):
        name = os.fspath(reference)
        if not os.path.exists(name):
            raise ValueError(
                f"{tool}: reference={name!r} does not exist; pass an AnnData, an .h5ad path or the folder "
                "of dpsc.tl.prepare_reference."
            )
        reference = _read_h5ad(name)
    if not isinstance(reference, ad.AnnData):
        raise TypeError(
            f"{tool}: reference must be an AnnData or an .h5ad path, got {type(reference).__name__}."
        )
    if name is None:  # an AnnData in memory: named by its shape (its fingerprint identifies it)
        name = f"an in-memory AnnData of {reference.n_obs} cells × {reference.n_vars} genes"
    counts, var = _reference_counts(reference, tool)
    _check_reference_counts(reference, counts, tool)
    reference_genes, private_genes = _matched_genes(var, adata.var, tool)
    labels = None
    if reference_key is not None:
        labels = _reference_labels(reference, reference_key, tool)
    return PublicReference(
        counts,
        name,
        fingerprint(counts, var.index),
        reference_genes,
        private_genes,
        labels,
        reference_key,
    )


def file_fingerprint(path: str, tool: str) -> str:
    """Return the fingerprint of a reference file as :func:`read_reference` computes it (its counts)."""
    counts, var = _reference_counts(_read_h5ad(path), tool)
    return fingerprint(counts, var.index)


def _read_h5ad(path: str) -> ad.AnnData:
    """Read a reference file: its CSR counts stay on disk (backed), read in row blocks by every pass.

    A file whose ``X`` is not CSR, or that keeps counts in ``raw`` (an atlas), is read into memory.
    """
    reference = ad.read_h5ad(path, backed="r")
    if isinstance(reference.X, CSRDataset) and reference.raw is None:
        return reference
    reference.file.close()
    return ad.read_h5ad(path)


def fingerprint(counts: Any, genes: pd.Index) -> str:
    """Return the sha256 of a matrix (its values and layout) and its gene list.

    The bytes of its CSR arrays (``indptr``, ``indices``, values as float64), read in pieces: the
    same for the matrix in memory and for the same matrix backed on disk (:func:`_csr_parts`).
    """
    digest = hashlib.sha256()
    for part, dtype in zip(_csr_parts(counts), (None, None, np.float64), strict=True):
        for piece in _pieces(part):  # in pieces: no copy of a whole atlas's values at once
            digest.update(np.ascontiguousarray(piece if dtype is None else piece.astype(dtype)).tobytes())
    digest.update("\n".join(map(str, genes)).encode())
    return digest.hexdigest()


def _csr_parts(counts: Any) -> tuple[Any, Any, Any]:
    """Return a matrix's CSR arrays: as stored for one backed on disk (read in pieces), else in memory."""
    if isinstance(counts, CSRDataset):
        return counts.group["indptr"], counts.group["indices"], counts.group["data"]
    matrix = sp.csr_matrix(counts)
    return matrix.indptr, matrix.indices, matrix.data


#: Values read at once when a reference's values are hashed or checked (memory of one piece).
PIECE = 1 << 24


def _pieces(values: Any) -> Any:
    """Yield consecutive slices of :data:`PIECE` entries of an array (views) or a stored dataset (reads)."""
    values = values.ravel() if isinstance(values, np.ndarray) else values
    for start in range(0, values.shape[0], PIECE):
        yield np.asarray(values[start : start + PIECE])


#: ``var`` columns that hold gene identifiers in public atlases (CELLxGENE's ``feature_name`` holds
#: symbols beside Ensembl IDs in ``var_names``), tried when the gene names do not match as they are.
GENE_ID_COLUMNS = ("feature_name", "gene_symbols", "gene_symbol", "gene_name", "gene_ids", "gene_id")


def _are_counts(counts: Any) -> bool:
    """Whether a matrix holds raw counts: finite, non-negative integers (reads the public reference)."""
    sparse = sp.issparse(counts) or isinstance(counts, CSRDataset)
    values = _csr_parts(counts)[2] if sparse else np.asarray(counts)
    return all(
        np.isfinite(piece).all() and piece.min() >= 0 and np.array_equal(piece, np.round(piece))
        for piece in _pieces(values)
    )


def _reference_counts(reference: ad.AnnData, tool: str) -> tuple[Any, pd.DataFrame]:
    """Return the reference's counts and their ``var``: ``X``, or ``raw.X`` where an atlas keeps them.

    Public atlases (the CELLxGENE schema) store normalised values in ``X`` and the counts in
    ``raw.X``; dpsc reads them there and says so.
    """
    if _are_counts(reference.X) or reference.raw is None or not _are_counts(reference.raw.X):
        return reference.X, reference.var
    warnings.warn(
        f"{tool}: the reference's X is not raw counts; reading its counts from reference.raw.X "
        f"({reference.raw.n_vars} genes), where atlases in the CELLxGENE schema keep them.",
        UserWarning,
        stacklevel=4,
    )
    return reference.raw.X, reference.raw.var


def _check_reference_counts(reference: ad.AnnData, counts: Any, tool: str) -> None:
    raw = _are_counts(counts)
    if ("log1p" in reference.uns and counts is not getattr(reference.raw, "X", None)) or not raw:
        hint = "reference.layers['counts']" if "counts" in reference.layers else "the raw counts"
        raise ValueError(
            f"{tool}: the reference's X is not raw counts (log-transformed, scaled or not integer); pass "
            f"an AnnData whose X holds {hint}, e.g. reference = reference.raw.to_adata()."
        )
    if reference.n_obs < 2 * N_COMPS:
        raise ValueError(
            f"{tool}: the reference has {reference.n_obs} cells; it needs at least {2 * N_COMPS}."
        )


def _identifiers(var: pd.DataFrame) -> dict[str, pd.Index]:
    """Each gene-identifier column of a ``var`` (``var_names`` first) as an index of strings."""
    found = {"var_names": pd.Index(var.index.astype(str))}
    for column in GENE_ID_COLUMNS:
        if column in var.columns:
            found[f"var[{column!r}]"] = pd.Index(var[column].astype(str))
    return found


def _positions(reference: pd.Index, private: pd.Index) -> np.ndarray:
    """Each private gene's position among the reference's (-1: absent; a repeated name: its first)."""
    first = ~reference.duplicated()
    lookup = pd.Series(np.flatnonzero(first), index=reference[first])
    return lookup.reindex(private).fillna(-1).to_numpy(dtype=np.int64)


def _matched_genes(
    reference: pd.DataFrame, private: pd.DataFrame, tool: str
) -> tuple[np.ndarray, np.ndarray]:
    """Match genes by ``var_names``, else by the identifier columns sharing the most (said in a warning)."""
    names = _shared_genes(reference.index, private.index, tool, strict=False)
    if names is not None:
        return names
    pairs = [
        (int((_positions(ref, own) >= 0).sum()), ref_name, own_name, ref, own)
        for ref_name, ref in _identifiers(reference).items()
        for own_name, own in _identifiers(private).items()
    ]
    shared, ref_name, own_name, ref, own = max(pairs, key=lambda pair: pair[0])
    if shared < MIN_SHARED_GENES:
        return _shared_genes(reference.index, private.index, tool)  # raises, with the hint
    warnings.warn(
        f"{tool}: matching genes by reference.{ref_name} and adata.{own_name} ({shared} shared): the gene "
        "names of the two differ.",
        UserWarning,
        stacklevel=4,
    )
    position = _positions(ref, own)
    private_genes = np.flatnonzero(position >= 0)
    return position[private_genes].astype(np.int64), private_genes.astype(np.int64)


def _shared_genes(
    reference: pd.Index, private: pd.Index, tool: str, strict: bool = True
) -> tuple[np.ndarray, np.ndarray] | None:
    position = _positions(pd.Index(reference.astype(str)), pd.Index(private.astype(str)))
    private_genes = np.flatnonzero(position >= 0)
    if len(private_genes) < MIN_SHARED_GENES and not strict:
        return None
    if len(private_genes) < MIN_SHARED_GENES:
        lower = pd.Index(reference.str.upper()).get_indexer(pd.Index(private.str.upper()))
        case = int((lower >= 0).sum())
        why = (
            f"{case} match when case is ignored: another species' gene names (e.g. mouse 'Gcg' and "
            "human 'GCG')? Map them to one species first"
            if case >= MIN_SHARED_GENES
            else "use the same gene identifiers in both (symbols or Ensembl IDs: adata.var_names)"
        )
        raise ValueError(
            f"{tool}: the reference shares {len(private_genes)} gene names with adata (at least "
            f"{MIN_SHARED_GENES} are needed); {why}."
        )
    return position[private_genes].astype(np.int64), private_genes.astype(np.int64)


def _reference_labels(reference: ad.AnnData, key: str, tool: str) -> pd.Series:
    if key not in reference.obs:
        raise ValueError(
            f"{tool}: reference.obs has no {key!r} (reference_key); its columns are "
            f"{list(reference.obs.columns)}."
        )
    labels = reference.obs[key].astype(str)
    counts = labels.value_counts()
    small = counts[counts < MIN_TYPE_CELLS]
    if len(small):
        warnings.warn(
            f"{len(small)} reference types have fewer than {MIN_TYPE_CELLS} cells (e.g. {small.index[0]!r}: "
            f"{int(small.iloc[0])}); their mean points are noisy, so names matched to them are less certain.",
            UserWarning,
            stacklevel=4,
        )
    return labels.reset_index(drop=True)


# -- names for private clusters ---------------------------------------------------------------------
UNMATCHED = "unmatched"
#: A centroid, less the cohort's shift from the reference (:func:`common_shift`), is named by the
#: vote of its :data:`NEIGHBOURS` nearest reference cells when it lies within that type's own
#: spread: the :data:`NAME_RADIUS_QUANTILE` quantile of the distances of the type's reference cells
#: to their mean, widened by the centroid's own noise (:func:`name_centroids`). Otherwise it is
#: :data:`UNMATCHED`. The rule and quantile were chosen by leave one reference / private pair out
#: (pairs with a condition shift among them) among 0.5, 0.75 and 0.9, with and without the shift
#: removed, beside the earlier neighbour-density test (docs, Benchmarks: "Cluster names from a
#: public reference").
NEIGHBOURS = 10
NAME_RADIUS_QUANTILE = 0.75
#: A cell of a cluster named t is itself named :data:`UNMATCHED` when, less the cohort's shift, its
#: own point lies beyond this quantile of the distances of t's reference cells to their mean
#: (:meth:`ClusterNames.cell_names`): about one cell in a hundred of a type the reference holds,
#: and the cells of a type it lacks that joined t's cluster from outside t's spread. Chosen with
#: the naming rule by leave one reference / private pair out (0.95, 0.99 or no cell test).
CELL_RADIUS_QUANTILE = 0.99
#: The radius of a type in the type gate's count (:func:`type_radii`, ``dpsc.methods.type_gate``):
#: the quantile of its reference cells' distances to their mean, chosen with the gate.
GATE_RADIUS_QUANTILE = 0.9
#: The fewest centroids whose median shift (:func:`common_shift`) one cluster of a new type cannot move.
MIN_SHIFT_CLUSTERS = 3


def reference_points(reference: PublicReference, basis: PublicBasis) -> np.ndarray:
    """Return the reference cells' points in the basis (public; :meth:`PublicReference.points`)."""
    return reference.points(basis)


#: Seed of the public k-means that fills a start when the reference has fewer types than clusters.
START_SEED = 0


def type_start(reference: PublicReference, basis: PublicBasis, n_clusters: int) -> np.ndarray | None:
    """Return k public starting centroids of the DP k-means: the reference types' mean points.

    With more types than ``n_clusters`` the means of the k most populous types (the cells of the
    others join the nearest); with fewer, k-means centroids of the reference's points fill the
    rest. ``None`` without types (no ``reference_key``): the k-means starts from its own sketch.
    Computed from the public reference alone: no ε.
    """
    if reference.labels is None:
        return None
    points = reference_points(reference, basis)
    labels = reference.labels.astype(str).to_numpy()
    kept = _start_types(labels, n_clusters)
    means = np.stack([points[labels == kind].mean(axis=0) for kind in kept])
    rest = int(n_clusters) - len(means)
    if rest == 0:
        return means
    from sklearn.cluster import KMeans

    fill = KMeans(min(rest, len(points)), n_init=4, random_state=START_SEED).fit(points).cluster_centers_
    start = np.concatenate([means, fill])
    short = int(n_clusters) - len(start)  # fewer reference cells than clusters: repeat some
    return np.concatenate([start, start[:short]]) if short > 0 else start


def type_radii(reference: PublicReference, basis: PublicBasis, n_clusters: int) -> np.ndarray | None:
    """Return the radius of each row of :func:`type_start`: its type's spread, 0 for a fill (public).

    :func:`type_spread`'s radius (:data:`GATE_RADIUS_QUANTILE`) of each of the k most populous
    types; ``None`` without types.
    """
    if reference.labels is None:
        return None
    points = reference_points(reference, basis)
    labels = reference.labels.astype(str).to_numpy()
    radii = np.zeros(int(n_clusters))
    for row, kind in enumerate(_start_types(labels, n_clusters)):
        radii[row] = type_spread(points[labels == kind], GATE_RADIUS_QUANTILE)[1]
    return radii


def _start_types(labels: np.ndarray, n_clusters: int) -> list[str]:
    """Return the k most populous types (ties by name): the rows of the type start."""
    sizes = pd.Series(labels).value_counts(sort=False)
    return sorted(sizes.index, key=lambda kind: (-sizes[kind], kind))[: int(n_clusters)]


@dataclass(frozen=True)
class ClusterNames:
    r"""The released centroids' names and what names each cell (public: post-processing).

    ``table``: one row per centroid (:func:`name_centroids`); ``shift``: the cohort's shift
    :math:`\delta` (:func:`common_shift`); ``centers``: each centroid's named type's mean point
    :math:`m_t` (its vote's when unmatched); ``cell_radii``: that type's
    :data:`CELL_RADIUS_QUANTILE` radius :math:`\rho_t` (0 when unmatched: its cells stay unmatched).
    """

    table: pd.DataFrame
    shift: np.ndarray
    centers: np.ndarray
    cell_radii: np.ndarray

    def cell_names(self, clusters: np.ndarray, cell_points: Any, rows: int = 65536) -> np.ndarray:
        r"""Each cell's name: its cluster's, or :data:`UNMATCHED` when it lies outside the named type.

        Cell i of cluster c is named :math:`t_c` when :math:`\lVert x_i - \delta - m_{t_c}
        \rVert_2 \le \rho_{t_c}`, :math:`x_i` its point (``cell_points``: numpy or Dask, read
        a chunk or ``rows`` at a time), as its cluster label is: a map of the cell alone with public and
        released values, written beside its label and never released.
        """
        clusters = np.asarray(clusters, dtype=np.int64)
        names = self.table["name"].to_numpy(dtype=object)[clusters]
        outside = np.zeros(len(clusters), dtype=bool)
        if hasattr(cell_points, "chunks"):  # a Dask chunk at a time
            ends = np.cumsum(cell_points.chunks[0])
        else:
            ends = np.append(np.arange(rows, len(clusters), rows), len(clusters))
        for start, end in zip(np.append(0, ends[:-1]), ends, strict=True):
            block = slice(int(start), int(end))
            points = np.asarray(cell_points[block], dtype=np.float64) - self.shift
            gaps = np.linalg.norm(points - self.centers[clusters[block]], axis=1)
            outside[block] = gaps > self.cell_radii[clusters[block]]
        return np.where(outside, UNMATCHED, names)


def name_clusters(
    centroids: np.ndarray,
    reference: PublicReference,
    basis: PublicBasis,
    noise: np.ndarray | None = None,
) -> ClusterNames:
    """Name each released centroid (in the basis' points) after the reference type it lies in.

    :func:`name_centroids` in the basis' points of the reference's cells; ``noise``: each
    centroid's noise sd per coordinate (:func:`dpsc.methods.dp_kmeans_centroids`).
    """
    points = reference_points(reference, basis)
    return name_centroids(centroids, points, reference.labels.to_numpy(), noise)


def name_centroids(
    centroids: np.ndarray, points: np.ndarray, labels: np.ndarray, noise: np.ndarray | None = None
) -> ClusterNames:
    r"""Name each released centroid after the public reference type it lies in (post-processing).

    In the space of ``points`` (the reference cells, as the centroids' cells are read), the
    cohort's shift :math:`\delta` from the reference (:func:`common_shift`) is removed first; then
    centroid :math:`\mu_j - \delta` votes among its :data:`NEIGHBOURS` nearest reference cells for
    a type t. A
    centroid of type t is the mean of its cells plus Gaussian noise of sd :math:`s_j` per coordinate,
    so it lies near the type's reference mean :math:`m_t`, within the type's own spread and its
    noise's length :math:`\approx \sqrt p\, s_j` (p the points' dimension). It is named t when

    .. math::

        \lVert \mu_j - \delta - m_t \rVert_2 \le \sqrt{r_t^2 + p\, s_j^2},

    :math:`r_t` the :data:`NAME_RADIUS_QUANTILE` quantile of the distances of t's reference cells to
    :math:`m_t`, else :data:`UNMATCHED` (a type the reference lacks sits outside the types it has).
    ``noise``: each centroid's noise sd per coordinate (:func:`dpsc.methods.dp_kmeans_centroids`;
    0 when not given). Reads the released centroids, their public noise and the public reference
    only. Returns :class:`ClusterNames`, whose ``table`` has one row per centroid: ``name``,
    ``share`` (of the neighbours with the voted type), ``nearest_type`` (the vote, matched or not)
    and ``distance``, the confidence of the name: :math:`\lVert \mu_j - \delta - m_t \rVert_2 /
    \sqrt{r_t^2 + p\, s_j^2}` (named when at most 1; the smaller, the surer).
    """
    points = np.asarray(points, dtype=np.float64)
    labels = np.asarray(labels).astype(str)
    centroids = np.asarray(centroids, dtype=np.float64)
    shift = common_shift(centroids, points, labels)
    centroids = centroids - shift
    nearest = _nearest_points(centroids, points, NEIGHBOURS)
    spread = np.zeros(len(centroids)) if noise is None else np.asarray(noise, dtype=np.float64)
    distances: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # each voted type's mean and cells' distances
    rows, centers, cell_radii = [], np.zeros_like(centroids), np.zeros(len(centroids))
    for j in range(len(centroids)):
        types, votes = np.unique(labels[nearest[j]], return_counts=True)
        best = types[votes.argmax()]
        if best not in distances:
            distances[best] = _type_distances(points[labels == best])
        centers[j], own = distances[best]
        allowed = np.sqrt(np.quantile(own, NAME_RADIUS_QUANTILE) ** 2 + points.shape[1] * spread[j] ** 2)
        gap = float(np.linalg.norm(centroids[j] - centers[j]))
        name = best if gap <= allowed else UNMATCHED
        cell_radii[j] = np.quantile(own, CELL_RADIUS_QUANTILE) if name != UNMATCHED else 0.0
        distance = gap / allowed if allowed > 0 else (np.inf if gap > 0 else 0.0)
        rows.append(
            {"name": name, "share": votes.max() / NEIGHBOURS, "nearest_type": best, "distance": distance}
        )
    table = pd.DataFrame(rows, index=pd.Index([str(j) for j in range(len(centroids))], name="cluster"))
    return ClusterNames(table, shift, centers, cell_radii)


def common_shift(
    centroids: np.ndarray, points: np.ndarray, labels: np.ndarray, rounds: int = 10
) -> np.ndarray:
    r"""Return the shift :math:`\delta` shared by the released centroids against the reference's types.

    A cohort whose condition differs from the reference's (a disease, a stimulation, another
    lab) moves every type's expression by much the same vector in log space. With the reference
    types' mean points :math:`m_t`, alternate :math:`t_j = \arg\min_t \lVert \mu_j - \delta - m_t
    \rVert` and :math:`\delta = \operatorname{median}_j (\mu_j - m_{t_j})` (per coordinate, so a
    cluster of a type the reference lacks does not move it), from :math:`\delta = 0`, for at most
    ``rounds`` rounds. Below :data:`MIN_SHIFT_CLUSTERS` centroids a median cannot tell a shared
    shift from one cluster's own type, so no shift is removed. Reads the released centroids and
    the public reference only (post-processing).
    """
    if len(centroids) < MIN_SHIFT_CLUSTERS:
        return np.zeros(centroids.shape[1])
    labels = np.asarray(labels).astype(str)
    kinds = np.unique(labels)
    means = np.stack([points[labels == kind].mean(axis=0) for kind in kinds])
    shift = np.zeros(centroids.shape[1])
    for _ in range(rounds):
        gaps = (centroids - shift)[:, None, :] - means[None]
        nearest = (gaps**2).sum(axis=-1).argmin(axis=1)
        moved = np.median(centroids - means[nearest], axis=0)
        if np.allclose(moved, shift):
            break
        shift = moved
    return shift


def type_spread(points: np.ndarray, quantile: float) -> tuple[np.ndarray, float]:
    """Return a type's mean point and radius (the ``quantile`` of its cells' distances to the mean)."""
    center, distances = _type_distances(points)
    return center, float(np.quantile(distances, quantile))


def _type_distances(points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return a type's mean point and its cells' distances to it."""
    center = points.mean(axis=0)
    return center, np.linalg.norm(points - center, axis=1)


def write_names(target: ad.AnnData, key: str, names: ClusterNames, cell_points: Any) -> dict[str, Any]:
    """Write each cell's name to ``obs[f"{key}_names"]``; return the clusters' names as ``uns`` stores them.

    ``cell_points``: each cell's point where the centroids were named (:meth:`ClusterNames.cell_names`).
    """
    clusters = target.obs[key].astype(str).astype(np.int64).to_numpy()
    target.obs[f"{key}_names"] = pd.Categorical(names.cell_names(clusters, cell_points))
    return names.table.to_dict(orient="index")


def _nearest_points(queries: np.ndarray, points: np.ndarray, m: int) -> np.ndarray:
    """Return the indices of each query's m nearest points (euclidean)."""
    squared = (queries**2).sum(1)[:, None] - 2 * queries @ points.T + (points**2).sum(1)[None, :]
    return np.argsort(squared, axis=1)[:, :m]
