"""The one composition root: the only code that wires services, infrastructure and adapters.

``stack.start_stack`` builds ``fortis serve`` (every service in one process, or one of them);
``worker.run_worker`` builds ``fortis worker`` (a claim loop against a shared store) from the
same ``settings`` and ``parts``, so a server and a worker open their stores, blobs and targets
by one rule.
"""
