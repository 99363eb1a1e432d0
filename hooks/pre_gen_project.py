"""Validate the answers before anything is written: refuse clearly, leave nothing behind.

Cookiecutter renders this file with the answers, runs it in the new project folder, and deletes
that folder when it exits non-zero, so a refused bake leaves no directory behind.
"""

import json
import keyword
import re
import sys

# Names that would shadow the standard library or a dependency when imported.
# fmt: off
RESERVED = set(sys.stdlib_module_names) | {
    "torch", "torchvision", "lightning", "pytorch_lightning", "lightning_fabric",
    "lightning_utilities", "torchmetrics", "jsonargparse", "numpy", "PIL", "pillow", "yaml",
    "tensorboard", "onnx", "setuptools", "pkg_resources", "pytest", "ruff", "test", "tests", "src",
    "simplejpeg", "tqdm", "mlflow", "wandb",
}
# fmt: on

# What a choice may be; cookiecutter checks prompts and --no-input overrides, not replay files.
CHOICES = {
    "license": ("MIT", "Apache-2.0", "BSD-3-Clause", "Proprietary"),
    "dataset_layout": ("folders", "csv"),
    "logger": ("csv", "tensorboard", "mlflow", "wandb"),
    "ci": ("github", "none"),
    "slurm": ("yes", "no"),
    "serve": ("no", "yes"),
    "shards": ("no", "yes"),
}

# Free text that lands inside quoted TOML strings and the LICENSE.
PLAIN_TEXT = ("project_name", "description", "author_name")


def _package_problem(package: str) -> str | None:
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", package):
        return (
            f"package_name {package!r} must be a lower-case Python identifier: letters a-z, "
            "digits and underscores, not starting with a digit"
        )
    if keyword.iskeyword(package):
        return f"package_name {package!r} is a Python keyword; pick another import name"
    if package in RESERVED:
        return (
            f"package_name {package!r} would shadow the standard-library or dependency module "
            "of that name; pick another import name"
        )
    return None


def problems(answers: dict[str, str]) -> list[str]:
    """Every fault in the answers, each naming the field, the value and the rule."""
    found = []
    package_problem = _package_problem(answers["package_name"])
    if package_problem:
        found.append(package_problem)
    slug = answers["project_slug"]
    if not re.fullmatch(r"[a-z0-9]([a-z0-9._-]*[a-z0-9])?", slug):
        found.append(
            f"project_slug {slug!r} must be lower-case letters, digits, '.', '_' or '-', "
            "starting and ending with a letter or digit"
        )
    email = answers["author_email"]
    if not re.fullmatch(r"[^@\s\"\\]+@[^@\s\"\\]+\.[^@\s\"\\.]+", email):
        found.append(f"author_email {email!r} is not an e-mail address (name@domain.tld)")
    for field in PLAIN_TEXT:
        text = answers[field]
        if not text.strip() or re.search(r"[\"\\\x00-\x1f]", text):
            found.append(
                f"{field} {text!r} must be non-empty text on one line without "
                "double quotes or backslashes"
            )
    version = answers["python_version"]
    if not re.fullmatch(r"3\.(1[0-9]|[2-9][0-9])", version):
        found.append(f"python_version {version!r} must be 3.10 or newer, as MAJOR.MINOR")
    size = answers["image_size"]
    if not size.isdigit() or not 8 <= int(size) <= 4096:
        found.append(f"image_size {size!r} must be a whole number of pixels from 8 to 4096")
    for field, allowed in CHOICES.items():
        if answers[field] not in allowed:
            found.append(f"{field} {answers[field]!r} must be one of {', '.join(allowed)}")
    return found


# Rendered by cookiecutter; a raw string keeps this file valid Python for ruff before rendering.
ANSWERS = json.loads(r"""{{ cookiecutter | tojson }}""")

if __name__ == "__main__":
    errors = problems(ANSWERS)
    if errors:
        print("ERROR: cannot bake the template:", file=sys.stderr)
        for error in errors:
            print(f"  - {error}", file=sys.stderr)
        sys.exit(1)
