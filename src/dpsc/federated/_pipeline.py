"""Flower apps of the federated private clustering: the private pipeline, run over sites.

The server runs ``run_clustering`` (post-processing only) and answers
each of its ``release_sum`` calls with one Flower round: every site computes the requested sum over
its own cells and adds its noise share (``Site``); the server obtains
the total through SecAgg+ (``mode="secure"``, :mod:`dpsc.federated._secagg`) or as the sum of the
sites' fully noised vectors (``mode="plain"``). A last round sends the released genes, loadings and
centroids to the sites, which label their own cells and write them into their own ``.h5ad``.

The same apps run in Flower's simulation engine (``cluster_federated``) and in a real
deployment (``dpsc federate server`` / ``dpsc federate site``, one SuperNode per site).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ..methods.cluster_design import BRANCHES
from ..methods.cluster_plan import ClusterPlan, plan_clustering
from ..methods.cluster_requests import Request
from ..methods.clustering import ClusterResult, run_clustering
from ..methods.kmeans import Assignment
from ..methods.markers import MarkerFrame
from ..methods.public_basis import PublicBasis, same_basis
from ..methods.release_kinds import REGISTRY
from ._guard import data_identity
from ._requires import require_flwr
from ._rounds import RoundResult, plain_round, read_request, reply_content, secure_round
from ._run_config import run_settings
from ._secagg import LIMBS, from_digit_means, to_digits, use_secure_masks
from ._simulation import ray_session, shared, simulate
from ._site import MODES, Site, SiteRefusal, SiteSettings

SECURE_MARK = "dpsc-secagg"
RUN_STATE = "dpsc-site-run"  # what a site remembers between the messages of one run

_SITES: dict[str, Site] = {}  # one loaded site per settings, per process


def _site(settings: SiteSettings) -> Site:
    key = json.dumps(settings.__dict__, sort_keys=True, default=data_identity)
    if key not in _SITES:
        _SITES[key] = Site(settings)
    return _SITES[key]


def site_settings_from(node_config: dict[str, Any], given: dict[int, SiteSettings] | None) -> SiteSettings:
    """Return the site's own settings: given (simulation), or the TOML file its ``node_config`` names."""
    if given is not None:
        return given[int(node_config["partition-id"])]
    if "settings" not in node_config:
        raise SiteRefusal(
            "This SuperNode has no site settings: start it with --node-config \"settings='site.toml'\" "
            "(dpsc federate site does)."
        )
    return SiteSettings.from_file(str(node_config["settings"]))


def dpsc_secagg_mod(msg, ctxt, call_next):
    """Flower's ``secaggplus_mod`` for SecAgg+ messages; other messages pass straight through.

    While the site's handler runs inside SecAgg+'s masked-vector stage, ``ctxt.state`` holds
    ``{"active": True, "threshold": t}`` under :data:`SECURE_MARK`, so the handler can check that a
    secure-mode request really travels masked, with the threshold it needs.
    """
    from flwr.app import ConfigRecord
    from flwr.client.mod import secaggplus_mod
    from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, RECORD_KEY_STATE

    use_secure_masks()
    if RECORD_KEY_CONFIGS not in msg.content.config_records:
        ctxt.state.config_records.pop(SECURE_MARK, None)
        return call_next(msg, ctxt)

    def marked(message, context):
        state = context.state.config_records.get(RECORD_KEY_STATE, {})
        context.state.config_records[SECURE_MARK] = ConfigRecord(
            {"active": True, "threshold": int(state.get("threshold", 0))}
        )
        try:
            return call_next(message, context)
        finally:
            context.state.config_records.pop(SECURE_MARK, None)

    return secaggplus_mod(msg, ctxt, marked)


def _payload(request: Request) -> list[np.ndarray]:
    genes = np.asarray(request.genes if request.genes is not None else [], dtype=np.int64)
    loadings = np.asarray(
        request.loadings if request.loadings is not None else np.zeros((0, 0)), dtype=np.float64
    )
    assignment = request.assignment.matrix if request.assignment is not None else np.zeros((0, 0))
    frame = request.frame.to_array() if request.frame is not None else np.zeros(0)
    columns = np.asarray(request.columns if request.columns is not None else [], dtype=np.int64)
    arrays = [genes, loadings, np.asarray(assignment, dtype=np.float64), frame, columns]
    return arrays + (basis_arrays(request.basis) if request.basis is not None else [])


