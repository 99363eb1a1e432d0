"""`python -m {{ cookiecutter.package_name }} <command> [options]`: `fit`, `validate`, `test`
and `predict` run through LightningCLI (`commands/cli.py`), the others their own `main()`."""

from __future__ import annotations

import importlib
import sys

from {{ cookiecutter.package_name }}.commands import COMMANDS
from {{ cookiecutter.package_name }}.errors import DataError

USAGE = "usage: python -m {{ cookiecutter.package_name }} <command> [options]"
# What gloo says on the other ranks when one rank of a DDP job exits (its socket closed or reset).
_PEER_GONE = ("Connection closed by peer", "Connection reset by peer")
WORKER_DIED = (
    "a data loader worker died: list the files that cannot be read with `python -m "
    "{{ cookiecutter.package_name }} scan` and the same --data options, or train with "
    "--data.source.skip_bad_images true"
)


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {text}" for name, (_, text) in COMMANDS.items()]
    return "\n".join([USAGE, "", "commands (each with its own --help):", *lines])


def main(args: list[str] | None = None) -> None:
    argv = sys.argv[1:] if args is None else list(args)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return
    # options before the command (`--config FILE fit`): LightningCLI's
    module = "cli" if argv[0].startswith("-") else COMMANDS.get(argv[0], (None,))[0]
    if module is None:
        print(f"error: unknown command {argv[0]!r}\n\n{usage()}", file=sys.stderr)
        sys.exit(2)
    command = importlib.import_module(f"{{ cookiecutter.package_name }}.commands.{module}")
    try:
        code = command.main(argv if module == "cli" else argv[1:])
    except DataError as err:  # bad input: one line
        text = str(err).rsplit("DataError: ", 1)[-1]  # a worker's: after its traceback
        print(f"error: {text.strip()}", file=sys.stderr)
        sys.exit(2)
    except RuntimeError as err:
        if "DataLoader worker (pid" in str(err):  # killed by a signal (a decoder crash?) or OOM
            # On a line of its own: PyTorch's handler in the worker printed one with no newline.
            print(f"\nerror: {WORKER_DIED}", file=sys.stderr)
            sys.exit(2)
        if any(words in str(err) for words in _PEER_GONE):  # DDP: another process failed first
            print("error: stopped because another process of the job failed", file=sys.stderr)
            sys.exit(1)
        raise
    if code:
        sys.exit(code)


if __name__ == "__main__":
    main()
