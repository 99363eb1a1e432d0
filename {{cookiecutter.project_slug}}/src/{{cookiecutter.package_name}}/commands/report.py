"""Write a run's report again, from the `history.json` that `fit` keeps in its run folder."""

from __future__ import annotations

import sys
from argparse import ArgumentParser

from {{ cookiecutter.package_name }}.training.report import NothingToReport, write_report


def main(args: list[str]) -> int:
    parser = ArgumentParser("python -m {{ cookiecutter.package_name }} report", description=__doc__)
    parser.add_argument("run_dir", help="the run folder of a fit: lightning_logs/version_N")
    parser.add_argument(
        "--overwrite", action="store_true", help="replace a report.html that no report wrote"
    )
    config = parser.parse_args(args)
    try:  # any other DataError becomes one `error:` line in __main__
        write_report(config.run_dir, config.overwrite)
    except NothingToReport as stopped:  # the run stopped before its first epoch ended
        print(f"report: {stopped}", file=sys.stderr)
        return 1
    return 0
