"""`python -m {{ cookiecutter.package_name }}.bench`: the older spelling of `python -m {{ cookiecutter.package_name }} bench`."""

from {{ cookiecutter.package_name }}.commands.bench import main

if __name__ == "__main__":
    main()
