"""The run designs: their claims on planted data both ways (held on an effect beyond the margin,
not held on a null inside it), untested with the command that runs them when not run, and the
quick and full profiles run nothing (the designs are fixed in params before they run)."""

import numpy as np

from headrank.studies import designs as D

P = D.DesignsParams.designs()


def _decouple_runs(gain):
    rows = []
    for s in range(8):
        jitter = 0.01 * (s % 3)
        for fam, a, o, ppl in (("coupled", 0.0, 0.0, 20.0), ("coupled", 0.5, 0.5, 17.0),
                               ("decoupled", 0.1, 0.5, 17.0 - gain), ("decoupled", 0.0, 0.5, 18.0)):
            rows.append({"family": fam, "attn": a, "other": o, "seed": s, "val_ppl": ppl + jitter,
                         "test_ppl": ppl + jitter + 0.001 * s})
    return {"decouple_best": {"runs": rows}}


def test_decouple_best_both_ways():
    held = D.decouple_best(_decouple_runs(gain=1.0), P)
    assert held.verdict == "held" and held.measured["best_decoupled"] == (0.1, 0.5) and held.tests[0]["n"] == 8
    null = D.decouple_best(_decouple_runs(gain=0.0), P)
    assert null.verdict == "not held" and "TOST" in null.reason


def _sv(rank, seed):
    s = np.zeros(16)
    s[:rank] = 1.0 + 0.001 * seed
    return [s.tolist()] * 4  # four heads


def test_online_rank_both_ways_and_its_exposure_gate():
    def data(r0, r1, e=8.2):
        return {"online_rank": {"sv_layer1_ov": {"0": {str(s): _sv(r0, s) for s in range(8)},
                                                 "0.1": {str(s): _sv(r1, s) for s in range(8)}},
                                "exposure": {"0": 0.0, "0.1": e}}}
    assert D.online_rank(data(12, 6), P).verdict == "held"
    assert D.online_rank(data(12, 12), P).verdict == "not held"
    assert D.online_rank(data(12, 6, e=3.0), P).verdict == "inconclusive"


def test_not_run_is_untested_with_its_command_and_quick_runs_nothing():
    q = D.DesignsParams.quick()
    assert q.to_run == () and D.DesignsParams.full().to_run == () and set(P.to_run) == set(D.DESIGNS)
    for c in D.claims({}, q):
        assert c.untested and c.verdict == "inconclusive"
    assert len(P.seeds) >= 8 and P.c_pairs[0][0] * P.c_pairs[0][1] == P.c_pairs[-1][0] * P.c_pairs[-1][1]
