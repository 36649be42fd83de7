/*
 * device_uring.c - io_uring-only methods of RawBlockDevice.
 * (Until the io_uring engine lands, a device never has io_uring enabled.)
 */
#include "rbpy.h"

static PyObject *not_enabled(void)
{
    PyErr_SetString(PyExc_RuntimeError, "io_uring not enabled");
    return NULL;
}

#define RBPY_URING_ONLY(fn)                                                                        \
    PyObject *fn(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)     \
    {                                                                                              \
        (void)args, (void)nargs, (void)kwnames;                                                    \
        if (rbpy_device_check_open((RawBlockDeviceObject *)self) < 0)                              \
            return NULL;                                                                           \
        return not_enabled();                                                                      \
    }

RBPY_URING_ONLY(rbpy_dev_batched_write)
RBPY_URING_ONLY(rbpy_dev_batched_read)
RBPY_URING_ONLY(rbpy_dev_read_uring)
RBPY_URING_ONLY(rbpy_dev_write_uring)
RBPY_URING_ONLY(rbpy_dev_register_fixed_buffers)

PyObject *rbpy_dev_wait_iouring(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    (void)self, (void)args, (void)nargs, (void)kwnames;
    return Py_BuildValue("([][])");
}

PyObject *rbpy_dev_worker_error(PyObject *self, PyObject *unused)
{
    (void)self, (void)unused;
    Py_RETURN_NONE;
}

PyObject *rbpy_dev_fixed_buffer_status(PyObject *self, PyObject *unused)
{
    (void)self, (void)unused;
    return Py_BuildValue("(Oi)", Py_False, 0);
}

void rbpy_uring_batches_free(RawBlockDeviceObject *self)
{
    (void)self;
}
