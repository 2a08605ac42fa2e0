// opforge's ExecuTorch compatibility headers: c10::irange, the integer range ExecuTorch's
// portable kernels loop over (`for (const auto i : c10::irange(n))`).
#pragma once

#include <iterator>
#include <type_traits>

namespace c10 {

template <class I>
class integer_range {
 public:
  class iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = I;
    using difference_type = std::ptrdiff_t;
    using pointer = const I*;
    using reference = const I&;
    explicit iterator(I value) : value_(value) {}
    I operator*() const { return value_; }
    iterator& operator++() {
      ++value_;
      return *this;
    }
    bool operator==(const iterator& other) const { return value_ == other.value_; }
    bool operator!=(const iterator& other) const { return value_ != other.value_; }

   private:
    I value_;
  };
  integer_range(I begin, I end) : begin_(begin), end_(end < begin ? begin : end) {}
  iterator begin() const { return iterator(begin_); }
  iterator end() const { return iterator(end_); }

 private:
  I begin_, end_;
};

// [begin, end), empty when end <= begin; the type is the wider of the two.
template <class B, class E,
          class = std::enable_if_t<std::is_integral<B>::value && std::is_integral<E>::value>>
integer_range<std::common_type_t<B, E>> irange(B begin, E end) {
  using I = std::common_type_t<B, E>;
  return integer_range<I>(static_cast<I>(begin), static_cast<I>(end));
}

// [0, end)
template <class E, class = std::enable_if_t<std::is_integral<E>::value>>
integer_range<E> irange(E end) {
  return integer_range<E>(E(0), end);
}

}  // namespace c10
