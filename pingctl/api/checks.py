"""What the service and the CLI check before any work, as the model checks it: addresses,
patterns, RTT ranges, the bounds of a question, pairs and score inputs read before a model
loads. Both reach the model only through `pingctl.api` (.importlinter), so the parsers and question
objects they share with it are named here; their home is the question model (`pingctl.infer`). The
CLI's own option parsing (`pingctl sample`'s flags -> a question) is `pingctl/cli/sample_options.py`."""

from pingctl.infer.calibration import Calibration, check_fits, prompt_mismatch
from pingctl.infer.calibration import load as load_calibration
from pingctl.infer.model import check_engine, trained_with_timestamps, untimed_run
from pingctl.infer.pairs import CONTEXT_ROWS_MAX, AddressError, Pairs, clean_address, read_pairs
from pingctl.infer.predictor import PREDICTORS, check_answer, check_combination
from pingctl.infer.queries import MEAN_CEILING_MS, QUANTILES, TRIM, any_address, parse_pair, parse_pattern
from pingctl.infer.questions import (COMPLETE_BEAM, CONTEXT_K, MAX_SAMPLES, MAX_STREAMS, MEASUREMENTS, MODE_NAMES,
                                     STREAMS, K, SAMPLES, CompleteQuestion, GenerateQuestion, InverseQuestion,
                                     PairsQuestion, Question, RttQuestion, address_option, bound,
                                     check_context_options, check_run, check_writable, generation_period,
                                     is_pattern, probe_context, rtt_range, time_option)
from pingctl.infer.runtime import check_hardware
from pingctl.infer.score import check_options as check_score_options
from pingctl.infer.score import read_input as read_scores
from pingctl.infer.score import score_meta
from pingctl.infer.score import summary as score_summary
from pingctl.infer.score_parts import check_options as check_bucketed
from pingctl.infer.score_parts import partition as partition_scores
from pingctl.infer.score_parts import summary as parts_summary

__all__ = ["COMPLETE_BEAM", "CONTEXT_K", "CONTEXT_ROWS_MAX", "K", "MAX_SAMPLES", "MAX_STREAMS", "MEAN_CEILING_MS",
           "MEASUREMENTS", "MODE_NAMES", "PREDICTORS", "QUANTILES", "SAMPLES", "STREAMS", "TRIM", "AddressError", "Calibration",
           "CompleteQuestion", "GenerateQuestion", "InverseQuestion", "Pairs", "PairsQuestion", "Question",
           "RttQuestion", "address_option", "any_address", "bound", "check_answer", "check_bucketed", "check_combination", "check_context_options", "check_engine",
           "check_fits", "check_hardware", "check_run", "check_score_options", "check_writable", "clean_address",
           "generation_period", "is_pattern", "load_calibration", "parse_pair", "parse_pattern", "partition_scores", "parts_summary", "probe_context",
           "prompt_mismatch", "read_pairs", "read_scores", "rtt_range", "score_meta", "score_summary", "time_option",
           "trained_with_timestamps", "untimed_run"]
