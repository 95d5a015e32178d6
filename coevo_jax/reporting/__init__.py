"""Reporting on a finished or running job from its results.json: statistics, Table 1, the figures, the CLI."""
