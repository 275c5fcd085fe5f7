"""Benchmarks: radixchat against its peers, measured side by side in one process run."""
