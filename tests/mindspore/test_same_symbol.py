"""Two libraries exporting the same kernel name are two operators (MindSpore keeps both):
defining the second must not rebind the first to the second library."""

import pytest

from mindspore_support import needs_cxx

torch = pytest.importorskip("torch")

KERNEL = """
#include <stdint.h>
extern "C" int AddK(int nparam, void** params, int* ndims, int64_t** shapes,
                    const char** dtypes, void* stream, void* extra) {
  int64_t n = 1;
  for (int d = 0; d < ndims[2]; ++d) n *= shapes[2][d];
  const float* a = static_cast<const float*>(params[0]);
  const float* b = static_cast<const float*>(params[1]);
  float* z = static_cast<float*>(params[2]);
  for (int64_t i = 0; i < n; ++i) z[i] = a[i] OP b[i];
  return 0;
}
"""


@needs_cxx
def test_two_libraries_with_one_symbol_keep_their_own_kernels(tmp_path, cache):
    from opforge.mindspore import Custom

    ops = []
    for folder, op in (("k1", "+"), ("k2", "*")):
        (tmp_path / folder).mkdir()
        source = tmp_path / folder / "addk.cc"
        source.write_text(KERNEL.replace("OP", op))
        ops.append(Custom(f"{source}:AddK", out_shape=lambda x, y: x, out_dtype=lambda x, y: x,
                          func_type="aot", cache_root=cache))
    x, y = torch.full((3,), 2.0), torch.full((3,), 5.0)
    assert ops[0](x, y).tolist() == [7.0] * 3  # was 10.0: rebound to the second library
    assert ops[1](x, y).tolist() == [10.0] * 3
    assert ops[0].name != ops[1].name and ops[1].name.startswith("AddK_")
    assert ops[0].op.library != ops[1].op.library
    # the same file again is the same op, redefined (not a third name)
    again = Custom(f"{tmp_path / 'k1' / 'addk.cc'}:AddK", out_shape=lambda x, y: x,
                   out_dtype=lambda x, y: x, cache_root=cache)
    assert again.name == ops[0].name and again(x, y).tolist() == [7.0] * 3