def basis_arrays(basis: PublicBasis) -> list[np.ndarray]:
    """Return the public basis beside its genes and loadings: μ, s, shared genes, (T, R; R < 0: none)."""
    radius = -1.0 if basis.radius is None else float(basis.radius)
    return [
        np.asarray(basis.means, dtype=np.float64),
        np.asarray(basis.scales, dtype=np.float64),
        np.asarray(basis.shared, dtype=np.int64),
        np.array([float(basis.target_sum), radius]),
    ]


def basis_from_arrays(genes: np.ndarray, loadings: np.ndarray, arrays: list[np.ndarray]) -> PublicBasis:
    """Inverse of :func:`basis_arrays` (with the basis' genes and loadings)."""
    means, scales, shared, scalars = arrays
    target_sum, radius = (float(v) for v in np.asarray(scalars, dtype=np.float64).reshape(2))
    return PublicBasis(
        np.asarray(genes, dtype=np.int64),
        np.asarray(means, dtype=np.float64),
        np.asarray(scales, dtype=np.float64),
        np.asarray(loadings, dtype=np.float64),
        np.asarray(shared).astype(np.int64),
        target_sum,
        None if radius < 0 else radius,
    )


def describe_basis(
    own: PublicBasis, in_reference: PublicBasis, start: np.ndarray | None, radii: np.ndarray | None = None
) -> list[np.ndarray]:
    """Return what a site tells the server of its basis (public).

    The basis, its genes in the reference, the reference's marker centre on the shared genes
    (what the markers' statistics are measured from), the DP k-means' public start (the means of
    the reference's types, ``type_start``; no rows when the site's copy
    has no types) and those types' radii (``type_radii``).
    """
    start = np.zeros((0, own.n_comps)) if start is None else np.asarray(start, dtype=np.float64)
    radii = np.zeros(len(start)) if radii is None else np.asarray(radii, dtype=np.float64)
    return [
        np.asarray(own.genes, dtype=np.int64),
        np.asarray(own.loadings, dtype=np.float64),
        *basis_arrays(own),
        np.asarray(in_reference.genes, dtype=np.int64),
        np.asarray(in_reference.shared, dtype=np.int64),
        np.asarray(own.marker_center, dtype=np.float64),
        start,
        radii,
    ]


# requests without a gene list
#: What each kind's request carries on the wire, from the registry (``REGISTRY[kind].carries``).
NO_GENES = tuple(name for name, kind in REGISTRY.items() if "genes" not in kind.carries)
WITH_LOADINGS = tuple(name for name, kind in REGISTRY.items() if "loadings" in kind.carries)
WITH_FRAME = tuple(name for name, kind in REGISTRY.items() if "frame" in kind.carries)
WITH_ASSIGNMENT = tuple(name for name, kind in REGISTRY.items() if "assignment" in kind.carries)
FOCUSED = tuple(name for name, kind in REGISTRY.items() if "columns" in kind.carries)


#: The names of :func:`marker_arrays`' arrays (as the server saves them).
MARKER_ARRAYS = (
    "marker_table",
    "marker_frame",
    "marker_focus_genes",
    "marker_focus_table",
    "marker_focus_frame",
)


def marker_arrays(result: ClusterResult) -> list[np.ndarray]:
    """Return the released marker tables and frames as arrays (what every site receives at the end).

    The first table and its frame, then the focused table's genes, table and frame when there is one.
    """
    if result.marker_table is None:
        return []
    arrays = [result.marker_table, result.marker_frame.to_array()]
    if result.marker_focus_table is not None:
        genes = np.asarray(result.marker_focus_genes, dtype=np.int64)
        arrays += [genes, result.marker_focus_table, result.marker_focus_frame.to_array()]
    return arrays


def centroid_noise(result: ClusterResult) -> np.ndarray:
    """Each centroid's noise sd per coordinate (public: released counts and σ), 0 where not known.

    Sites name their clusters with it (``name_centroids``), as the
    central clustering does; it moves names only, never what a site releases.
    """
    noise = result.centroid_noise
    return np.zeros(len(result.centroids)) if noise is None else np.asarray(noise, dtype=np.float64)


