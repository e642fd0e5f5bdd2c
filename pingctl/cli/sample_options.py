"""`pingctl sample`'s options as the question they ask (`pingctl.api.checks` re-exports the
question objects): the mode inferred from what was given, an option of another mode refused by
its flag, every size bounded, before a file is read or the model loads."""

from __future__ import annotations

from pathlib import Path

from pingctl.api import checks as C
from pingctl.artifacts import sample_output as SO
from pingctl.errors import UsageError, require_command


def question_from_options(*, src: str | None = None, dst: str | None = None, rtt: str | None = None,
                          time: str | None = None, context: Path | None = None, context_per_pair: int | None = None,
                          context_policy: str | None = None, context_k: int | None = None,
                          n: int | None = None, measurements: int | None = None, timestamps: bool | None = None,
                          since: str | None = None, until: str | None = None, k: int | None = None,
                          out: Path | None = None, plot: Path | None = None, pairs: Path | None = None,
                          calibration: Path | None = None, exact: bool = False, seed: int | None = None,
                          temperature: float | None = None, top_p: float | None = None,
                          sampling=None, answer: str | None = None, combination: Path | None = None) -> C.Question:
    """The question `pingctl sample`'s options ask (None: not given), checked: the mode is
    inferred from what was given, an option of another mode is refused by name, sizes are
    bounded. `sampling` (config `sample`: seed, temperature, top_p) fills the sampling values
    not given. Reads no file; an --out or --plot that cannot be written is refused."""
    src, dst = (C.address_option(v, name) for v, name in ((src, "--src"), (dst, "--dst")))
    C.check_answer(answer)
    if exact and pairs is None:
        raise UsageError("--exact is for --pairs; a single --src/--dst distribution is always computed for every code")
    if pairs is not None:
        given = [name for v, name in ((src, "--src"), (dst, "--dst"), (rtt, "--rtt"), (time, "--time"), (n, "--n"),
                                      (plot, "--plot"), (timestamps, "--timestamps/--no-timestamps"),
                                      (since, "--since"), (until, "--until"))
                 if v is not None]
        if given:
            raise UsageError(f"{', '.join(given)}: --pairs answers the pairs (and times) of its file; "
                             "give either --pairs or a single query")
        # the distributions are computed, not sampled or ranked: these would change nothing
        unused = [name for v, name in ((k, "-k"), (measurements, "--measurements"), (seed, "--seed"),
                                       (temperature, "--temperature"), (top_p, "--top-p")) if v is not None]
        if unused:
            raise UsageError(f"{', '.join(unused)}: --pairs computes each pair's RTT distribution exactly "
                             "(no sampling, no ranking), so this would change nothing; drop it")
        q = C.PairsQuestion(pairs=pairs, out=out, exact=exact, calibration=calibration, context=context,
                          context_per_pair=context_per_pair, context_policy=context_policy or "probe",
                          context_k=context_k)
        if out is not None:
            C.check_writable(*(("--out", p) for p in (out, SO.rejects_path(out))))
        return q
    mode = infer_mode(src, dst, rtt)
    # everything the user typed is validated before the (slow) model load
    # (a completion, inverse search and generation build their prompts without a timestamp)
    for given, name, modes in ((n, "--n", ("inverse", "generate")), (out, "--out", ("generate", "distribution")),
                               (plot, "--plot", ("distribution",)), (time, "--time", ("distribution",)),
                               (timestamps, "--timestamps/--no-timestamps", ("generate",)),
                               (k, "-k", ("complete", "inverse")), (measurements, "--measurements", ("generate",)),
                               # a distribution and a completion are computed exactly; only these two sample
                               (seed, "--seed", ("inverse", "generate")),
                               (temperature, "--temperature", ("inverse", "generate")),
                               (top_p, "--top-p", ("generate",)),
                               (since, "--since", ("generate",)), (until, "--until", ("generate",)),
                               (calibration, "--calibration", ("distribution",)),
                               (answer, "--answer", ("distribution",)),
                               (combination, "--combination", ("distribution",))):
        if given is not None and mode not in modes:
            raise UsageError(f"{name} does not apply to {C.MODE_NAMES[mode]}; it is for "
                             + " and ".join(C.MODE_NAMES[m] for m in modes))
    # the sizes next: nothing below may start work on an unbounded one
    if mode == "inverse":
        C.bound("--n", n, C.MAX_SAMPLES, "inverse search runs every sample through each address byte's "
                                      "forward pass and holds its log-probabilities")
    elif mode == "generate":
        C.bound("--n", n, C.MAX_STREAMS, "generation decodes every stream token by token, a forward pass over "
                                      "all of them per token")
    fam_src, fam_dst = (p[0] if p else None for p in C.parse_pair(src, dst))
    if mode == "complete":
        # the side not given is any address of the other side's family
        src = src or C.any_address(fam_dst)
        dst = dst or C.any_address(fam_src)
    t_query = C.time_option(time)
    period = C.generation_period(since, until) if since is not None or until is not None else None
    C.check_context_options(context, context_per_pair, context_policy or "probe", context_k)
    rtt_lo, rtt_hi = C.rtt_range(rtt) if rtt is not None else (None, None)
    if mode == "complete" and rtt is not None and rtt_hi > rtt_lo:
        raise UsageError(f"--rtt {rtt}: a completion conditions on one RTT (e.g. --rtt 20); "
                         "ranges are for inverse search (--src IP --rtt 10-30)")
    if out is not None and out.suffix not in SO.SINGLE_SUFFIXES:
        raise UsageError(f"--out {out}: written as .parquet, .csv or .json")
    common = {"context": context, "context_per_pair": context_per_pair, "context_policy": context_policy or "probe",
              "context_k": context_k}
    s = {"seed": _given(seed, sampling, "seed", 0), "temperature": _given(temperature, sampling, "temperature", 1.0)}
    if mode == "distribution":
        q: C.Question = C.RttQuestion(src=src, dst=dst, time=t_query, out=out, plot=plot, calibration=calibration,
                                  **common)
    elif mode == "complete":
        q = C.CompleteQuestion(src=src, dst=dst, rtt=rtt_lo, k=C.K if k is None else k, **common)
    elif mode == "inverse":
        q = C.InverseQuestion(src=src, rtt_lo=rtt_lo, rtt_hi=rtt_hi, samples=C.SAMPLES if n is None else n,
                            k=C.K if k is None else k, **s, **common)
    else:
        q = C.GenerateQuestion(streams=C.STREAMS if n is None else n,
                             measurements=C.MEASUREMENTS if measurements is None else measurements, src=src,
                             timestamps=timestamps, period=period, out=out, top_p=_given(top_p, sampling, "top_p", 1.0),
                             **s, **common)
    C.check_writable(("--out", out), ("--plot", plot))
    if plot is not None:
        require_command("sample --plot")
    return q


def _given(value, sampling, key: str, default):
    if value is not None:
        return value
    return getattr(sampling, key) if sampling is not None else default


def infer_mode(src: str | None, dst: str | None, rtt: str | None) -> str:
    """Which single question --src/--dst/--rtt ask: distribution | complete | inverse | generate."""
    if src and dst and not C.is_pattern(src) and not C.is_pattern(dst) and rtt is None:
        return "distribution"
    if C.is_pattern(src) or C.is_pattern(dst):
        return "complete"
    if src and rtt and not dst:
        return "inverse"
    if not dst and not rtt:
        return "generate"
    raise UsageError(
        "say what to ask: --src IP --dst IP (RTT distribution), a pattern in --src/--dst "
        "(completion), --src IP --rtt MS (inverse search) or --n N [--src IP] (generation)"
    )
