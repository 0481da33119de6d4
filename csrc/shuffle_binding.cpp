#include "bind.h"
#include "shuffle.h"

namespace rlflow {

void bind_shuffle(nb::module_& m) {
  m.def(
      "shuffle",
      [](nb::ndarray<int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> values, In1<double> uniforms) {
        check_size(uniforms, values.shape(0), "uniforms");
        nb::gil_scoped_release release;
        shuffle(values.data(), static_cast<int64_t>(values.shape(0)), uniforms.data());
      },
      // values is written in place: never converted (a converted copy would be shuffled and lost)
      nb::arg("values").noconvert(), nb::arg("uniforms"));
}

}  // namespace rlflow