def with_markers(result: ClusterResult, arrays: list[np.ndarray]) -> ClusterResult:
    """Set the marker tables of ``result`` from :func:`marker_arrays`' arrays (none: left as they are)."""
    if len(arrays) >= 2:
        result.marker_table, result.marker_frame = arrays[0], MarkerFrame.from_array(arrays[1])
    if len(arrays) >= 5:
        result.marker_focus_genes = np.asarray(arrays[2]).astype(np.int64)
        result.marker_focus_table, result.marker_focus_frame = arrays[3], MarkerFrame.from_array(arrays[4])
    return result


def _request(config: dict[str, Any], arrays: list[np.ndarray]) -> Request:
    """Return the request a site received (refused with a message when malformed)."""
    try:
        kind, index, sigma = str(config["kind"]), int(config["index"]), float(config["sigma"])
        genes, loadings, matrix, frame, *focused = arrays
        basis = None
        if int(config.get("public-basis", 0)) and kind in WITH_LOADINGS:
            focused, given = focused[:1], focused[1:]
            if len(given) != 4:
                raise ValueError("a request on a public basis without its basis")
            basis = basis_from_arrays(genes, loadings, given)
        assignment = None
        if kind in WITH_LOADINGS and (np.ndim(loadings) != 2 or np.shape(loadings)[0] != len(genes)):
            raise ValueError(f"loadings of shape {np.shape(loadings)} for {len(genes)} genes")
        if kind in WITH_ASSIGNMENT:
            assignment = Assignment(str(config["assignment"]), np.asarray(matrix, dtype=np.float64))
        columns = None
        if kind in FOCUSED:
            if len(focused) != 1 or np.ndim(focused[0]) != 1:
                raise ValueError("a focused marker request without its gene list")
            columns = np.asarray(focused[0]).astype(np.int64)
        return Request(
            kind,
            index,
            sigma,
            genes=np.asarray(genes, dtype=np.int64) if kind not in NO_GENES else None,
            loadings=np.asarray(loadings, dtype=np.float64) if kind in WITH_LOADINGS else None,
            assignment=assignment,
            frame=MarkerFrame.from_array(frame) if kind in WITH_FRAME else None,
            columns=columns,
            basis=basis,
            branch=str(config.get("branch", "")),
        )
    except (KeyError, ValueError, TypeError) as err:
        raise SiteRefusal(f"Malformed request from the server ({err!r}); nothing was sent.") from None


def _releases_of(plan: ClusterPlan, run_state: dict[str, Any]) -> str:
    """Return the run's number of releases as a site tells its data manager (a gated run: its branch's)."""
    if not plan.gated:
        return str(plan.n_releases)
    branch = run_state.get("branch")
    return str(plan.branch(branch).n_releases) if branch in BRANCHES else f"up to {plan.most_releases}"


