"""What a run shows: the report schema and its timeline (:mod:`.report`), the trace for
Perfetto, figures, learning curves, console tables and progress lines."""
