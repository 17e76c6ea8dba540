// A model of the Metal Shading Language for type-checking generated MSL with clang++ on Linux
// (clang++ -x c++ -std=c++17 -fsyntax-only -I tests/msl -Wno-unknown-attributes).
//
// What it models, as MSL defines it (Metal Shading Language Specification, chapters 2 and 6):
// - the address spaces device, constant and threadgroup as clang address spaces, so passing or
//   assigning a pointer of one where another is needed is an error as in Metal; thread is the
//   default address space (local variables and pointers to them);
// - half as _Float16 (arithmetic in half, not promoted); uchar, ushort, uint, ulong;
// - vectors of 2, 3 and 4 lanes of every scalar type (float4, half4, int4, uchar4, bool4, ...):
//   lanes .x .y .z .w; construction from one scalar (broadcast, also implicit: MSL converts a scalar
//   to any vector), from one scalar per lane, and from a vector of another element type and the
//   same width (explicit only: MSL has no implicit conversion between vector types); arithmetic
//   lane-wise between vectors of one type and with a scalar (converted to the element type; a
//   float scalar does not convert to an integer vector); comparisons giving bool vectors; &&, ||
//   and ! on bool vectors; % and bitwise operators on integer vectors. There are no 8- or 16-lane
//   vectors and no swizzles beyond single lanes (nothing generated reads .xy or .s0);
// - metal:: math with one type T for every argument ("T fmax(T x, T y)", "T clamp(T x, T minval,
//   T maxval)"): T is half, float or a vector of them (of an integer type too for abs, min, max,
//   clamp); isnan/isinf/isfinite/signbit give bool or a bool vector; select(a, b, c) picks b where
//   the bool (vector) c is true; threadgroup_barrier(mem_flags); the float constants INFINITY, NAN,
//   FLT_MAX, FLT_MIN, FLT_EPSILON, MAXFLOAT, HUGE_VALF, HALF_MAX;
// - the conditional operator takes a scalar bool condition only: a vector condition is an error, as
//   in MSL (a vector here is a class without a conversion to bool).
//
// Deliberately absent because MSL lacks them, so that the generated library's own definitions are
// what gets checked: vload*/vstore*, convert_*, expm1, log1p, 8- and 16-lane vectors, OpenCL's
// vector-with-scalar math forms, and the integer limits (INT_MAX, ...), which MSL may or may not
// define as macros (the library defines them only where undefined).
//
// What it cannot check: attributes are not validated here ([[buffer(n)]] and the thread position
// attributes are ignored; the test checks their names and buffer indices itself); Metal's limits
// (31 buffer arguments, 32 KB of threadgroup memory, threads per threadgroup); MSL-only restrictions
// (no recursion, no pointers to pointers in kernel arguments, no double, no exceptions or virtual
// functions, no automatic variables in device memory); whether a kernel's arguments match the
// runtime's bindings; numerics (fast math, rounding of conversions). clang rejects an automatic
// variable in an address space outside OpenCL, so the test declares kernel-scope threadgroup arrays
// static (same type, same line); anything clang accepts in C++17 but MSL (C++14-based) does not is
// not caught.
#pragma once

#define kernel
#define device __attribute__((address_space(1)))
#define constant __attribute__((address_space(2)))
#define threadgroup __attribute__((address_space(3)))
#define thread

typedef _Float16 half;
typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;

