import sys

from braid.cli.main import main

# vLLM starts its engine process with "spawn", which re-imports the main module: guard it.
if __name__ == "__main__":
    sys.exit(main())
