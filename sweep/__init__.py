"""sweep: benchmark LLM training across hardware and precision stacks."""

__version__ = "0.1.0"
