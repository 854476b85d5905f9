"""The trainer: models, precision recipes, the transform order, and the per-rank worker.

`trainer.models.specs` and `trainer.recipes` are pure data (no torch import) so that grids can be
validated and planned on a machine without torch's heavy start-up.
"""
