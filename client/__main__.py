import sys

from yarnflow.cli import main

sys.exit(main())
