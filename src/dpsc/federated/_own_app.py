r"""A site runs only the ClientApp of its own installation, never code that the server sends.

Flower's default SuperNode installs the Flower App Bundle (FAB) that the server submits and
imports its ClientApp: the server's code would then run inside the site, next to its cells. A dpsc
site does not let it. Its SuperNode runs with ``--isolation process`` (it launches no app process
itself) and without runtime dependency installation; the site's own process takes each of the
SuperNode's tasks from its local Runtime API (on 127.0.0.1, authenticated with a secret that only
this site's processes hold) and, for each:

1. compares the bundle the server submitted with the site's own bundle, file by file
   (:func:`bundle_fingerprint`: the sha256 of each file's content, the bundle's ``pyproject.toml``
   compared as parsed TOML; one file holds the sha256 of every file of the server's installed dpsc,
   :func:`code_fingerprint`); a bundle that differs (another app, another dpsc version or code,
   one added file) is refused before any of it is read as code, with both fingerprints in the
   message;
2. answers the message with ``client_app`` **as imported from this
   site's own installation**: the bundle is never unpacked to disk, installed or imported, so even
   a bundle that passed step 1 runs no code of its own.

What a site trusts, then: its own installation of dpsc and of Flower (the SecAgg+ protocol), its
settings and ledger file, and, in secure mode, that at least ``threshold`` of the summed sites add
their noise share and do not collude with the server. It trusts nothing the server sends: the run
configuration and every request are checked against the site's own plan and settings
(:class:`~dpsc.federated.Site`). Flower's own FAB verification (``--trusted-entities``) accepts only
bundles that Flower's hub signed, so it cannot serve a bundle built by a federation's own server; a dpsc site
does not use it and refuses every other mode of running server code.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import threading
import tomllib
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._guard import SiteRefusal

#: The bundle's one module: it names the task's ClientApp and ServerApp of the installed dpsc.
APP_MODULE = """import {module} as apps

server_app = apps.server_app
client_app = apps.client_app
"""
#: The bundle's name (``[project].name``); its version is dpsc's.
APP_NAME = "dpsc-federation"
#: The bundle's file that holds the sha256 of the installed dpsc package (:func:`code_fingerprint`).
CODE_FILE = "dpsc_code.json"
#: A bundle larger than this is refused unread (dpsc's own is a few kB).
MAX_BUNDLE_BYTES = 1 << 20
#: Tries of one call to the SuperNode while a task is served (the SuperNode is on the same machine).
RETRIES = 4
#: Seconds between two polls of the SuperNode's Runtime API for a task.
POLL_SECONDS = 0.2


class BundleRefusal(ValueError):
    """The server's app bundle is not this site's own dpsc app: nothing of it ran."""


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))


def app_files(task: str = "pipeline", config: dict[str, Any] | None = None) -> dict[str, bytes]:
    """Return the files of dpsc's Flower app of ``task`` for this installation.

    ``config``: the run's defaults (default: the task's run-configuration table). The run
    configuration the server proposes travels as ``flwr run --run-config`` overrides, so the
    bundle's files depend only on the task and the installed dpsc code.
    """
    from .. import __version__
    from ._apps import federated_task

    spec = federated_task(task)
    config = spec.run_config if config is None else config

    pyproject = "\n".join(
        [
            '[build-system]\nrequires = ["hatchling"]\nbuild-backend = "hatchling.build"\n',
            f'[project]\nname = "{APP_NAME}"\nversion = "{__version__}"\ndependencies = []\n',
            '[tool.hatch.build.targets.wheel]\npackages = ["."]\n',
            '[tool.flwr.app]\npublisher = "dpsc"\n',
            "[tool.flwr.app.components]\n"
            'serverapp = "dpsc_app:server_app"\nclientapp = "dpsc_app:client_app"\n',
            "[tool.flwr.app.config]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in config.items()),
        ]
    )
    return {
        "dpsc_app.py": APP_MODULE.format(module=spec.app_module).encode(),
        "pyproject.toml": pyproject.encode(),
        CODE_FILE: json.dumps({"dpsc_sha256": code_fingerprint()}).encode(),
    }


@functools.cache
def code_fingerprint(root: Path | None = None) -> str:
    """Return the sha256 of every file of the installed dpsc package (its paths and contents).

    The code that will run, not only its version: two installations whose dpsc differs in any file
    (an edited module, a patched release of the same version) give different values. Compiled
    caches (``__pycache__``) are left out: they follow from the files. ``root``: the package's
    folder (default: the ``dpsc`` this process imports).
    """
    import dpsc

    root = Path(dpsc.__file__).resolve().parent if root is None else Path(root)
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def app_fingerprint(task: str = "pipeline") -> str:
    """Return the fingerprint of this installation's Flower app of ``task``, as both ends print it.

    16 hex digits. It covers the app's files and :func:`code_fingerprint` (every file of the
    installed dpsc), so equal fingerprints mean both ends run the same dpsc code and task. It is a
    check between honest parties: a hostile server can print any value, and a site's safety never
    rests on it (a site runs only its own code and checks every request,
    :class:`~dpsc.federated.Site`).
    """
    return bundle_fingerprint(app_files(task))[:16]


def write_app_project(folder: Path, task: str) -> Path:
    """Write the Flower app project of ``task`` that ``flwr run`` submits (:func:`app_files`)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, content in app_files(task).items():
        (folder / name).write_bytes(content)
    return folder


