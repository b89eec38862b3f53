import sys

from refimpl.cli import main

sys.exit(main())
