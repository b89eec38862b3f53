"""The numpy consumer of the golden vectors, run from a checkout:

    python tools/consumers/numpy_consumer.py [VECTORS] MODULE [--only SELECTOR] [--dtype float32]

The consumer itself is one file, ``specs/numpy_consumer.py`` (numpy and the standard library only:
copy it to use it anywhere; installed from the wheel it runs as ``refimpl vectors`` or
``python -m specs.numpy_consumer``). This script runs it from the checkout it sits in and
re-exports its API, so ``from tools.consumers.numpy_consumer import check_file`` works too.
``--help`` lists the functions a module provides; README.md beside this file has the rest."""

import sys
from pathlib import Path

if __name__ == "__main__":  # run as a script: import specs from this checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from specs.numpy_consumer import *  # noqa: E402, F403
from specs.numpy_consumer import __all__, main  # noqa: E402, F401

if __name__ == "__main__":
    raise SystemExit(main())
