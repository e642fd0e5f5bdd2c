"""`pingctl eval`: compare the model with classical RTT predictors on a held-out split.

Model-independent parts (see docs/eval.md):
    baselines  GlobalMedian, PrefixMedian, Prefix16Median, PairMedian (hierarchical fallbacks);
               PromptMedian and refit_prediction (predictors that read the model's prompts)
    vivaldi    hashicorp/serf's Vivaldi coordinates (Client, Swarm) and the Vivaldi baseline
    embedding  least-squares embedding with heights on log RTT
    metrics    relative error and slices, calibration (PIT, coverage), CRPS, failure prediction, NLL
    plots      relative-error CDF, calibration, predicted vs actual (matplotlib Agg, atomic writes)
    report     load_split, baseline_table, add_predictor, add_prompt_baselines, summary_rows, write_plots
    regimes    `eval --regimes`: one model on every regime of a regimes split
"""
