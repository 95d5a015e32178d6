"""Experiment driving and reporting: results.json tables, Figure 2/3 plots and TensorBoard scalars."""
