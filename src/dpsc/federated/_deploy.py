"""A real deployment of a federated task: Flower's SuperLink, SuperNodes and ``flwr run``.

``dpsc federate server --task NAME`` (:func:`run_server`) starts a SuperLink, writes a Flower app
project whose components are the task's apps (:data:`~dpsc.federated.TASKS`: the private
clustering, ``pipeline``, or ``fedsc``), submits it with ``flwr run`` and stops the SuperLink when
the run ends. ``dpsc federate site --task NAME`` (:func:`run_site`) starts one SuperNode whose
``node_config`` names the site's own settings file, and answers its tasks with the task's ClientApp
of its own installation, never with code from the server's bundle; it stops when the site has
written its results (or refused), or at the timeout. Every process is bounded in time and stopped
on exit. Without TLS certificates the processes run with Flower's ``--insecure`` (no encryption of
the messages: loopback or a trusted network only); certificate files are passed through.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ._apps import SUMMARY_FILE, federated_task
from ._own_app import OwnAppRunner, app_fingerprint, toml_value, write_app_project
from ._requires import require_flwr, require_site_flwr
from ._run_config import run_settings
from ._site import SiteSettings

#: Seconds a site waits, once it has reached the SuperLink, for it to answer again before it
#: concludes that the server stopped.
SERVER_GONE_AFTER = 4.0
#: Seconds a site that refused keeps its SuperNode up, so that the refusal reaches the server.
REPLY_GRACE = 4.0


def wait_for_port(host: str, port: int, timeout: float) -> None:
    """Wait until something listens on ``host:port`` (or raise)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1.0):
            return
        time.sleep(0.2)
    raise TimeoutError(f"Nothing listens on {host}:{port} after {timeout:.0f} s.")


def free_port() -> int:
    """Return a TCP port free on loopback now (for tests and a default)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:
    """Ask Linux to kill this child (SIGKILL) when the dpsc process that started it dies.

    Runs in the child before ``exec`` (``prctl(PR_SET_PDEATHSIG)``), so that a killed site or server
    leaves no SuperNode or SuperLink behind.
    """
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


@contextlib.contextmanager
def _process(command: list[str], log: Path, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen]:
    with open(log, "w") as out:
        process = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
        try:
            yield process
        finally:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


def _tls(certificates: dict[str, str | None]) -> list[str]:
    given = {k: v for k, v in certificates.items() if v}
    if not given:
        return ["--insecure"]
    return [arg for key, value in given.items() for arg in (f"--{key}", value)]


def run_server(
    *,
    n_sites: int,
    out: str | Path,
    task: str = "pipeline",
    host: str = "127.0.0.1",
    port: int = 8000,
    timeout: float = 600.0,
    certificates: dict[str, str | None] | None = None,
    **config: Any,
) -> dict[str, Any]:
    """Start a SuperLink, run ``task`` over ``n_sites`` SuperNodes, stop; return the run's summary.

    ``task``: the federated task, by name (``"pipeline"``: the private clustering; ``"fedsc"``).
    ``config`` takes the task's run configuration (``PIPELINE`` or ``FEDSC``, underscores for
    dashes: ``mode``, ``epsilon``, ``n_clusters``, … or ``rounds``, ``n_genes``, …); a key the task
    does not take raises ``ValueError`` before anything starts.
    """
    spec = federated_task(task)
    settings = run_settings(task, {k.replace("_", "-"): v for k, v in config.items()})
    spec.check(settings, int(n_sites))
    require_flwr()
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    settings.update({"n-sites": int(n_sites), "out-dir": str(out / "result")})
    if "timeout" in settings:
        settings["timeout"] = float(timeout)
    project = write_app_project(out / "app", task)  # the same files as every site's own app
    started = time.monotonic()
    submit_app(project, settings, out, host=host, port=port, timeout=timeout, certificates=certificates)
    summary_file = out / "result" / SUMMARY_FILE
    if not summary_file.exists():
        raise RuntimeError(
            f"The federated run ended without a result after {time.monotonic() - started:.0f} s; see "
            f"{out / 'run.log'} (a site's refusal or a site that stopped appears there)."
        )
    summary = json.loads(summary_file.read_text())
    if "error" in summary:
        raise RuntimeError(f"The federated run stopped after {summary['wall_s']:.0f} s. {summary['error']}")
    return summary


def submit_app(
    project: Path,
    run_config: dict[str, Any],
    out: Path,
    *,
    host: str,
    port: int,
    timeout: float,
    certificates: dict[str, str | None] | None = None,
) -> None:
    """Start a SuperLink, submit the app ``project`` with ``run_config`` (``flwr run``), stop at its end.

    The run configuration travels as ``--run-config`` overrides, so the bundle's files are the
    same for every run of one dpsc version (what each site compares with its own app).
    """
    home = out / "flwr-home"
    home.mkdir(parents=True, exist_ok=True)
    address = f"{'127.0.0.1' if host == '0.0.0.0' else host}:{port}"
    insecure = "--insecure" in _tls(certificates or {})
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "dpsc"\n\n[superlink.dpsc]\naddress = "{address}"\n'
        f"insecure = {str(insecure).lower()}\n"
    )
    env = {**os.environ, "FLWR_HOME": str(home)}
    config_file = out / "run-config.toml"
    config_file.write_text("".join(f"{k} = {toml_value(v)}\n" for k, v in run_config.items()))
    command = ["flower-superlink", *_tls(certificates or {}), "--host", host, "--port", str(port)]
    with _process(command, out / "superlink.log", env):
        wait_for_port("127.0.0.1" if host == "0.0.0.0" else host, port, 60)
        with open(out / "run.log", "w") as run_log:
            try:
                subprocess.run(
                    ["flwr", "run", str(project), "dpsc", "--stream", "--run-config", str(config_file)],
                    env=env,
                    stdout=run_log,
                    stderr=subprocess.STDOUT,
                    timeout=timeout,
                )
            except subprocess.TimeoutExpired:
                raise TimeoutError(
                    f"The federated run did not end within {timeout:.0f} s and was stopped; see "
                    f"{out / 'run.log'} (raise --timeout for slow sites or large data)."
                ) from None


def write_site_settings(settings: SiteSettings, path: str | Path) -> Path:
    """Write a site's settings as the TOML file its SuperNode's ``node_config`` names."""
    values = {k: v for k, v in settings.__dict__.items() if v is not None}
    if settings.epsilon is None:
        values["epsilon"] = "none"
    path = Path(path)
    path.write_text("".join(f"{k} = {toml_value(v)}\n" for k, v in values.items()))
    return path


def _reachable(address: str) -> bool:
    """Whether something accepts a TCP connection at ``HOST:PORT`` now."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=1.0):
            return True
    except (OSError, ValueError):
        return False


