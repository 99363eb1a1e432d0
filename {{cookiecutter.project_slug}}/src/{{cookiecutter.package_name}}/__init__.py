"""{{ cookiecutter.project_name }}: {{ cookiecutter.description }}"""

from {{ cookiecutter.package_name }}.data import ImageDataModule
from {{ cookiecutter.package_name }}.errors import DataError
from {{ cookiecutter.package_name }}.model import ImageClassifier

__all__ = ["DataError", "ImageClassifier", "ImageDataModule"]
__version__ = "0.1.0"
