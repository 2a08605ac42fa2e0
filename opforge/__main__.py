"""``python -m opforge`` is the same as the ``opforge`` command."""

from opforge.cli import main

if __name__ == "__main__":
    main()