class SiteHandler:
    """What a site does with one message of the federated clustering (the ClientApp's ``fit``).

    Parameters
    ----------
    context
        Flower's context of the message (node config, per-run state).
    site_settings
        The sites' settings by partition id (simulation); ``None``: the TOML file ``node_config``
        names (deployment).
    """

    def __init__(self, context, site_settings: dict[int, SiteSettings] | None = None) -> None:
        self.context, self.site_settings = context, site_settings

    def fit(self, parameters: list[np.ndarray], config: dict[str, Any]) -> tuple[list[np.ndarray], int, dict]:
        """Answer one request: a release (the noisy vector), ``describe`` or ``finish``; or refuse.

        A refusal (:class:`SiteRefusal`) is written to the site's ``refusal_file`` by the runner
        that serves a deployed site (:class:`~dpsc.federated._own_app.OwnAppRunner`), where
        ``dpsc federate site`` reads it for the data manager.
        """
        settings = site_settings_from(dict(self.context.node_config), self.site_settings)
        return self._answer(settings, parameters, config)

    def _answer(
        self, settings: SiteSettings, parameters: list[np.ndarray], config: dict[str, Any]
    ) -> tuple[list[np.ndarray], int, dict]:
        from flwr.app import ConfigRecord

        if any(str(key).replace("_", "-") == "noise-seed" for key in config):
            raise SiteRefusal(
                "The server sent a noise seed; a site draws its noise from its own secret source."
            )
        if str(config.get("task", "")) != "pipeline":
            raise SiteRefusal(f"Unknown task {config.get('task')!r}; this site serves 'pipeline'.")
        site = _site(settings)
        try:
            plan = ClusterPlan.from_config(dict(config))
            mode, threshold, n_sites = str(config["mode"]), int(config["threshold"]), int(config["n-sites"])
            kind = str(config["kind"])
        except (KeyError, ValueError, TypeError) as err:
            raise SiteRefusal(f"Malformed request from the server ({err!r}); nothing was sent.") from None
        if mode not in MODES:
            raise SiteRefusal(f"Unknown aggregation mode {mode!r}; a site serves {MODES}.")
        reference = str(config.get("reference-fingerprint", ""))
        if kind == "describe":  # public facts the plan needs: the numbers of genes and of cells
            counts = [np.array([site.adata.n_vars, site.adata.n_obs], dtype=np.int64)]
            described = describe_basis(*site.basis_and_start(reference, plan.n_clusters)) if reference else []
            return counts + described, 1, {}
        if plan.n_vars <= 0:
            raise SiteRefusal("Malformed request from the server: the plan has no genes; nothing was sent.")
        records = self.context.state.config_records
        run_state = json.loads(records[RUN_STATE]["json"]) if RUN_STATE in records else {}
        if kind == "finish":
            try:
                genes, loadings, eigenvalues, centroids, noise, *markers = parameters
                result = ClusterResult(genes.astype(np.int64), loadings, eigenvalues, centroids)
                result.centroid_noise = np.asarray(noise, dtype=np.float64).reshape(len(centroids))
            except (ValueError, TypeError, AttributeError) as err:
                raise SiteRefusal(
                    f"Malformed results from the server ({err!r}); nothing was written."
                ) from None
            if plan.markers:
                with_markers(result, markers)
            path = site.finish(result, plan, mode, threshold, n_sites, run_state, reference)
            records[RUN_STATE] = ConfigRecord({"json": json.dumps(run_state)})
            if self.site_settings is None:  # a deployed site: its data manager reads its terminal
                print(f"Results written to {path}. {site.spent_words()}", flush=True)
            return [], 1, {}
        if mode == "secure":
            self._check_secure(threshold)
        vector = site.contribute(
            plan, _request(dict(config), parameters), mode, threshold, n_sites, run_state, reference
        )
        records[RUN_STATE] = ConfigRecord({"json": json.dumps(run_state)})
        if self.site_settings is None:
            print(
                f"Release {int(config['index']) + 1} of {_releases_of(plan, run_state)} ({kind}) sent. "
                f"{site.spent_words()}",
                flush=True,
            )
        return (to_digits(vector) if mode == "secure" else [vector]), 1, {}

    def _check_secure(self, threshold: int) -> None:
        mark = self.context.state.config_records.get(SECURE_MARK)
        if mark is None or not mark.get("active"):
            raise SiteRefusal(
                "A secure-mode request arrived outside SecAgg+: this site's noise share alone is not enough "
                "noise to send in the clear."
            )
        if int(mark["threshold"]) < threshold:
            raise SiteRefusal(
                f"SecAgg+ runs with threshold {mark['threshold']}, below the {threshold} this site's noise "
                "share "
                "assumes."
            )


def make_client_app(site_settings: dict[int, SiteSettings] | None = None):
    """Return the site's ClientApp: release requests and the final labelling (:class:`SiteHandler`).

    One Message-API handler answers every request, plain or inside SecAgg+ (whose mod masks the
    reply); requests and replies use the fit layout of :mod:`._rounds`.
    """
    from flwr.app import Message
    from flwr.clientapp import ClientApp

    app = ClientApp(mods=[dpsc_secagg_mod])

    @app.train()
    def answer(message, context):
        arrays, config = read_request(message.content)
        vectors, _, _ = SiteHandler(context, site_settings).fit(arrays, config)
        return Message(content=reply_content(vectors), reply_to=message)

    return app


class Rounds:
    """The run's rounds, one per message to the sites (``secure_round`` when ``secure``).

    The first round waits up to the run's timeout for all ``n_sites`` to connect; later rounds
    wait only until ``needed`` sites are connected (a secure release's threshold; one site for a
    plain release, whose every vector carries the full noise) and go to every site connected then,
    so a site that dropped out (killed, or reported unavailable by the SuperLink after its missed
    heartbeats) delays one round, not every round, and a site list that is briefly short (a busy
    machine) is waited for. Whether the replies are enough is still the caller's rule.
    """

    def __init__(self, grid, context, n_sites: int, timeout: float, needed: int) -> None:
        self.grid, self.context, self.n_sites, self.timeout = grid, context, n_sites, timeout
        self.needed = needed
        self.joined = False

    def __call__(self, config: dict[str, Any], payload: list[np.ndarray], secure: bool) -> RoundResult:
        """Run one round; return the replies and failures."""
        n_wait = self.needed if self.joined else self.n_sites
        if secure:
            threshold = int(config["threshold"])
            result = secure_round(self.grid, self.context, config, payload, n_wait, self.timeout, threshold)
        else:
            result = plain_round(self.grid, config, payload, n_wait, self.timeout)
        self.joined = True
        return result


