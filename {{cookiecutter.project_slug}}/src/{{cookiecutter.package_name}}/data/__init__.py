"""The data side: image files on disk to normalised batches on the device (ARCHITECTURE.md)."""


def __getattr__(name: str):
    # `from <package>.data import ImageDataModule` keeps working; imported on first use only, so
    # that reading an image (`data.images`) does not import Lightning.
    if name == "ImageDataModule":
        from {{ cookiecutter.package_name }}.data.datamodule import ImageDataModule

        return ImageDataModule
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
