"""Package layout of the server distribution ``fortis``; import namespace ``fortis``.

Each top-level folder is one layer, mapped onto its import package here:

    fortis.core       -> core/            the domain kernel: tasks, answers, matching rules
    fortis.services   -> services/        the five gRPC services (+ common: shared contract data)
    fortis.infra      -> infra/           infrastructure: storage, migrations, gRPC server plumbing
    fortis.adapters   -> adapters/        target adapters
    fortis.server     -> server/          the composition root (server.app) and the `fortis`
                                          command line (server.cli, with its demo plans)

``fortis`` itself is a namespace package (PEP 420): the client and the generated contract
stubs (``fortis.client``, ``fortis.<area>.v1``) come from the slim ``fortis-client``
distribution in clients/python/, which this one depends on.
"""

from setuptools import find_packages, setup

ROOTS = {
    "fortis.core": ("core", []),
    "fortis.infra": ("infra", []),
    "fortis.services": ("services", []),
    "fortis.adapters": ("adapters", []),
    "fortis.server": ("server", []),
}

packages: list[str] = []
package_dir: dict[str, str] = {}
for name, (folder, exclude) in ROOTS.items():
    package_dir[name] = folder
    packages.append(name)
    packages += [f"{name}.{sub}" for sub in find_packages(folder, exclude=exclude)]

setup(
    packages=sorted(set(packages)),
    package_dir=package_dir,
    package_data={"": ["*.json", "*.yaml", "*.html", "*.css", "*.js", "*.png", "*.jpg", "*.binpb"],
                  "fortis.services.report": ["templates/*.j2"]},
    include_package_data=True,
)