def _canonical(path: str, content: bytes) -> bytes:
    """Return a file's content as compared: ``pyproject.toml`` parsed (key order and layout do not count)."""
    if path != "pyproject.toml":
        return content
    config = tomllib.loads(content.decode("utf-8"))
    config.get("tool", {}).get("flwr", {}).pop("federations", None)  # flwr build drops it
    return json.dumps(config, sort_keys=True).encode()


def bundle_fingerprint(files: dict[str, bytes]) -> str:
    """Return sha256 over the sorted (path, sha256 of the canonical content) of a bundle's files."""
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(path.encode() + b"\0" + hashlib.sha256(_canonical(path, files[path])).digest())
    return digest.hexdigest()


def bundle_files(content: bytes) -> dict[str, bytes]:
    """Return the files of a FAB (a zip), without its derived ``.info/`` manifest; never extracted."""
    if len(content) > MAX_BUNDLE_BYTES:
        raise BundleRefusal(
            f"The server's app bundle is {len(content)} bytes, far larger than dpsc's own app; nothing of "
            "it ran."
        )
    try:
        with zipfile.ZipFile(io.BytesIO(content)) as bundle:
            names = [n for n in bundle.namelist() if not n.startswith(".info/") and not n.endswith("/")]
            if sum(bundle.getinfo(n).file_size for n in names) > MAX_BUNDLE_BYTES:
                raise BundleRefusal("The server's app bundle unpacks to more than dpsc's own app could.")
            return {name: bundle.read(name) for name in names}
    except (zipfile.BadZipFile, KeyError, ValueError) as err:
        if isinstance(err, BundleRefusal):
            raise
        raise BundleRefusal(f"The server's app bundle is not a readable Flower app bundle ({err}).") from None


def check_bundle(content: bytes, own: dict[str, bytes]) -> str:
    """Refuse a bundle whose files differ from ``own`` (:class:`BundleRefusal`); return its fingerprint."""
    from .. import __version__

    theirs = bundle_files(content)
    try:
        fingerprint = bundle_fingerprint(theirs)
    except (UnicodeDecodeError, tomllib.TOMLDecodeError):
        fingerprint = hashlib.sha256(content).hexdigest()
    expected = bundle_fingerprint(own)
    if fingerprint == expected:
        return fingerprint
    version = ""
    if theirs.get(CODE_FILE) != own[CODE_FILE]:
        version = (
            " The server's installed dpsc code is not this site's (code fingerprint "
            f"{_code_of(theirs)[:16]}, this site's {_code_of(own)[:16]}): both must install the same dpsc."
        )
    with contextlib.suppress(Exception):
        project = tomllib.loads(theirs["pyproject.toml"].decode())["project"]
        if project.get("name") == APP_NAME and project.get("version") != __version__:
            version = (
                f" The server runs dpsc {project.get('version')}'s app and this site dpsc {__version__}: "
                "both must install the same dpsc version."
            )
    raise BundleRefusal(
        f"The server sent an app bundle that is not this site's own dpsc app (fingerprint "
        f"{fingerprint[:16]}, this site's {expected[:16]}); nothing of it ran and no cell was read."
        f"{version}"
    )


def _code_of(files: dict[str, bytes]) -> str:
    """Return the code fingerprint a bundle states (``"none"`` when it states none readably)."""
    with contextlib.suppress(Exception):
        return str(json.loads(files[CODE_FILE])["dpsc_sha256"])
    return "none"


