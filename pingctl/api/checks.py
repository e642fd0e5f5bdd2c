"""What the service and the CLI check before any work, as the model checks it: addresses,
patterns, RTT ranges, the bounds of a question, pairs and score inputs read before a model
loads. Both reach the model only through `pingctl.api` (.importlinter), so the parsers they share
with it are named here; their home is the question model (`pingctl.infer`)."""

from pingctl.infer.calibration import Calibration, check_fits, prompt_mismatch
from pingctl.infer.calibration import load as load_calibration
from pingctl.infer.model import check_engine, trained_with_timestamps, untimed_run
from pingctl.infer.pairs import CONTEXT_ROWS_MAX, AddressError, Pairs, clean_address, read_pairs
from pingctl.infer.queries import MEAN_CEILING_MS, QUANTILES, TRIM, parse_pair, parse_pattern
from pingctl.infer.questions import (COMPLETE_BEAM, CONTEXT_K, K, SAMPLES, CompleteQuestion, InverseQuestion,
                                     PairsQuestion, RttQuestion, address_option, check_run, probe_context,
                                     question_from_options, rtt_range)
from pingctl.infer.runtime import check_hardware
from pingctl.infer.score import check_options as check_score_options
from pingctl.infer.score import read_input as read_scores
from pingctl.infer.score import score_meta
from pingctl.infer.score import summary as score_summary

__all__ = ["COMPLETE_BEAM", "CONTEXT_K", "CONTEXT_ROWS_MAX", "K", "MEAN_CEILING_MS", "QUANTILES", "SAMPLES", "TRIM",
           "AddressError", "Calibration", "CompleteQuestion", "InverseQuestion", "Pairs", "PairsQuestion",
           "RttQuestion", "check_run", "probe_context", "question_from_options", "address_option", "check_engine", "check_fits", "check_hardware", "check_score_options",
           "clean_address", "load_calibration", "parse_pair", "parse_pattern", "prompt_mismatch", "read_pairs",
           "read_scores", "rtt_range", "score_meta", "score_summary", "trained_with_timestamps", "untimed_run"]
