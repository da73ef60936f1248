"""What a span is and how it is read back.

`schema` names every span, attribute and metric; `infos` are the typed records sources
report; `codec` is the one encoder and decoder between them and span attributes;
`call_tree` rebuilds the call tree from finished spans; `otlp_json` reads and writes
spans files.  Nothing here knows a framework or records anything.
"""
