"""The one error type for bad user input: `__main__` prints it as one line and exits with code 2."""


class DataError(ValueError):
    """A problem with the user's data or options, with a message saying what and where."""


def one_line(err: BaseException | str, limit: int = 200) -> str:
    """A foreign error message on one line (torch's run over several), cut to `limit`."""
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
