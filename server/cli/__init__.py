"""The ``fortis`` command line (server distribution; ``python -m fortis.server.cli``).

    fortis demo --out DIR                 evaluate the Fashion-MNIST demo plan, all embedded
    fortis run PLAN.yaml --out DIR        run a plan (embedded, or --address of a running Fortis)
    fortis watch|report|list|cancel ...   follow and manage evaluations of a running Fortis
    fortis serve [--service NAME]         serve all services in one process, or one of them
    fortis ledger --session ID [--json]   query counts from the proxy's ledger
    fortis perturbations|attacks [--json] the catalogue (local, or --address of a server)
    fortis sheets --out DIR               example sheets (PNG) of every perturbation
    fortis score FILE.json | --list       compute a metric from recorded predictions
    fortis validate PLAN.yaml             check a plan and list every problem
    fortis train                          train the Fashion-MNIST models now (else on first use)

Lives in the server distribution (mapped from services/cli/ by setup.py), not in the slim
``fortis-client``: its local commands need the engine; its remote ones use ``fortis.client``.
"""

from fortis.server.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
