"""``python -m shardfeed.convert.cli``: the ``shardfeed`` command."""

from shardfeed.convert.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    main()
