"""What an attempt leaves: its row (the measurement arithmetic), the schema, the Parquet store, its cost."""