namespace stub {
template <bool B, typename T = void> struct enable_if {};
template <typename T> struct enable_if<true, T> { typedef T type; };

// kind<T>: 1 integer, 2 floating-point, 3 bool, 0 not a scalar.
template <typename T> struct kind { static constexpr int value = 0; };
#define STUB_KIND(T, K) template <> struct kind<T> { static constexpr int value = K; };
STUB_KIND(char, 1) STUB_KIND(uchar, 1) STUB_KIND(short, 1) STUB_KIND(ushort, 1) STUB_KIND(int, 1)
STUB_KIND(uint, 1) STUB_KIND(long, 1) STUB_KIND(ulong, 1) STUB_KIND(signed char, 1)
STUB_KIND(half, 2) STUB_KIND(float, 2) STUB_KIND(double, 2)   // double: a literal without f, converted
STUB_KIND(bool, 3)
#undef STUB_KIND

// A scalar S converts implicitly to an element T (MSL: the scalar takes the element type).
template <typename T, typename S> struct splat_ok {
  static constexpr bool value = kind<S>::value != 0 && (kind<T>::value == 2 || kind<S>::value != 2);
};

template <typename T, int N> struct lanes;
template <typename T> struct lanes<T, 2> { T x, y; };
template <typename T> struct lanes<T, 3> { T x, y, z; };
template <typename T> struct lanes<T, 4> { T x, y, z, w; };

template <bool... B> struct all { static constexpr bool value = true; };
template <bool H, bool... B> struct all<H, B...> { static constexpr bool value = H && all<B...>::value; };

template <typename T, int N> struct vec : lanes<T, N> {
  vec() = default;
  template <typename S, typename enable_if<splat_ok<T, S>::value, int>::type = 0> vec(S s);
  template <typename S, typename enable_if<!splat_ok<T, S>::value && kind<S>::value != 0, int>::type = 0>
  explicit vec(S s);
  template <typename A, typename B, typename... R,
            typename enable_if<sizeof...(R) + 2 == N && all<(kind<A>::value != 0), (kind<B>::value != 0),
                                                           (kind<R>::value != 0)...>::value, int>::type = 0>
  vec(A a, B b, R... r);
  template <typename U> explicit vec(vec<U, N> v);
};

template <typename T> struct is_vec { static constexpr bool value = false; };
template <typename T, int N> struct is_vec<vec<T, N>> { static constexpr bool value = true; };
template <typename T> struct elem { typedef T type; };
template <typename T, int N> struct elem<vec<T, N>> { typedef T type; };
template <typename T> struct bool_of { typedef bool type; };
template <typename T, int N> struct bool_of<vec<T, N>> { typedef vec<bool, N> type; };

// Results of the math below: T where T (or its element) is of kind K.
template <typename T, int K> using of_kind = typename enable_if<kind<typename elem<T>::type>::value == K, T>::type;
template <typename T> using if_float = of_kind<T, 2>;
template <typename T> using if_number = typename enable_if<
    kind<typename elem<T>::type>::value == 1 || kind<typename elem<T>::type>::value == 2, T>::type;
template <typename T> using float_test = typename enable_if<kind<typename elem<T>::type>::value == 2,
                                                            typename bool_of<T>::type>::type;

// Arithmetic and logic, lane-wise (found by argument-dependent lookup).
#define STUB_ARITH(op, K)                                                                            \
  template <typename T, int N, typename enable_if<(kind<T>::value & K) != 0, int>::type = 0>         \
  vec<T, N> operator op(vec<T, N> a, vec<T, N> b);                                                   \
  template <typename T, int N, typename S,                                                           \
            typename enable_if<(kind<T>::value & K) != 0 && splat_ok<T, S>::value, int>::type = 0>   \
  vec<T, N> operator op(vec<T, N> a, S b);                                                           \
  template <typename T, int N, typename S,                                                           \
            typename enable_if<(kind<T>::value & K) != 0 && splat_ok<T, S>::value, int>::type = 0>   \
  vec<T, N> operator op(S a, vec<T, N> b);                                                           \
  template <typename T, int N, typename B> vec<T, N>& operator op##=(vec<T, N>& a, B b);
STUB_ARITH(+, 3) STUB_ARITH(-, 3) STUB_ARITH(*, 3) STUB_ARITH(/, 3)   // integer (1) or float (2)
STUB_ARITH(%, 1) STUB_ARITH(&, 1) STUB_ARITH(|, 1) STUB_ARITH(^, 1) STUB_ARITH(<<, 1) STUB_ARITH(>>, 1)
#undef STUB_ARITH

#define STUB_COMPARE(op)                                                                              \
  template <typename T, int N> vec<bool, N> operator op(vec<T, N> a, vec<T, N> b);                    \
  template <typename T, int N, typename S, typename enable_if<splat_ok<T, S>::value, int>::type = 0>  \
  vec<bool, N> operator op(vec<T, N> a, S b);                                                         \
  template <typename T, int N, typename S, typename enable_if<splat_ok<T, S>::value, int>::type = 0>  \
  vec<bool, N> operator op(S a, vec<T, N> b);
STUB_COMPARE(<) STUB_COMPARE(>) STUB_COMPARE(<=) STUB_COMPARE(>=) STUB_COMPARE(==) STUB_COMPARE(!=)
#undef STUB_COMPARE

template <typename T, int N> vec<T, N> operator-(vec<T, N> a);
template <typename T, int N> vec<T, N> operator+(vec<T, N> a);
template <int N> vec<bool, N> operator!(vec<bool, N> a);
template <int N> vec<bool, N> operator&&(vec<bool, N> a, vec<bool, N> b);
template <int N> vec<bool, N> operator||(vec<bool, N> a, vec<bool, N> b);
}  // namespace stub

