"""Package layout: one distribution, import namespace ``fortis``.

The top-level folders are fixed by the product's design card (DESIGN.md section 2), so the
import packages are mapped onto them here:

    fortis            -> clients/python/fortis   (SDK, CLI, generated protobuf stubs)
    fortis.services   -> services/               (the five gRPC services and their domain code)
    fortis.adapters   -> adapters/               (target adapters)
"""

from setuptools import find_packages, setup

ROOTS = {
    "fortis": "clients/python/fortis",
    "fortis.services": "services",
    "fortis.adapters": "adapters",
}

packages: list[str] = []
package_dir: dict[str, str] = {}
for name, folder in ROOTS.items():
    package_dir[name] = folder
    packages.append(name)
    packages += [f"{name}.{sub}" for sub in find_packages(folder)]

setup(
    packages=sorted(set(packages)),
    package_dir=package_dir,
    package_data={"": ["*.json", "*.yaml", "*.html", "*.css", "*.js", "*.png", "*.jpg"]},
    include_package_data=True,
)
