"""Write docs/preregistration.json: for every claim, the hash of its rule per profile and the
commit at which that rule was first fixed, and whether it changed after the stored run.

    PYTHONPATH=src python docs/preregistration.py --runs=quick=out/gallery   # rewrite it from those runs
    PYTHONPATH=src python docs/preregistration.py --check    # exit 1 if the file is not what the code gives

The claims are enumerated by judging the test suite's synthetic data (tests/studies) and short
real runs of fig1 and scale (their claims need a run; the data never enter a hash). A claim's
``rule_sha256`` (headrank.studies.prereg) depends only on its code and its profile's params.

"First fixed" is found in the git history: the oldest commit of the unbroken run of commits,
ending at HEAD, in which the claim's judging functions (with the module functions they call and
the module's upper-case constants) read the same as now, the package rename attnrank -> headrank
undone. Params changes are not seen by that walk; the ones on the record are added by hand
(PARAM_CHANGES for every profile, PROFILE_PARAM_CHANGES for one profile), so a claim has one
first-fixed commit per profile (``first_fixed_in``). A rule whose first-fixed commit in a
profile is not an ancestor of (or equal to) the commit that made that profile's stored run
changed after that run: a departure (docs/METHODS.md §4). A profile without a stored run of the
claim's study records None.

The statistics every rule uses (src/headrank/studies/verdicts.py) are part of every hash, so a
rule is fixed no earlier than that module's last change (the walk above sees only the judging
module). ``dagger`` (the † of the claims pages): the rule was set after data with the same seeds
existed (:data:`SAME_SEED_DATA`: the earlier stored runs of that profile; a re-run regenerates the
same data), so it is not a pre-registration in the strict sense, whatever run it judges now.
``stored_runs``: the runs that made today's tables, by the commit of the code that made their
data (run.json's ``data_commit``) and the commit that judged them (``judged_commit``); a profile
absent there has no table on today's rules.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "preregistration.json"

#: runs with the same seeds that existed before today's rules (the earlier stored runs of each
#: profile, as the earlier record gave them): a rule fixed after them carries the dagger
SAME_SEED_DATA = {
    "quick": {"collapse": "ee3ec44", "decouple": "2b98701", "fig3": "16ea643", "table1": "16ea643",
              "compress": "16ea643", "fig1": "c3962e7", "fig2": "c3962e7", "fig4": "c3962e7", "fig5": "c3962e7",
              "scale": "c3962e7"},
    "full": {"collapse": "ee3ec44", "decouple": "2b98701", "fig3": "16ea643", "table1": "16ea643",
             "compress": "16ea643", "fig1": "c3962e7", "fig2": "c3962e7", "fig4": "c3962e7", "fig5": "c3962e7",
             "scale": "c3962e7"},
    "paper": {s: "d5f5380" for s in ("fig3", "table1", "decouple")},
    "paper_vit": {"fig3": "f052453"},
}

#: the runs that made today's tables: profile -> study -> (data commit, judged commit, what). Read
#: from run.json of each part of the runs given on the command line (``--runs quick=out/gallery``).
STORED_RUNS: dict[str, dict[str, tuple[str, str, str]]] = {}


def stored_runs(specs: list[str]) -> dict[str, dict[str, tuple[str, str, str]]]:
    """``profile=DIR`` → each part's (data_commit, judged_commit, note) from DIR/NAME/run.json."""
    out: dict[str, dict[str, tuple[str, str, str]]] = {}
    for spec in specs:
        profile, d = spec.split("=", 1)
        for run in sorted(Path(d).glob("*/run.json")):
            meta = json.loads(run.read_text())
            dc, jc = meta.get("data_commit") or "?", meta.get("judged_commit") or "?"
            data, judged = dc[:7], jc[:7]
            note = f"data made by {dc.replace('+dirty', ' with uncommitted changes')}, judged by " \
                   f"{jc.replace('+dirty', ' with uncommitted changes')}"
            out.setdefault(profile, {})[run.parent.name] = (data, judged, note)
    return out


#: rule changes made in params (thresholds, horizons, grids), which the code walk does not see,
#: by claim name or by study
PARAM_CHANGES = {
    "fig2.gap_vanishes": ("1dca472", "horizon cut from 6,000 to 2,000 steps after the longer runs were seen"),
    "fig2.sgd_control": ("41ced41", "eta 0.05 -> 0.01 after a trial at 0.05 missed the rule"),
    "fig5.eps_sweep": ("823bce5", "the eps = 3 point"),
    "fig3": ("dd058ec", "fig3's params gained `models` (the paper_vit profile): the same verdicts with both models, "
                        "but every fig3 hash changed"),
}


#: params changes of one profile: profile -> {study or claim name: (commit, why)}
PROFILE_PARAM_CHANGES = {
    "paper": {s: ("d5f5380", "the paper profile's params as sized for this machine (the profile first appeared "
                             "in 550a30a at width 64; that start was stopped and nothing of it kept)")
              for s in ("fig3", "table1", "decouple")},
}
PROFILE_PARAM_CHANGES["paper"]["fig3"] = ("0b88e97", "the ViT chosen by the pilot (lr 1e-2, 8,100 steps, runs in vit_b) "
                                                     "after the paper run's LM and ViT runs existed")
PROFILE_PARAM_CHANGES["paper_vit"] = {"fig3": ("0b88e97", "the ViT half of the paper profile, configured by the pilot "
                                                          "(grid and criterion fixed in 948ccc6 before it ran)")}


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout


