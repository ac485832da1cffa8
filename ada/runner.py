"""`python -m ada.runner`: train from a config, or run a sweep (see ada/cli.py, --help).

The loop itself is ada/loop.py; one RL step is ada/step.py.
"""

import sys

from ada.cli import train_main as main

if __name__ == "__main__":
    sys.exit(main())
