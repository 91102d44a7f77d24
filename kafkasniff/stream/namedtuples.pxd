"""Named tuples made in C, for the loops that make one per segment, frame or message.

`named_tuple(Kind, values)` is what `tuple.__new__(Kind, values)` makes (a named tuple's own constructor is a Python
function): an instance of the tuple subclass holding the values. Compiled code calls tuple's `__new__` through an
attribute lookup, a call and a copy of the arguments, which cost more than the rest of an in-order segment's
handling; this copies the values into the new instance only, as tuple's `__new__` does at its end.
"""

cdef extern from *:
    """
    static PyObject *kafkasniff_named_tuple(PyObject *kind, PyObject *values) {
        if (!PyType_Check(kind) || !PyType_IsSubtype((PyTypeObject *)kind, &PyTuple_Type) || !PyTuple_Check(values)) {
            PyErr_SetString(PyExc_TypeError, "named_tuple(kind, values): a tuple type and a tuple");
            return NULL;
        }
        Py_ssize_t n = PyTuple_GET_SIZE(values);
        PyObject *made = ((PyTypeObject *)kind)->tp_alloc((PyTypeObject *)kind, n); /* a GC type: tracked */
        if (made == NULL)
            return NULL;
        for (Py_ssize_t i = 0; i < n; i++)
            PyTuple_SET_ITEM(made, i, Py_NewRef(PyTuple_GET_ITEM(values, i)));
        return made;
    }
    """
    object named_tuple "kafkasniff_named_tuple"(object kind, object values)
