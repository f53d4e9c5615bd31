"""``python -m tabloader.cli``: the ``tabloader`` command."""

import sys

from tabloader.cli import main

if __name__ == "__main__":
    sys.exit(main())
