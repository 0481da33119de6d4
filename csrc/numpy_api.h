// numpy's C API, for the calls made on every env step: reading an array's dtype, shape and data pointer
// costs a few nanoseconds this way, against about 0.3 us for a converted nb::ndarray argument.
// module.cpp imports the API once (RLFLOW_NUMPY_IMPORT); every other file includes this header as is.
#pragma once

#include <Python.h>

#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL RLFLOW_ARRAY_API
#ifndef RLFLOW_NUMPY_IMPORT
#define NO_IMPORT_ARRAY
#endif
#include <numpy/arrayobject.h>
