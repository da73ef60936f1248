"""The hot path of a window: from observer calls to counts, metrics and spans.

`observer` is the interface sources call; `recorder` implements it (exact counts, metric
totals, typed `events`); `span_builder` turns events into SDK spans kept by
`span_store`; `instruments` are the metric instruments; `matching` names a collective's
window across ranks; `installation` keeps hooks between windows; `signal_guard` keeps
Ctrl-C out of install/uninstall; `user_hooks` runs the user's span hooks; `watchdog` writes
this rank's spans when a collective does not complete.  No framework is imported here.
"""
