"""`python -m bucketserve`: the `bucketserve` command (`process.cli`), for where the console
script is not on the PATH."""

import sys

from bucketserve.process.cli import main

sys.exit(main())
