"""Build script: the metadata is in setup.cfg; this file only ships the repository's top-level
`configs/` inside the package, as `blayers.lab.configs` (so an installed wheel finds every gin
file without a checkout), which setup.cfg's declarative `packages = find:` cannot express."""

from setuptools import find_packages, setup

setup(
    packages=[
        *find_packages(include=["blayers", "blayers.*", "launch", "launch.*", "experiments"]),
        "blayers.lab.configs",
    ],
    package_dir={"blayers.lab.configs": "configs"},
    package_data={
        "blayers.lab.configs": ["*.gin", "*/*.gin"],
        # The point patterns of the Cox process experiment (R's boot data; provenance in each file).
        "blayers.lab.data": ["point_patterns/*.csv"],
    },
)
