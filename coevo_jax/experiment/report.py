"""The old name of the report CLI: `python -m coevo_jax.experiment.report` runs `coevo_jax.reporting.report`."""

import sys

from coevo_jax.reporting.report import main

if __name__ == "__main__":
    sys.exit(main())
