"""What to run next: OOM retries, max-batch and the fastest-configuration search. Pure."""
