"""`search: fastest` (`sweep tune`): the candidate space, placement by memory and cost, one search per group,
its verdict."""
