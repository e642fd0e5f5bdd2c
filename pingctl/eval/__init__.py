"""`pingctl eval`: compare the model with classical RTT predictors on a held-out split.

Model-independent parts (see docs/eval.md); the splits come read and checked from
`pingctl.artifacts.table.load_split` (no module here opens a split itself):
    registry   the baselines by report name (a `Baseline` protocol, `Spec`s): what the report
               fits, which regimes each serves (`eval --regimes`), the table in docs/eval.md
    baselines  GlobalMedian, PrefixMedian, Prefix16Median, PairMedian (hierarchical fallbacks);
               PromptMedian and refit_prediction (predictors that read the model's prompts)
    vivaldi    hashicorp/serf's Vivaldi coordinates (Client, Swarm) and the Vivaldi baseline
    embedding  least-squares embedding with heights on log RTT
    metrics    relative error and slices, calibration (PIT, coverage), CRPS, failure prediction, NLL
    plots      relative-error CDF, calibration, predicted vs actual (matplotlib Agg, atomic writes)
    report     baseline_table, add_predictor, add_prompt_baselines, compare
    presentation  summary_rows, advice, write_plots (drawn by plots), prediction_columns
    regimes    `eval --regimes`: one model on every regime of a regimes split
"""
