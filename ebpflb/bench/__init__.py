"""Benchmarks behind `ebpflb bench`: each returns a JSON-able report and renders it as text."""
