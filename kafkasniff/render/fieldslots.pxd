# cython: language_level=3
"""A Field's slots (FieldBase's storage, protocol/_walk/field.h), for the compiled renderers that read many Fields:
read in C, without looking each name up."""

from cpython.object cimport PyObject


cdef extern from "../protocol/_walk/field.h":
    ctypedef struct FieldObject:
        PyObject *name
        PyObject *type
        Py_ssize_t offset
        Py_ssize_t length
        PyObject *value
        PyObject *children
        PyObject *note
        PyObject *role


cdef inline object slot(PyObject *value):
    """A slot as its attribute reads it (a slot never set reads None)."""
    return None if value == NULL else <object>value
