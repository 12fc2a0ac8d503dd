// abi_compatible<Ours, Theirs>: whether gpuguard's own declaration of a foreign type or function pointer
// can stand in for the vendor header's (same types, or specialised stand-ins, composed through pointers,
// const and function signatures). Used by the compile-time checks against cuda.h and nccl.h.
#pragma once

#include <type_traits>

namespace gpuguard_test {

template <class A, class B>
struct abi_compatible : std::is_same<A, B> {};
template <class A, class B>
struct abi_compatible<A*, B*> : abi_compatible<A, B> {};
template <class A, class B>
struct abi_compatible<const A, const B> : abi_compatible<A, B> {};
template <class RA, class... PA, class RB, class... PB>
struct abi_compatible<RA (*)(PA...), RB (*)(PB...)>
    : std::bool_constant<sizeof...(PA) == sizeof...(PB) &&
                         std::conjunction_v<abi_compatible<RA, RB>, abi_compatible<PA, PB>...>> {};

// A stand-in of the same size (an enum or struct redeclared by gpuguard).
template <class A, class B>
struct same_size : std::bool_constant<sizeof(A) == sizeof(B)> {};

}  // namespace gpuguard_test
