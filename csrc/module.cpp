// rlflow._core: the compiled core's Python binding. Thin: it converts arrays, checks their shapes, releases
// the GIL around the work, and turns C++ exceptions into Python's (invalid_argument -> ValueError,
// out_of_range -> IndexError). The semantics are documented on the Python objects that call it.
#include <nanobind/nanobind.h>

#include "bind.h"
#define RLFLOW_NUMPY_IMPORT
#include "numpy_api.h"

namespace {
// numpy's C API table, loaded once (import_array's own macro returns from the calling function).
int import_numpy() {
  import_array1(-1);
  return 0;
}
}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "rlflow's compiled core (an implementation detail: use rlflow.replay and rlflow.adders).";
  // Objects that a program's globals still hold when Python shuts down are not freed by its finalisation;
  // nanobind would list them on stderr at every such exit. The binding takes no references by hand.
  nanobind::set_leak_warnings(false);
  if (import_numpy() < 0) throw nanobind::python_error();
  rlflow::bind_block_writer(m);
  rlflow::bind_call_classifier(m);
  rlflow::bind_gather(m);
  rlflow::bind_items(m);
  rlflow::bind_selection(m);
  rlflow::bind_shuffle(m);
  rlflow::bind_step_block(m);
  rlflow::bind_store_rings(m);
  rlflow::bind_sum_tree(m);
}
