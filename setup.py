"""Build script: the metadata is in setup.cfg; this file only ships the repository's top-level
`configs/` inside the package, as `blayers.lab.configs` (so an installed wheel finds every gin
file without a checkout), which setup.cfg's declarative `packages = find:` cannot express."""

from setuptools import find_packages, setup

setup(
    packages=[
        # `launch/` and `experiments/` at the top of a checkout are aliases of these; the wheel
        # ships only the `blayers` namespace.
        *find_packages(include=["blayers", "blayers.*"]),
        "blayers.lab.configs",
    ],
    package_dir={"blayers.lab.configs": "configs"},
    package_data={
        "blayers.lab.configs": ["*.gin", "*/*.gin"],
        # The point patterns of the Cox process experiment (R's boot data; provenance in each file).
        "blayers.lab.data": ["point_patterns/*.csv"],
    },
)
