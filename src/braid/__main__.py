import sys

from braid.cli import main

sys.exit(main())
