"""The C part of kafkasniff; everything else is declared in pyproject.toml."""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("kafkasniff.capture._headers", ["kafkasniff/capture/_headers.c"]),
    Extension("kafkasniff.protocol._skim", ["kafkasniff/protocol/_skim.c"]),
])
