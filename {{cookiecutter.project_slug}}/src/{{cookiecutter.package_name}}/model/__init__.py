"""The model side: the LightningModule (classifier), its networks and its validation reports."""


def __getattr__(name: str):  # `from <package>.model import ImageClassifier`, on first use
    if name == "ImageClassifier":
        from {{ cookiecutter.package_name }}.model.classifier import ImageClassifier

        return ImageClassifier
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
