"""The federated extra's one check: Flower is installed (``pip install 'dpsc[federated]'``)."""

from __future__ import annotations


def require_flwr() -> None:
    """Raise an ``ImportError`` that names the install command when Flower is not installed."""
    try:
        import flwr  # noqa: F401
    except ImportError as err:
        raise ImportError(
            "Federated training runs on Flower, which is not installed: pip install 'dpsc[federated]'."
        ) from err
