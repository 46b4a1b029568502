"""Local catalogue listings: ``fortis perturbations`` and ``fortis attacks`` read the
registries in-process (no server). With ``--address`` the same commands go through
``fortis.client`` instead (``fortis.server.cli.remote``).
"""

from __future__ import annotations

import argparse
import json


def cmd_perturbations(ns: argparse.Namespace) -> int:
    from fortis.services.perturbation.catalogue import list_catalogue

    items = list_catalogue(ns.kind)
    if ns.json:
        print(json.dumps(items, indent=2, default=str))
        return 0
    levels = {"severity": "sev 1-5", "level": "lvl 1-30", "epsilon": "eps 0-1"}
    print(f"{'id':<28} {'kind':<12} {'family':<12} {'refs':<14} {'levels':<9} {'character':<9} description")
    for it in items:
        ch = it["characterisation"]
        code = (ch["scope"][0] + ch["randomness"][0] + ch["domain"][0]).upper()
        print(f"{it['id']:<28} {it['kind']:<12} {it['family']:<12} {','.join(it['refs']):<14} "
              f"{levels[it['level_kind']]:<9} {code:<9} {it['description']}")
    if not ns.kind:
        print(f"\n{len(items)} entries. character: Global/Local, Deterministic/Stochastic, "
              "Colour/Pixel (DEG-5). Add --json for parameters and level tables; attacks: "
              "`fortis attacks`.")
    return 0


def cmd_attacks(ns: argparse.Namespace) -> int:
    from fortis.services.perturbation.attacks.registry import list_boosters
    from fortis.services.perturbation.catalogue import list_attacks

    items = list_attacks(ns.kind)
    boosters = list_boosters() if ns.kind in (None, "", "transfer") else []
    if ns.json:
        print(json.dumps(items, indent=2))     # each attack lists its "boosters" ids
        return 0
    print(f"{'id':<14} {'kind':<9} {'norms':<8} {'targeted':<9} {'refs':<28} description")
    for it in items:
        print(f"{it['id']:<14} {it['kind']:<9} {','.join(it['norms']):<8} "
              f"{'yes' if it['targeted'] else 'no':<9} {','.join(it['refs']):<28} {it['description']}")
    if boosters:
        print("\nBoosters of the transfer attacks (IEEE-A7), switched on by parameters:")
        print(f"{'id':<9} {'parameters':<24} {'description':<72} paper")
        for b in boosters:
            print(f"{b['id']:<9} {','.join(b['parameters']):<24} {b['description']:<72} "
                  f"{b['paper']}")
    if not ns.kind:
        print(f"\n{len(items)} attacks, {len(boosters)} boosters. Add --json for parameter "
              "schemas (type, default, bounds) and which attacks take each booster.")
    return 0
