// Host side of AddCustom: shape and type inference (z has x's shape and dtype).
#include <stdint.h>

#include <vector>

#include "custom_aot_extra.h"

extern "C" std::vector<int64_t> AddCustomInferShape(int* ndims, int64_t** shapes, AotExtra* extra) {
  return std::vector<int64_t>(shapes[0], shapes[0] + ndims[0]);
}

extern "C" TypeId AddCustomInferType(std::vector<TypeId> type_ids, AotExtra* extra) {
  return type_ids[0];
}
