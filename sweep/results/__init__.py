"""Reading result datasets back: filter, aggregate, compare, render, plot, query.

Every entry point takes the result directory that ``sweep run`` wrote (see ``sweep.record.store``):

- ``query``: ``--where`` filters, loading the rows, and DuckDB SQL over them;
- ``aggregate``: one row per config (median over repeats), max batch, ratios against a baseline;
- ``recount``: TFLOP/s and MFU in another tool's FLOP convention (``--flops megatron|torchtitan``);
- ``render``: Rich tables, GitHub markdown and CSV from the aggregated tables;
- ``provenance``: the stack the rows were measured with, under every markdown table;
- ``plot``: TFLOP/s/GPU vs batch size and the max-batch bar chart (matplotlib, Agg).

Aggregation runs in DuckDB over Arrow tables, never in Python loops over rows.
"""
