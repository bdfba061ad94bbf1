import sys

from inferpath.cli import main

sys.exit(main())
