/* A Field's storage (FieldBase, fields.c): shared with the renderers that read Fields in C (render/bytemap.pyx),
 * so that a byte table of hundreds of thousands of rows reads its fields' slots without asking Python. */
#ifndef KAFKASNIFF_FIELD_H
#define KAFKASNIFF_FIELD_H

#include <Python.h>

typedef struct {
    PyObject_HEAD
    PyObject *name, *type;
    Py_ssize_t offset, length;
    PyObject *value, *children, *note, *role;
} FieldObject;

#endif
