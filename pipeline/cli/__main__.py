"""``python -m simpipe.cli``: the ``simpipe`` command."""

from simpipe.cli.main import main

if __name__ == "__main__":
    main()
