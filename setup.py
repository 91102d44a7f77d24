"""The C part of kafkasniff; everything else is declared in pyproject.toml."""

from pathlib import Path

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("kafkasniff.capture._headers", ["kafkasniff/capture/_headers.c"]),
    Extension("kafkasniff.protocol._walk", sorted(str(p) for p in Path("kafkasniff/protocol/_walk").glob("*.c")),
              depends=["kafkasniff/protocol/_walk/walk.h"]),
])
