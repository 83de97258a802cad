"""The build steps the package needs beyond pyproject.toml:

- the built-in profiles have one source, the top-level profiles/ folder users read and copy,
  and a built package carries a copy of them as package data (bcgtune/data/profiles/), made
  here at build time;
- the compiled line scanner of the log parser (bcgtune/adapters/sglang/log/_lines.c), an
  optional extension: where no C compiler is found the install goes on without it and the
  parser uses its numpy path, which gives the same traces (slower)."""

from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

PROFILES = Path(__file__).resolve().parent / "profiles"


class BuildPyWithProfiles(build_py):
    def run(self):
        super().run()
        dest = Path(self.build_lib) / "bcgtune" / "data" / "profiles"
        dest.mkdir(parents=True, exist_ok=True)
        for src in sorted(PROFILES.glob("*.toml")):
            self.copy_file(str(src), str(dest / src.name))


setup(
    cmdclass={"build_py": BuildPyWithProfiles},
    ext_modules=[
        Extension(
            "bcgtune.adapters.sglang.log._lines",
            ["bcgtune/adapters/sglang/log/_lines.c"],
            optional=True,
            extra_compile_args=["-O3"],
        )
    ],
)
