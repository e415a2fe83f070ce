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


#: The Flower minor version whose Runtime API a site's own ClientApp runner speaks (``_own_app``).
SITE_FLOWER = "1.41"


def require_site_flwr() -> None:
    """Raise, before a site starts, when the installed Flower is not the one its runner speaks."""
    require_flwr()
    import flwr

    version = str(getattr(flwr, "__version__", ""))
    if not version.startswith(SITE_FLOWER + "."):
        raise ImportError(
            f"A dpsc site serves its SuperNode with Flower {SITE_FLOWER}'s Runtime API, but Flower "
            f"{version} is installed: pip install 'flwr[simulation]=={SITE_FLOWER}.*' (or reinstall "
            "'dpsc[federated]')."
        )
