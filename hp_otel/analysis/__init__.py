"""Putting the ranks side by side: the first divergence, the hang suspect, the stragglers.

Each rank's spans file (`CommDebugMode.write_spans`, or what the hang watchdog wrote)
holds its collectives with `hp_otel.collective.seq`: their order on each process group within
a window.  Ranks of one group must issue the same collectives in the same order; this
package lines them up by (window, group, seq) and reports

- the first divergence of each group: the first seq where ranks issued different
  collectives (op, shapes, dtype, reduce op);
- ranks that never reached a collective others issued (the hang suspect: the others
  wait for it in that collective);
- for collectives every rank reached, the arrival skew (last issue − first issue) and
  which rank was last: the straggler table.

It works on any engine's spans, and on torch's Flight Recorder dumps (`flight_recorder`);
the clocks of ranks on different hosts differ by their offset, which the skew includes.
"""

from hp_otel.analysis.comparing import RanksReport, compare, compare_files
from hp_otel.analysis.flight_recorder import read_any_rank_file, read_flight_recorder_file
from hp_otel.analysis.reading import RankCall, RankFile, RankInputError, read_rank_file
from hp_otel.analysis.reporting import format_report, report_to_json

__all__ = [
    "RankCall",
    "RankFile",
    "RankInputError",
    "RanksReport",
    "compare",
    "compare_files",
    "format_report",
    "read_any_rank_file",
    "read_flight_recorder_file",
    "read_rank_file",
    "report_to_json",
]
