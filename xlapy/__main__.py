import sys

from xlapy.tools.cli import main

sys.exit(main())
