"""``python -m persistent_gemm ...``: the command line lives in :mod:`persistent_gemm.tools.cli`."""

import sys

from .tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
