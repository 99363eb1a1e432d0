"""What the data module needs of shards before LitData is imported: the check that the optional
`stream` extra is installed, and the folder-path options that shards cannot take."""

from __future__ import annotations

from {{ cookiecutter.package_name }}.errors import DataError


def require_shards():
    """The shards module (`data/shards.py`), once LitData, an optional dependency, is found."""
    try:
        import litdata  # noqa: F401
    except ImportError as err:
        raise DataError(
            '--data.stream needs LitData: pip install ".[stream]" (the stream extra)'
        ) from err
    from {{ cookiecutter.package_name }}.data import shards

    return shards


def refuse_with_stream(balance_classes: bool, cache: str, skip_bad_images: bool) -> None:
    """Folder-path options that shards cannot honour: an error before training, not ignored."""
    given = {
        "--data.balance_classes true (LitData draws the order)": balance_classes,
        f"--data.cache {cache} (shards are read as stored)": cache != "none",
        "--data.skip_bad_images true (pass it to `shard`)": skip_bad_images,
    }
    if any(given.values()):
        options = "; ".join(option for option, on in given.items() if on)
        raise DataError(f"--data.stream does not take {options}")
