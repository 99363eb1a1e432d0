"""Validate the answers before anything is written: refuse clearly, leave nothing behind."""

import keyword
import re
import sys

# Names that would shadow the standard library or a dependency when imported.
RESERVED = set(sys.stdlib_module_names) | {
    "torch", "torchvision", "lightning", "pytorch_lightning", "torchmetrics", "jsonargparse",
    "numpy", "PIL", "pillow", "yaml", "test", "tests", "src",
}


def problems(answers: dict[str, str]) -> list[str]:
    found = []
    package = answers["package_name"]
    if not package.isidentifier() or not package.isascii():
        found.append(f"package_name {package!r} is not a valid Python identifier "
                     "(letters, digits and underscores, not starting with a digit)")
    elif keyword.iskeyword(package):
        found.append(f"package_name {package!r} is a Python keyword")
    elif package in RESERVED or package.lower() in RESERVED:
        found.append(f"package_name {package!r} would shadow the standard-library or dependency "
                     "module of that name")
    slug = answers["project_slug"]
    if not re.fullmatch(r"[a-z0-9][a-z0-9._-]*", slug):
        found.append(f"project_slug {slug!r} must be lower-case letters, digits, '.', '_' or '-', "
                     "starting with a letter or digit")
    email = answers["author_email"]
    if not re.fullmatch(r"[^@\s]+@[^@\s]+\.[^@\s]+", email):
        found.append(f"author_email {email!r} is not an e-mail address (name@domain.tld)")
    version = answers["python_version"]
    if not re.fullmatch(r"3\.(1[0-9]|[2-9][0-9])", version):
        found.append(f"python_version {version!r} must be 3.10 or newer, as MAJOR.MINOR")
    size = answers["image_size"]
    if not size.isdigit() or not 8 <= int(size) <= 4096:
        found.append(f"image_size {size!r} must be a whole number of pixels from 8 to 4096")
    return found


ANSWERS = {
    "package_name": {{ cookiecutter.package_name | tojson }},
    "project_slug": {{ cookiecutter.project_slug | tojson }},
    "author_email": {{ cookiecutter.author_email | tojson }},
    "python_version": {{ cookiecutter.python_version | tojson }},
    "image_size": {{ cookiecutter.image_size | tojson }},
}

if __name__ == "__main__":
    errors = problems(ANSWERS)
    if errors:
        print("ERROR: cannot bake the template:", file=sys.stderr)
        for error in errors:
            print(f"  - {error}", file=sys.stderr)
        sys.exit(1)
