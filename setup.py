"""The compiled part of kafkasniff (C and Cython modules), and its bytecode; everything else is declared in
pyproject.toml."""

import compileall
from pathlib import Path

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class BuildExtAndBytecode(build_ext):
    """Build the C modules; in place (an editable install), also write the Python modules' bytecode.

    A regular install compiles bytecode when it installs; an editable one never does, and where
    PYTHONDONTWRITEBYTECODE is set Python cannot cache it either: every run would compile every module
    again, which costs each command about 60 ms before it starts."""

    def run(self):
        super().run()
        if self.inplace:
            compileall.compile_dir("kafkasniff", quiet=1)


setup(
    cmdclass={"build_ext": BuildExtAndBytecode},
    ext_modules=[
        Extension("kafkasniff.capture._headers", ["kafkasniff/capture/_headers.c"]),
        Extension("kafkasniff.protocol._walk", sorted(str(p) for p in Path("kafkasniff/protocol/_walk").glob("*.c")),
                  depends=["kafkasniff/protocol/_walk/walk.h", "kafkasniff/protocol/_walk/field.h"]),
        # The stream layer: every packet and every frame of a capture passes through it.
        *cythonize(sorted(str(p) for p in Path("kafkasniff").glob("*/*.pyx")), language_level=3, quiet=True),
    ],
)
