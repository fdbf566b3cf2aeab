"""Equal-compute experiments: the cooperative method against its baselines
(:mod:`.methods`), each of its mechanisms switched off in turn (:mod:`.ablation`), and
the communication-overhead controller against fixed sharing intervals (:mod:`.budget`),
all run in the simulator with every Compute FLOP counted (:mod:`.counted`). The scripts
in ``benchmarks/`` are their command lines."""
