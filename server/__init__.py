"""The server distribution's entry points: the composition root (``fortis.server.app``) that
wires services, infrastructure and adapters into a running stack or a worker, and the
``fortis`` command line (``fortis.server.cli``) that starts them or talks to a running Fortis."""
