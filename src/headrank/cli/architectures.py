"""``headrank architectures``: every model type transformers knows, measured or refused (and why)."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer
from rich.table import Table

from headrank.cli.common import app, out_console, user_errors


@app.command()
@user_errors
def architectures(
    check: Annotated[str | None, typer.Option("--check", help="discover and verify this model type now against its own forward (cached)")] = None,
    status: Annotated[str | None, typer.Option("--status", help="list only types with this status: table, verified, refused, unchecked")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the records as JSON")] = False,
) -> None:
    """Every causal-LM, masked-LM and sequence-to-sequence model type of the installed transformers:
    measured (layout table, or discovered and verified against the module's forward; an
    encoder-decoder as encoder, decoder and cross-attention) or refused, with the reason."""
    import transformers

    from headrank.analysis.architectures import architectures as records
    from headrank.analysis.architectures import check as run_check
    from headrank.analysis.architectures import counts
    from headrank.errors import HeadRankError

    if status not in (None, "table", "verified", "refused", "unchecked"):
        raise HeadRankError(f"--status must be table, verified, refused or unchecked; got {status!r}")
    if check is not None and status is not None:
        raise HeadRankError("--status lists types; --check verifies one: give one of them")
    if check is not None:
        row = run_check(check)
        keys = ("model_type", "status", "split", "modules", "position", "qk_norm", "max_logits_error",
                "max_values_error", "max_output_error", "rotary_style", "max_band_error", "parts", "seconds",
                "transformers")
        if as_json:
            sys.stdout.write(json.dumps({k: row.get(k) for k in keys}, indent=1) + "\n")
            return
        kinds = f"{'/'.join(p['attention'] for p in row['parts'])} attention, " if row.get("parts") else ""
        out_console.print(f"{check}: verified ({kinds}{row['split']}, {row['position']}, max logit error "
                          f"{row['max_logits_error']:.2g}, {row['seconds']:.1f} s, transformers {row['transformers']})")
        return
    recs = records()
    c = counts(recs)
    shown = [r for r in recs if status is None or r["status"] == status]
    if as_json:
        sys.stdout.write(json.dumps({"transformers": transformers.__version__, "counts": c, "types": shown}) + "\n")
        return
    t = Table("model_type", "task", "status", "attention", "detail")
    for r in shown:
        task = r["task"] + (" + seq2seq" if r["seq2seq"] and "seq2seq" not in r["task"] else "")
        t.add_row(r["model_type"], task, r["status"], r["kinds"], r["detail"])
    out_console.print(t)
    out_console.print(f"transformers {transformers.__version__}: {c['types']} causal-LM and masked-LM types; "
                      f"{c['measured']} measured ({c['table']} layout table, {c['verified']} verified), "
                      f"{c['refused']} refused, {c['unchecked']} unchecked")
    out_console.print(f"and {c['seq2seq_types']} sequence-to-sequence types (counted apart): {c['seq2seq_measured']} "
                      f"measured as encoder, decoder and cross-attention, {c['seq2seq_decoder_only']} through their "
                      f"causal-LM class only, {c['seq2seq_refused']} refused, {c['seq2seq_unchecked']} unchecked")
