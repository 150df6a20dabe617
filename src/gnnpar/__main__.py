import sys

from gnnpar.cli import main

sys.exit(main())