class ReleaseLog:
    """What the server saw of each release: contributors, failures, bytes each site sent."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def add(self, request: Request, contributors: int, failures: list[str], bytes_per_site: int) -> None:
        """Record one release."""
        self.rows.append(
            {
                "index": request.index,
                "kind": request.kind,
                "contributors": contributors,
                "failures": failures,
                "bytes_per_site": bytes_per_site,
            }
        )


def pipeline_apps(
    settings: dict[str, Any] | None,
    site_settings: dict[int, SiteSettings] | None = None,
    sink: dict[str, Any] | None = None,
):
    """Build the clustering's ``(ServerApp, ClientApp)`` pair (through :func:`dpsc.federated.make_apps`)."""
    return make_server_app(settings, sink), make_client_app(site_settings)


def make_server_app(settings: dict[str, Any] | None = None, sink: dict[str, Any] | None = None):
    """Return the server's ServerApp: plans the clustering, runs its releases over the sites, sends it.

    The released result and the run's summary go to ``sink`` (``"result"``: a
    :class:`~dpsc.methods.clustering.ClusterResult`, ``"summary"``: a dict) when one is given,
    as in a simulation in this process, and to ``result.npz`` and ``summary.json`` in the run
    configuration's ``out-dir`` when it names one.
    """
    from flwr.serverapp import ServerApp

    base = run_settings("pipeline", settings)
    app = ServerApp()

    @app.main()
    def main(grid, context) -> None:
        s = run_settings("pipeline", base, dict(context.run_config))
        if s["task"] != "pipeline":
            raise ValueError(f"This ServerApp runs the task 'pipeline', not {s['task']!r}.")
        mode, n_sites = str(s["mode"]), int(s["n-sites"])
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}.")
        threshold = int(s["threshold"]) or n_sites
        if mode == "plain":
            threshold = 1
        save = _saver(sink, s["out-dir"])
        start = time.perf_counter()
        epsilon = None if float(s["epsilon"]) < 0 else float(s["epsilon"])
        needed = threshold if mode == "secure" else 1
        rounds = Rounds(grid, context, n_sites, float(s["timeout"]), needed)
        plan, basis = _plan(rounds, s, epsilon, mode, threshold, n_sites)
        common = {
            "task": "pipeline",
            "mode": mode,
            "threshold": threshold,
            "n-sites": n_sites,
            "reference-fingerprint": str(s["reference-fingerprint"]),
            **plan.to_config(),
        }
        log = ReleaseLog()

        def release_sum(request: Request) -> np.ndarray:
            config = {**common, "kind": request.kind, "index": request.index, "sigma": request.sigma}
            if request.branch:  # the start a gated plan's count chose (public: a released value's map)
                config["branch"] = request.branch
            if request.assignment is not None:
                config["assignment"] = request.assignment.kind
            round_ = rounds(config, _payload(request), secure=mode == "secure")
            replies = round_.replies
            if len(replies) < needed:
                raise RunStopped(release_failure(request, round_, needed, mode))
            spec = request.release(plan.n_vars)
            if mode == "secure":
                total = from_digit_means(replies[0][:LIMBS], len(replies))
                sent = LIMBS * spec.size * 8
            else:
                total = np.sum([np.asarray(r[0], dtype=np.int64) for r in replies], axis=0)
                sent = spec.size * 8
            log.add(request, len(replies), round_.failures, sent)
            return spec.decode(total)

        summary = {"plan": plan.to_config(), "mode": mode, "threshold": threshold, "n_sites": n_sites}
        try:
            result = run_clustering(plan, release_sum, basis)
        except RunStopped as stopped:
            summary |= {"releases": log.rows, "wall_s": time.perf_counter() - start, "error": str(stopped)}
            save(summary, None)
            raise
        finish = {**common, "kind": "finish"}
        arrays = [result.genes, result.loadings, result.eigenvalues, result.centroids, centroid_noise(result)]
        arrays += marker_arrays(result)  # every site receives the released marker tables
        rounds(finish, arrays, secure=False)
        summary |= {"releases": log.rows, "wall_s": time.perf_counter() - start}
        if plan.gated:  # the start the count chose
            summary["start"] = result.plan.start
        save(summary, result)

    return app


