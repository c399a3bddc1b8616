"""Batch jobs (OpenAI's Batch API) on braid's store: validation now, the runner next (issue 30)."""
