"""Package layout of the server distribution ``fortis``; import namespace ``fortis``.

The top-level folders are fixed by the product's design card (DESIGN.md section 2), so the
import packages are mapped onto them here:

    fortis.core       -> core/            (the pure domain kernel: tasks, answers, rules)
    fortis.infra      -> infra/           (infrastructure: storage, migrations, gRPC server plumbing)
    fortis.services   -> services/        (the five gRPC services and their domain code)
    fortis.adapters   -> adapters/        (target adapters)
    fortis.cli        -> clients/cli/     (the `fortis` command line and its demo plans)

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
    "fortis.cli": ("clients/cli", []),
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