def _saver(sink: dict[str, Any] | None, out_dir: str):
    """Return ``save(summary, result)``: into ``sink`` and/or as files in ``out_dir``.

    ``sink``: a simulation in this process; ``out_dir``: ``result.npz`` and ``summary.json``.
    """
    if sink is None and not out_dir:
        raise ValueError("The server needs an out-dir (run configuration) to write its result to.")

    def save(summary: dict[str, Any], result: ClusterResult | None) -> None:
        if sink is not None:
            sink["summary"], sink["result"] = summary, result
        if not out_dir:
            return
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        if result is not None:
            arrays = [result.genes, result.loadings, result.eigenvalues, result.centroids]
            arrays += marker_arrays(result)
            names = ("genes", "loadings", "eigenvalues", "centroids", *MARKER_ARRAYS)
            np.savez(
                out / "result.npz",
                **dict(zip(names, arrays, strict=False)),
                clusters_in_use=np.array(result.clusters_in_use),
            )
        (out / "summary.json").write_text(json.dumps(summary, indent=1))

    return save


class RunStopped(RuntimeError):
    """The server stops a run: a release got fewer contributions than it needs (the message says why)."""


def site_failures(failures: list[str]) -> list[str]:
    """Each failed site's reason in words: its refusal (the site's own message) or Flower's error."""
    reasons = []
    for failure in failures:
        refused = re.search(r"SiteRefusal'>:<'(.*?)'>", failure, re.S)
        if refused:
            reasons.append(f"refused: {refused.group(1)}")
        elif "Node Unavailable" in failure:
            reasons.append("stopped or disconnected (no heartbeat)")
        else:
            reasons.append(f"failed: {failure[:300]}")
    return reasons


def release_failure(request: Request, round_: RoundResult, needed: int, mode: str) -> str:
    """Say which release failed, how many sites contributed and why the others did not."""
    contributed, reasons = len(round_.replies), site_failures(round_.failures)
    silent = max(round_.sent - contributed - len(reasons), 0)
    parts = [
        f"Release {request.index} ({request.kind}): {contributed} of the {round_.sent} connected sites "
        f"contributed, fewer than the {needed} the run needs; the run stops and nothing more is released."
    ]
    if mode == "secure" and not round_.aggregated:
        parts.append(
            f"Secure aggregation (SecAgg+) halted: it needs {needed} sites (the threshold) to answer each "
            "of its stages, and fewer did."
        )
    if reasons:
        parts.append("Sites that answered with an error: " + "; ".join(r.rstrip(".") for r in reasons) + ".")
    if silent and round_.aggregated:
        parts.append(f"{silent} site(s) did not answer in time (stopped, disconnected or too slow).")
    elif not reasons:
        parts.append(
            "No site's reason reached the server (in secure mode a refusing site answers nothing): each "
            "site's own log says whether it refused, stopped, disconnected or timed out."
        )
    return " ".join(parts)


def _plan(
    rounds: Rounds, s: dict, epsilon, mode: str, threshold: int, n_sites: int
) -> tuple[ClusterPlan, PublicBasis | None]:
    """Return the run's plan (and its public basis); what the plan needs is asked from the sites.

    The numbers of genes and cells are public facts (every site's record treats its number of cells
    as public): the sites must agree on the genes, and their cells add up to the n that chooses the
    genes the PCA reads. On a public reference (``reference-fingerprint``) each site computes the
    basis from its own copy of the reference; all must describe the same basis, which the plan uses.
    """
    n_vars, n_obs = int(s["n-vars"]), int(s.get("n-obs", 0))
    fingerprint = str(s.get("reference-fingerprint", ""))
    basis = None
    if n_vars <= 0 or n_obs <= 0 or fingerprint:
        probe = plan_clustering(epsilon, float(s["delta"]), n_vars=3, n_clusters=int(s["n-clusters"]))
        config = {
            "task": "pipeline",
            "mode": mode,
            "threshold": threshold,
            "n-sites": n_sites,
            "kind": "describe",
            "reference-fingerprint": fingerprint,
            **probe.to_config(),
            "n-vars": 0,
        }
        replies = rounds(config, [], secure=False)
        answers = {int(r[0][0]) for r in replies.replies}
        if len(answers) != 1 or len(replies.replies) < n_sites:
            reasons = site_failures(replies.failures)
            raise RuntimeError(
                f"The sites disagree on the number of genes or did not answer: {answers}, {reasons}"
            )
        if n_vars > 0 and answers != {n_vars}:
            raise RuntimeError(f"The run is set for {n_vars} genes; the sites hold {answers.pop()}.")
        n_vars = answers.pop()
        n_obs = sum(int(r[0][1]) for r in replies.replies)
        if fingerprint:
            basis = _agreed_basis([r[1:] for r in replies.replies])
    return (
        plan_clustering(
            epsilon,
            float(s["delta"]),
            n_vars=n_vars,
            n_clusters=int(s["n-clusters"]),
            n_obs=n_obs,
            random_state=int(s["random-state"]),
            markers=bool(int(s.get("markers", 0))),
            public_basis=basis,
            unit="donor" if int(s.get("donor-unit", 0)) else "cell",
        ),
        basis,
    )


