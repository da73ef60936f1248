"""Renderers: the text table and the JSON dump, from finished spans only.

Nothing here knows which source or framework produced the spans: a table can be
rebuilt from spans read back from a file or a trace backend.
"""
