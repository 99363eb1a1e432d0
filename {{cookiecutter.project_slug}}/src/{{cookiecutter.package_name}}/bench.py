"""The older spelling of the `bench` command:
`python -m {{ cookiecutter.package_name }}.bench`, now `python -m {{ cookiecutter.package_name }} bench`.
"""

from {{ cookiecutter.package_name }}.commands.bench import main

if __name__ == "__main__":
    main()
