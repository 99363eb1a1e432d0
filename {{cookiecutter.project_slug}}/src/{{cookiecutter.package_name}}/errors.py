"""The one error type for bad user input: `__main__` prints it as one line and exits with code 2."""


class DataError(ValueError):
    """A problem with the user's data or options, with a message saying what and where."""
