"""``python -m softmaxkit.bench [SUITE ...] [--quick]``: the same as ``softmaxkit bench``."""

import sys

from ..cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
