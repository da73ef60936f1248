"""MindSpore sources: its communication functions and `Cell` calls, reported to the observer."""
