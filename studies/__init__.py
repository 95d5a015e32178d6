"""The studies: one folder each with its README, committed results and the scripts only it needs."""
