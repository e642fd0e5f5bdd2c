"""`pingctl eval`: compare the model with classical RTT predictors on a held-out split.

Model-independent parts (see docs/eval.md):
    baselines  GlobalMedian, PrefixMedian, PairMedian (hierarchical fallbacks), Vivaldi coordinates
    metrics    relative error and slices, calibration (PIT, coverage), failure prediction, NLL
    plots      relative-error CDF, calibration, predicted vs actual (matplotlib Agg, atomic writes)
    report     load_split, baseline_table, add_predictor, summary_rows, write_plots
"""
