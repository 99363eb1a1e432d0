"""The data side: image files on disk to normalised batches on the device (ARCHITECTURE.md)."""


def __getattr__(name: str):  # on first use: reading an image (`data.images`) needs no Lightning
    if name == "ImageDataModule":
        from {{ cookiecutter.package_name }}.data.datamodule import ImageDataModule

        return ImageDataModule
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