def _agreed_basis(described: list[list[np.ndarray]]) -> PublicBasis:
    """Return the basis every site described (:func:`describe_basis`); refuse the run if they differ.

    The k-means starts from the reference types' means when every site described the same ones
    and their radii (public post-processing; each site checks only the plan it implies: with them,
    the count that chooses between that start and the sketch), else from its sketch.
    """
    bases, starts, radii = [], [], []
    for arrays in described:
        if len(arrays) != 11:
            raise RuntimeError("A site described no public basis; the run on a public reference stops.")
        genes, loadings, *rest = arrays
        center = np.asarray(rest[6], dtype=np.float64)
        bases.append(replace(basis_from_arrays(genes, loadings, rest[:4]), marker_center=center))
        starts.append(np.asarray(rest[7], dtype=np.float64))
        radii.append(np.asarray(rest[8], dtype=np.float64))
    if not all(same_basis(other, bases[0]) for other in bases[1:]):
        raise RuntimeError(
            "The sites computed different public bases from their copies of the reference (the same "
            "fingerprint, another gene list or another version of dpsc or scanpy); the run stops."
        )

    def same(arrays: list[np.ndarray]) -> bool:
        return all(a.shape == arrays[0].shape and np.allclose(a, arrays[0]) for a in arrays)

    agreed = len(starts[0]) > 0 and len(radii[0]) == len(starts[0]) and same(starts) and same(radii)
    return bases[0].with_start(starts[0], radii[0]) if agreed else bases[0].with_start(None)


def run_pipeline_simulation(
    server_settings: dict[str, Any], site_settings: list[SiteSettings], n_cpus: int = 2
) -> tuple[ClusterResult, dict[str, Any]]:
    """Run the apps in Flower's simulation engine, one SuperNode per site; return the result and summary.

    Everything stays in memory: a site whose cells are an AnnData gets them through Ray's object
    store (``shared``), and the server hands its result back to this process
    (it also writes it to ``out-dir`` when ``server_settings`` names one).
    """
    require_flwr()
    sink: dict[str, Any] = {}
    with ray_session(n_cpus):
        references: dict[int, Any] = {}  # one shared copy of each in-memory reference

        def reference(value: Any) -> Any:
            if value is None or isinstance(value, str | Path):
                return value
            return references.setdefault(id(value), shared(value))

        sites = [
            replace(s, data=shared(s.data), reference=reference(s.reference)) if s.in_memory else s
            for s in site_settings
        ]
        simulate(
            make_server_app(server_settings, sink),
            make_client_app(dict(enumerate(sites))),
            len(sites),
            n_cpus,
        )
    if "summary" not in sink:
        raise RuntimeError("The federated clustering ended without a result; see the Flower log above.")
    summary = sink["summary"]
    if "error" in summary:
        raise RuntimeError(f"The federated clustering stopped. {summary['error']}")
    return sink["result"], summary


def read_result(out: str | Path) -> ClusterResult:
    """Return the released genes, loadings and centroids a server wrote to ``out``."""
    with np.load(Path(out) / "result.npz") as saved:
        result = ClusterResult(
            saved["genes"].astype(np.int64),
            saved["loadings"],
            saved["eigenvalues"],
            saved["centroids"],
            clusters_in_use=int(saved["clusters_in_use"]) if "clusters_in_use" in saved else None,
        )
        return with_markers(result, [saved[name] for name in MARKER_ARRAYS if name in saved])