class _ServerWatch:
    """Tells when a SuperLink that was reached stops answering for :data:`SERVER_GONE_AFTER` seconds."""

    def __init__(self, address: str) -> None:
        self.address, self.seen, self.silent_since = address, False, None

    def gone(self) -> bool:
        """Probe once; return whether the server has stopped."""
        if _reachable(self.address):
            self.seen, self.silent_since = True, None
            return False
        if not self.seen:
            return False  # the server may not have started yet: the site's timeout applies
        self.silent_since = self.silent_since or time.monotonic()
        return time.monotonic() - self.silent_since >= SERVER_GONE_AFTER


def run_site(
    settings_file: str | Path,
    *,
    superlink: str,
    task: str = "pipeline",
    port: int | None = None,
    timeout: float = 600.0,
    root_certificates: str | None = None,
) -> Path:
    """Start this site's SuperNode; stop once its results are written (return their path) or it refused.

    ``task``: the one federated task this site serves, by name (``"pipeline"``: the private
    clustering; ``"fedsc"``); a server that submits another task's bundle is refused. The
    SuperNode runs no code of the server's: it is started with ``--isolation process`` and no
    dependency installation, and this process answers its tasks with the task's ClientApp of its own
    installation, after checking that the server's app bundle is this site's own (the same files,
    task and dpsc code; :func:`~dpsc.federated.app_fingerprint`). It also stops, within seconds,
    when the server stops (its SuperLink no longer answers) or at the timeout. A refusal raises
    ``ValueError`` with the site's reason (its own message); the SuperNode's log is a temporary
    file, removed after a completed or refused run and named in the error of a failed or timed-out
    one.
    """
    require_site_flwr()
    federated_task(task)
    settings_file = Path(settings_file).resolve()
    settings = SiteSettings.from_file(settings_file)
    if not Path(settings.data).is_file():
        raise FileNotFoundError(f"The site's data file {settings.data} does not exist.")
    check_budget_settings(settings)
    check_donor_settings(settings)
    settings.refusal_file.unlink(missing_ok=True)
    port = port or free_port()
    tls = ["--root-certificates", root_certificates] if root_certificates else ["--insecure"]
    log = Path(tempfile.gettempdir()) / f"dpsc-site-{os.getpid()}-{port}.log"
    with superexec_secret() as secret:
        return _serve_site(settings, settings_file, task, superlink, port, timeout, tls, log, secret)


