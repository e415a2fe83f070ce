r"""A one-run black-box audit of a whole DP-DCAN fit with input canaries (inserted cells).

:math:`m` canary cells are made from the data without looking at any label: each is a real
cell whose counts are permuted across genes (same library size and sparsity, no gene-gene
structure, so unlike every real cell). Each canary is added to the training cells independently
with probability ½, one default :func:`dpsc.tl.fit` runs on the union, and the auditor scores
every canary from the released model only:

- ``"view agreement"``: the mean cosine between the latents of masked views of the canary,
  computed with the shared encoder (:func:`dpsc.audit.encoder_features`; the quantity the
  instance stage trains up on its cells) — what anyone holding ``export_shared``'s output can
  compute;
- ``"reconstruction"``: minus the canary's reconstruction loss through the decoder
  (:func:`dpsc.audit.reconstruction_loss`). Under ``scope="full"`` the decoder is covered by
  the ε and under ``scope="encoder"`` it never reads a cell; under ``scope="paper"`` it is never
  shared, and this score measures what it would let through if it were.

Each score gives one bound with :func:`dpsc.audit.one_run_bound` (top and bottom
``guess_fraction`` guessed), at confidence :math:`1 - \alpha/2` so that the two bounds hold
together at the stated :math:`1 - \alpha` (Bonferroni). A canary is one cell, so the fit's
(ε, δ) with respect to one cell is the claim the bound is tested against.

**At the donor level** (``donor_key``) each canary is a donor: up to :data:`CANARY_DONOR_CELLS`
cells of one real donor, each permuted across genes, under a donor ID of its own, included with
probability ½ as a whole; the fit runs with ``donor_key`` and a canary donor's score is the mean of
its cells'. Each real donor is the source of at most one canary donor, so the fit's guarantee per
donor covers it at group size 2, as per cell.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from typing import Any

import anndata as ad
import numpy as np
import scipy.sparse as sp

from .._api import renamed_arguments
from ._features import encoder_features, reconstruction_loss
from ._one_run import one_run_bound

SCORES = ("view agreement", "reconstruction")
#: Cells of each canary donor in a donor-level audit (public; the bound holds whatever the size).
CANARY_DONOR_CELLS = 5
#: The donor ID of canary donor j is this prefix followed by j.
CANARY_PREFIX = "dpsc-canary-"


def make_input_canaries(matrix, n_canaries: int, rng: np.random.Generator) -> sp.csr_matrix:
    """``n_canaries`` distinct real cells, each with its counts permuted across genes.

    Each source cell appears at most twice in the audited fit (itself and its canary), so the
    fit's guarantee covers it at group size 2 (:func:`input_canary_run`).
    """
    if n_canaries > matrix.shape[0]:
        raise ValueError(
            f"n_canaries={n_canaries} is more than the {matrix.shape[0]} cells the canaries are made from; "
            "ask for at most that many."
        )
    X = sp.csr_matrix(matrix)
    rows = []
    for cell in rng.choice(X.shape[0], n_canaries, replace=False):
        dense = X[cell].toarray().ravel()
        rows.append(dense[rng.permutation(dense.size)])
    return sp.csr_matrix(np.vstack(rows).astype(np.float32))


def make_canary_donors(
    matrix, codes: np.ndarray, n_canaries: int, rng: np.random.Generator
) -> tuple[sp.csr_matrix, np.ndarray]:
    """``n_canaries`` canary donors, each from one distinct real donor (module docstring).

    Returns the canary cells and each one's canary donor (``0 … n_canaries-1``). ``codes``: each
    real cell's donor code (:func:`dpsc.privacy.donor_codes`).
    """
    n_donors = int(np.max(codes)) + 1
    if n_canaries > n_donors:
        raise ValueError(
            f"n_canaries={n_canaries} canary donors need as many real donors to make them from; these cells "
            f"have {n_donors}. Ask for at most that many."
        )
    X = sp.csr_matrix(matrix)
    rows, owner = [], []
    for j, donor in enumerate(rng.choice(n_donors, n_canaries, replace=False)):
        cells = np.flatnonzero(codes == donor)
        for cell in rng.choice(cells, min(CANARY_DONOR_CELLS, cells.size), replace=False):
            dense = X[cell].toarray().ravel()
            rows.append(dense[rng.permutation(dense.size)])
            owner.append(j)
    return sp.csr_matrix(np.vstack(rows).astype(np.float32)), np.asarray(owner)


@renamed_arguments("dpsc.audit.input_canary_run", seed="random_state")
def input_canary_run(
    adata: ad.AnnData,
    *,
    fit: Callable,
    epsilon: float | None,
    delta: float = 1e-5,
    n_canaries: int = 1000,
    guess_fraction: float = 0.1,
    confidence: float = 0.95,
    random_state: int = 0,
    noise_seed: int | None = None,
    layer: str | None = None,
    donor_key: str | None = None,
    **fit_kwargs: Any,
) -> dict[str, Any]:
    """Train one DP-DCAN fit with input canaries and bound its ε from the released model.

    ``fit`` is :func:`dpsc.tl.fit` (passed in, so that this module does not import ``dpsc.tl``).
    Returns ``rows`` (one per score: ``score``, ``epsilon_lower``, ``ceiling``, ``n_guesses``,
    ``n_correct``, ``n_canaries``, ``confidence``), ``epsilon_claimed``, ``guarantee`` and the fit's
    privacy ``record``. ``random_state`` seeds the canaries and the fit. ``donor_key``: canary
    donors and a donor-level fit (module docstring).
    """
    from ..model import SharedEncoder
    from ..privacy import donor_codes, get_record

    rng = np.random.default_rng(random_state)
    cells = sp.csr_matrix(adata.layers[layer] if layer else adata.X, dtype=np.float32)
    if donor_key is None:
        canaries, owner = make_input_canaries(cells, n_canaries, rng), np.arange(n_canaries)
    else:
        codes = donor_codes(adata, donor_key, "dpsc.tl.audit")
        canaries, owner = make_canary_donors(cells, codes, n_canaries, rng)
    included = rng.random(n_canaries) < 0.5
    train = ad.AnnData(sp.vstack([cells, canaries[included[owner]]]).tocsr())
    train.var_names = adata.var_names.copy()
    options = {"progress_bar": False, "random_state": random_state, "noise_seed": noise_seed, **fit_kwargs}
    if donor_key is not None:
        donors = adata.obs[donor_key].astype(str).to_numpy()
        if any(d.startswith(CANARY_PREFIX) for d in donors):
            raise ValueError(
                f"obs[{donor_key!r}] has IDs starting {CANARY_PREFIX!r}, the audit's canaries' own."
            )
        added = [f"{CANARY_PREFIX}{j}" for j in owner[included[owner]]]
        train.obs[donor_key] = np.concatenate([donors, np.asarray(added, dtype=object)])
        options["donor_key"] = donor_key
    model = fit(train, epsilon=epsilon, delta=delta, return_model=True, **options)
    record = get_record(train, "X_dpdcan")
    with tempfile.TemporaryDirectory() as tmp:
        shared = SharedEncoder.load(model.export_shared(tmp))
    _, agreement = encoder_features(shared.module, canaries, random_state=random_state)
    per_cell = {"view agreement": agreement, "reconstruction": -reconstruction_loss(model.module, canaries)}
    sizes = np.bincount(owner, minlength=n_canaries)
    scores = {name: np.bincount(owner, np.asarray(v), n_canaries) / sizes for name, v in per_cell.items()}
    k = int(guess_fraction * n_canaries)
    per_test = 1 - (1 - confidence) / len(scores)
    guesses = {"k_plus": k, "k_minus": k, "delta": delta, "confidence": per_test}
    rows = [{"score": name, **one_run_bound(values, included, **guesses)} for name, values in scores.items()]
    return {
        "rows": rows,
        "epsilon_claimed": record["epsilon"] if epsilon is not None else None,
        "guarantee": record["guarantee"],
        "record": model.privacy_record(),
        "scope": fit_kwargs.get("scope", "encoder"),
    }