class OwnAppRunner:
    """Serve the tasks of a SuperNode started with ``--isolation process`` with the local ClientApp.

    Parameters
    ----------
    runtime_address
        ``127.0.0.1:PORT`` of the SuperNode's Runtime API.
    secret
        The SuperExec secret the SuperNode was started with (``--superexec-auth-secret-file``).
    task
        The one task this site serves (:data:`~dpsc.federated.TASKS`): its own bundle
        (:func:`app_files`) is what the server's must equal, and its ClientApp, imported from
        this installation, answers every message.
    on_refusal
        Called with the reason when a bundle or a request is refused (every task's site guard
        refuses with :class:`~dpsc.federated.SiteRefusal`).
    """

    def __init__(
        self,
        runtime_address: str,
        secret: bytes,
        task: str,
        on_refusal: Callable[[str], None],
    ) -> None:
        self.runtime_address, self.secret = runtime_address, secret
        self.task, self.own_files = task, app_files(task)
        self.on_refusal = on_refusal
        self.error: BaseException | None = None
        self.last_error: BaseException | None = None
        self.served = 0
        self._invokers: list[Any] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="dpsc-own-clientapp", daemon=True)

    def start(self) -> None:
        """Start serving in a background thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop: no more tasks, no more retries of a call to a SuperNode that is gone."""
        self._stop.set()
        for invoker in self._invokers:  # a call already retrying gives up at its next failure too
            invoker.max_tries, invoker.max_time = 1, 0.0
        if self._thread.is_alive():  # also when the site stopped before it started serving
            self._thread.join(timeout=2)

    def _client(self, token: str | None = None):
        from flwr.supercore.interceptors import RuntimeTokenHttpInterceptor, SuperExecAuthHttpInterceptor
        from flwr.supercore.retry import make_simple_http_retry_invoker
        from flwr.supercore.runtime import RuntimeHttpClient

        interceptors: list[Any] = [
            SuperExecAuthHttpInterceptor(
                master_secret=self.secret, protected_methods=frozenset({"/flwr.proto.Runtime/AcquireTask"})
            )
        ]
        if token is not None:
            interceptors.append(RuntimeTokenHttpInterceptor(token))
        invoker = make_simple_http_retry_invoker()
        invoker.max_tries = RETRIES if token is not None else 1  # polls retry in the loop itself
        invoker.wait_function = self._stop.wait  # a backoff ends when the site stops
        self._invokers = [*self._invokers[-4:], invoker]
        return RuntimeHttpClient.from_server_address(
            server_address=self.runtime_address,
            insecure=True,  # loopback inside the site's own machine
            root_certificates=None,
            interceptors=interceptors,
            retry_invoker=invoker,
        )

    def _loop(self) -> None:
        from flwr.proto.runtime_pb2 import AcquireTaskRequest
        from flwr.supercore.constant import TaskType

        try:
            client = None
            while not self._stop.is_set():
                try:
                    client = client or self._client()
                    response = client.AcquireTask(
                        AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP], agentapp_fab_hashes=[])
                    )
                except Exception:  # the SuperNode is not up yet, or gone: run_site decides
                    client = None
                    self._stop.wait(1.0)
                    continue
                if response.HasField("task") and response.token:
                    try:
                        self._serve(response.token)
                        self.served += 1
                    except Exception as err:  # one task failed (its SuperNode reports it); serve the next
                        self.last_error = err
                else:
                    self._stop.wait(POLL_SECONDS)
        except BaseException as err:  # surfaced by run_site
            self.error = err

    def _serve(self, token: str) -> None:
        """Answer one task: check the bundle, then run this installation's ClientApp on its message."""
        from flwr.app import Message
        from flwr.app.error import Error
        from flwr.common.constant import ErrorCode, SubStatus
        from flwr.supercore.heartbeat import HeartbeatSender
        from flwr.supernode.runtime.run_clientapp import pull_task_input, push_message, push_task_output

        client = self._client(token)
        beat = HeartbeatSender(_heartbeat(client))
        beat.start()
        context, status, details = None, SubStatus.FAILED, "dpsc site: the task did not complete"
        try:
            message, context, _run, fab = pull_task_input(client)
            try:
                check_bundle(fab.content, self.own_files)
                from ._apps import federated_task

                client_app = federated_task(self.task).client_app()  # this installation's, never the bundle's
                reply = client_app(message=message, context=context)
                status, details = SubStatus.COMPLETED, ""
            except (BundleRefusal, SiteRefusal) as refusal:  # the site's words, for its data manager
                with contextlib.suppress(OSError):
                    self.on_refusal(str(refusal))
                reply = Message(_error(Error, ErrorCode, refusal), reply_to=message)
                details = str(refusal)
            except Exception as err:  # a refusal or failure of the ClientApp: its reason goes back
                reply = Message(_error(Error, ErrorCode, err), reply_to=message)
                details = str(err)
            push_message(client, reply, context)
        finally:
            beat.stop()
            push_task_output(client, context, status, details)
            client.close()


def _error(error_cls, codes, err: BaseException):
    """Flower's error reply, with the reason in the form ``flwr-clientapp`` gives it."""
    return error_cls(code=codes.CLIENT_APP_RAISED_EXCEPTION, reason=f"{type(err)}:<'{err}'>")


def _heartbeat(client) -> Callable[[], bool]:
    """Return a task heartbeat that reports failure instead of signalling the process (unlike Flower's)."""
    from flwr.proto.runtime_pb2 import SendTaskHeartbeatRequest

    def beat() -> bool:
        try:
            return bool(client.SendTaskHeartbeat(SendTaskHeartbeatRequest()).success)
        except Exception:
            return False

    return beat
