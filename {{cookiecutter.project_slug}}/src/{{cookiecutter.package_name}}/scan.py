"""The older spelling of the `scan` command:
`python -m {{ cookiecutter.package_name }}.scan`, now `python -m {{ cookiecutter.package_name }} scan`.
"""

import sys

from {{ cookiecutter.package_name }}.commands.scan import main

if __name__ == "__main__":
    sys.exit(main())
