"""`python -m {{ cookiecutter.package_name }}.scan`: the older spelling of `python -m {{ cookiecutter.package_name }} scan`."""

import sys

from {{ cookiecutter.package_name }}.commands.scan import main

if __name__ == "__main__":
    sys.exit(main())