def _serve_site(
    settings: SiteSettings,
    settings_file: Path,
    task: str,
    superlink: str,
    port: int,
    timeout: float,
    tls: list[str],
    log: Path,
    secret: Path,
) -> Path:
    """Run the SuperNode and this site's own app until the run ends (:func:`run_site`)."""
    output = Path(settings.output)
    before = output.stat().st_mtime if output.exists() else 0.0
    command = [
        "flower-supernode",
        *tls,
        "--superlink",
        superlink,
        "--isolation",
        "process",  # the SuperNode launches no app: this process serves its tasks with its own
        "--port",
        str(port),
        "--superexec-auth-secret-file",
        str(secret),
        "--node-config",
        f"settings='{settings_file}'",
    ]
    logging.getLogger("flwr").setLevel(logging.WARNING)  # SecAgg+'s stage log would drown the site's lines
    print(
        f"This site runs only its own dpsc app, task {task!r} (fingerprint {app_fingerprint(task)}).",
        flush=True,
    )
    runner = OwnAppRunner(f"127.0.0.1:{port}", secret.read_bytes(), task, settings.record_refusal)
    deadline = time.monotonic() + timeout
    watch = _ServerWatch(superlink)
    refused = None
    try:
        with _process(command, log) as node:
            runner.start()
            refused = _watch_site(node, runner, settings, output, before, deadline, watch, log)
    finally:
        runner.stop()
    if refused is not None:  # the reason is the whole story: the SuperNode's log is not kept
        log.unlink(missing_ok=True)
        raise ValueError(f"This site refused the run: {refused}")
    if output.exists() and output.stat().st_mtime > before:
        log.unlink(missing_ok=True)
        return output
    raise TimeoutError(f"No run completed within {timeout:.0f} s; the SuperNode was stopped (log: {log}).")


@contextlib.contextmanager
def superexec_secret() -> Iterator[Path]:
    """Yield the path of a fresh 32-byte secret that only this site's user can read; removed after.

    The SuperNode reads its SuperExec secret from a file. The file is created exclusively
    (``O_CREAT | O_EXCL``, mode 0600, so no file planted beforehand is reused and no other mode is
    kept) inside a new directory of mode 0700 (``tempfile.mkdtemp``: a random name only this user
    can list or enter). Only its path is passed on the SuperNode's command line, never the secret.
    """
    folder = Path(tempfile.mkdtemp(prefix="dpsc-site-"))
    path = folder / "superexec.secret"
    try:
        handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(handle, "wb") as file:
            file.write(os.urandom(32))
        yield path
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _watch_site(node, runner, settings, output, before, deadline, watch, log) -> str | None:
    """Wait for the site's results or refusal (return its reason); raise when the run cannot end."""
    served = None  # tasks served when the results appeared: the task that wrote them is still replying
    while time.monotonic() < deadline:
        if served is None and output.exists() and output.stat().st_mtime > before:
            served = runner.served
        if served is not None:  # done once the last reply was pushed, or the server ended the run
            if runner.served > served or runner.last_error is not None or watch.gone():
                time.sleep(2.0)  # let the SuperNode send the last reply on
                return None
            time.sleep(0.5)
            continue
        if settings.refusal_file.exists():
            reason = settings.refusal_file.read_text().strip()
            time.sleep(REPLY_GRACE)  # let the refusal reach the server before the SuperNode stops
            return reason
        if node.poll() is not None:
            raise RuntimeError(f"The SuperNode stopped before the run ended; see {log}.")
        if runner.error is not None:
            raise RuntimeError(f"This site's app stopped: {runner.error!r}; see {log}.")
        if watch.gone():
            raise RuntimeError(
                f"The federation's server stopped before this site's run ended (its SuperLink at "
                f"{watch.address} no longer answers). This site's ledger {settings.ledger} holds every "
                f"release it sent; the server's log says why the run ended (SuperNode log: {log})."
            )
        time.sleep(0.5)
    return None


def check_donor_settings(settings: SiteSettings) -> None:
    """Fail fast, before the SuperNode starts, on a ``donor_key`` the site's data cannot serve."""
    if settings.donor_key is None:
        return
    import anndata as ad

    from ..privacy import donor_weights

    cells = ad.read_h5ad(settings.data, backed="r")  # obs only: the counts stay on disk
    try:
        donor_weights(cells, settings.donor_key, "This site (--donor-key)")
    finally:
        cells.file.close()


def check_budget_settings(settings: SiteSettings) -> None:
    """Fail fast, before the SuperNode starts, on a budget that would raise the stored one silently."""
    from ..privacy import FileLedger
    from ._trust import resolve_budget

    resolve_budget(settings, FileLedger(settings.ledger))
