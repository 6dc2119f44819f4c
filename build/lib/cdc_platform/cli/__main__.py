import sys

from cdc_platform.cli.main import main

sys.exit(main())
