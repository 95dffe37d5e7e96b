"""Crucible: command line, Python SDK, the embedded stack and the reference research agent."""