#define STUB_VECTORS(T) typedef stub::vec<T, 2> T##2; typedef stub::vec<T, 3> T##3; typedef stub::vec<T, 4> T##4;
STUB_VECTORS(bool) STUB_VECTORS(char) STUB_VECTORS(uchar) STUB_VECTORS(short) STUB_VECTORS(ushort)
STUB_VECTORS(int) STUB_VECTORS(uint) STUB_VECTORS(long) STUB_VECTORS(ulong) STUB_VECTORS(half) STUB_VECTORS(float)
#undef STUB_VECTORS

namespace metal {
using stub::if_float;
using stub::if_number;
using stub::float_test;

#define STUB_F1(f) template <typename T> if_float<T> f(T x);
#define STUB_F2(f) template <typename T> if_float<T> f(T x, T y);
STUB_F1(exp) STUB_F1(exp2) STUB_F1(exp10) STUB_F1(log) STUB_F1(log2) STUB_F1(log10) STUB_F1(sqrt)
STUB_F1(rsqrt) STUB_F1(sin) STUB_F1(cos) STUB_F1(tan) STUB_F1(sinh) STUB_F1(cosh) STUB_F1(tanh)
STUB_F1(asin) STUB_F1(acos) STUB_F1(atan) STUB_F1(asinh) STUB_F1(acosh) STUB_F1(atanh) STUB_F1(floor)
STUB_F1(ceil) STUB_F1(round) STUB_F1(rint) STUB_F1(trunc) STUB_F1(fabs) STUB_F1(sign) STUB_F1(fract)
STUB_F1(saturate)
STUB_F2(pow) STUB_F2(powr) STUB_F2(fmod) STUB_F2(fmax) STUB_F2(fmin) STUB_F2(atan2) STUB_F2(copysign)
STUB_F2(fdim) STUB_F2(step)
#undef STUB_F1
#undef STUB_F2
template <typename T> if_float<T> fma(T a, T b, T c);
template <typename T, typename S> T as_type(S x);   // the bits of x read as T (same size)
template <typename T> if_float<T> mix(T x, T y, T a);
template <typename T> if_number<T> abs(T x);
template <typename T> if_number<T> min(T x, T y);
template <typename T> if_number<T> max(T x, T y);
template <typename T> if_number<T> clamp(T x, T minval, T maxval);
template <typename T> float_test<T> isnan(T x);
template <typename T> float_test<T> isinf(T x);
template <typename T> float_test<T> isfinite(T x);
template <typename T> float_test<T> signbit(T x);
template <typename T> T select(T a, T b, typename stub::bool_of<T>::type c);
template <int N> bool all(stub::vec<bool, N> x);
template <int N> bool any(stub::vec<bool, N> x);

enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };
mem_flags operator|(mem_flags a, mem_flags b);
void threadgroup_barrier(mem_flags flags);
}  // namespace metal

#define INFINITY __builtin_inff()
#define NAN __builtin_nanf("")
#define HUGE_VALF __builtin_inff()
#define MAXFLOAT 0x1.fffffep127f
#define FLT_MAX 0x1.fffffep127f
#define FLT_MIN 0x1p-126f
#define FLT_EPSILON 0x1p-23f
#define HALF_MAX ((half)65504.0f)