def static_digest(source: str, funcs: list[str]) -> str | None:
    """:func:`headrank.studies.prereg.static_digest` with the package rename undone."""
    from headrank.studies.prereg import static_digest as digest

    return digest(source.replace("attnrank", "headrank").replace("AttnRankError", "HeadRankError"), funcs)


def first_fixed(judged_by: str) -> str:
    """The oldest commit since which every judging module reads the same (see the docstring)."""
    found = []
    for spec in (s for s in judged_by.split(",") if s):
        mod, func = spec.split(":")
        path = "src/" + mod.replace(".", "/") + ".py"
        if not (ROOT / path).exists():
            path = path[:-3] + "/__init__.py"
        now = static_digest(git("show", f"HEAD:{path}"), [func.split(".")[0]])
        log = git("log", "--format=%h", "--follow", "--name-only", "--", path).split()
        pairs = list(zip(log[::2], log[1::2], strict=True))
        fixed = pairs[0][0]
        for commit, p in pairs:
            if static_digest(git("show", f"{commit}:{p}"), [func.split(".")[0]]) != now:
                break
            fixed = commit
        found.append(fixed)
    verdicts = git("log", "-1", "--format=%h", "--", "src/headrank/studies/verdicts.py").strip()
    return latest([*found, verdicts]) if verdicts else latest(found)


def is_ancestor(a: str, b: str) -> bool:
    return subprocess.run(["git", "-C", str(ROOT), "merge-base", "--is-ancestor", a, b]).returncode == 0


def latest(commits: list[str]) -> str:
    out = commits[0]
    for c in commits[1:]:
        if is_ancestor(out, c):
            out = c
    return out


def probe_claims() -> dict[str, list]:
    """Every study's claims on synthetic data (fig1, scale: short real runs), by study."""
    sys.path.insert(0, str(ROOT))
    from dataclasses import replace

    from tests.studies import test_compress, test_coverage

    from headrank.studies.registry import get
    from headrank.util.fileio import jsonable

    by: dict[str, list] = {}
    for c in test_coverage._all_claims():
        by.setdefault(c.name.split(".")[0], []).append(c)
    compress = get("compress").study
    by["compress"] = compress.claims(test_compress._data([1.0, 1.2], [0.5, 0.6]), compress.params.quick())
    for name, small in (("fig1", {}), ("scale", {"steps": 200, "evals": 8, "windows": 8})):
        study = get(name).study
        p = replace(study.params.quick(), **small)
        data = json.loads(json.dumps(jsonable(study.run(p))))
        by[name] = study.claims(data, p)
    return by


def profile_change(profile: str, name: str) -> tuple[str, str] | None:
    """The params change of ``profile`` on the record for claim ``name`` (by claim, else by study)."""
    changes = PROFILE_PARAM_CHANGES.get(profile, {})
    return changes.get(name) or changes.get(name.split(".")[0])


def build() -> dict:
    from headrank.studies import prereg
    from headrank.studies.registry import get

    out: dict = {"about": __doc__.split("\n\n")[0].strip(), "stored_runs": STORED_RUNS,
                 "same_seed_data": SAME_SEED_DATA, "claims": {}}
    for study, claims in sorted(probe_claims().items()):
        entry = get(study).study
        profiles = {p: entry.make_params(p) for p in entry.profiles()}
        for c in claims:
            fixed = first_fixed(c.judged_by)
            note = ""
            change = PARAM_CHANGES.get(c.name) or PARAM_CHANGES.get(study)
            if change:
                pc, note = change
                fixed = latest([fixed, pc])
            row = {"judged_by": c.judged_by, "first_fixed": fixed, "note": note,
                   "rule_sha256": {k: prereg.rule_sha256(c.name, c.judged_by, p) for k, p in profiles.items()}}
            row["first_fixed_in"] = {k: latest([fixed, profile_change(k, c.name)[0]]) if profile_change(k, c.name)
                                     else fixed for k in profiles}
            row["profile_notes"] = {k: profile_change(k, c.name)[1] for k in profiles if profile_change(k, c.name)}
            row["changed_after_stored_run"] = {
                k: (not is_ancestor(row["first_fixed_in"][k], STORED_RUNS[k][study][0])
                    if study in STORED_RUNS.get(k, {}) and STORED_RUNS[k][study][0] != "?" else None)
                for k in profiles}
            row["dagger"] = {k: (not is_ancestor(row["first_fixed_in"][k], SAME_SEED_DATA[k][study])
                                 if study in SAME_SEED_DATA.get(k, {}) else None) for k in profiles}
            out["claims"][c.name] = row
    return out


def main(argv: list[str]) -> int:
    STORED_RUNS.update(stored_runs([a.removeprefix("--runs=") for a in argv if a.startswith("--runs=")]))
    if not STORED_RUNS and OUT.exists():  # --check without --runs: the runs on the record
        STORED_RUNS.update({k: {s: tuple(v) for s, v in d.items()}
                            for k, d in json.loads(OUT.read_text()).get("stored_runs", {}).items()})
    data = build()
    text = json.dumps(data, indent=1, sort_keys=True) + "\n"
    if "--check" in argv:
        same = OUT.exists() and OUT.read_text() == text
        print("docs/preregistration.json matches the code" if same else "docs/preregistration.json is stale")
        return 0 if same else 1
    OUT.write_text(text)
    print(f"wrote {OUT} ({len(data['claims'])} claims)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
