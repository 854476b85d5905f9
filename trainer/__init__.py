"""The trainer: models, precision recipes and stacks, the transform order, one trial, and the per-rank worker.

`trainer.models.specs`, `trainer.recipes` and `trainer.options` are pure data (no torch import) so that grids can be
validated and planned on a machine without torch's heavy start-up.
"""
