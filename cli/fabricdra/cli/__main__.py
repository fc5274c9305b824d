import sys

from fabricdra.cli import main

sys.exit(main())
