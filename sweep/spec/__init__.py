"""What the user asked for: the grid, its trials' layouts, and the warnings said before any GPU time. Pure."""
