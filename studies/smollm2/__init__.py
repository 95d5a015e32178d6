"""Scripts of the study in this folder (its README says what each measured)."""
