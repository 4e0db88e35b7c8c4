"""Only what pyproject.toml cannot say: the wheel carries binaries, and its tag.

The package holds prebuilt ELF files and no Python extension, so it runs on any Python 3 and has
no ABI tag, but it is bound to a platform: FERROCE_WHEEL_PLATFORM, e.g. manylinux_2_34_x86_64,
which packaging/python/build.sh computes from the GLIBC_2.N symbol versions the files import.
"""

import os

from setuptools import Distribution, setup
from wheel.bdist_wheel import bdist_wheel


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        # Binaries inside: a platform wheel ("Root-Is-Purelib: false"), installed in platlib.
        return True


class BinaryWheel(bdist_wheel):
    def get_tag(self):
        platform = os.environ.get("FERROCE_WHEEL_PLATFORM")
        if not platform:
            raise SystemExit("FERROCE_WHEEL_PLATFORM is not set (packaging/python/build.sh sets it)")
        return "py3", "none", platform


setup(distclass=BinaryDistribution, cmdclass={"bdist_wheel": BinaryWheel})
