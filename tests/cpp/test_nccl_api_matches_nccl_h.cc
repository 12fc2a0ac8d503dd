// Compile-time proof that gpuguard's own declarations of NCCL (nccl_api.h) match nccl.h: every function
// pointer type agrees parameter by parameter, and the config prefix gpuguard passes has nccl.h's layout.
#include <nccl.h>

#include <cstddef>
#include <type_traits>

#include "gpuguard/nccl_api.h"

namespace {

namespace g = gpuguard::nccl;

template <class A, class B>
struct compatible : std::is_same<A, B> {};
template <>
struct compatible<g::ncclResult_t, ::ncclResult_t>
    : std::bool_constant<sizeof(g::ncclResult_t) == sizeof(::ncclResult_t)> {};
template <>
struct compatible<g::ncclDataType_t, ::ncclDataType_t>
    : std::bool_constant<sizeof(g::ncclDataType_t) == sizeof(::ncclDataType_t)> {};
template <>
struct compatible<g::ncclRedOp_t, ::ncclRedOp_t> : std::bool_constant<sizeof(g::ncclRedOp_t) == sizeof(::ncclRedOp_t)> {};
template <>
struct compatible<g::ncclUniqueId, ::ncclUniqueId>
    : std::bool_constant<sizeof(g::ncclUniqueId) == sizeof(::ncclUniqueId)> {};
template <>
struct compatible<g::ncclComm, ::ncclComm> : std::true_type {};         // opaque handle
template <>
struct compatible<g::CUstream_st, ::CUstream_st> : std::true_type {};   // opaque handle
// gpuguard passes the NCCL 2.14 prefix of ncclConfig_t; NCCL reads `size` bytes of it (checked below).
template <>
struct compatible<g::ncclConfigV21400, ::ncclConfig_t> : std::true_type {};
template <class A, class B>
struct compatible<A*, B*> : compatible<A, B> {};
template <class A, class B>
struct compatible<const A, const B> : compatible<A, B> {};
template <class RA, class... PA, class RB, class... PB>
struct compatible<RA (*)(PA...), RB (*)(PB...)>
    : std::bool_constant<sizeof...(PA) == sizeof...(PB) &&
                         std::conjunction_v<compatible<RA, RB>, compatible<PA, PB>...>> {};

#define GPUGUARD_CHECK_AGAINST_NCCL_H(sym, ret, params)                     \
  static_assert(compatible<g::PFN_##sym, decltype(&::sym)>::value,          \
                "gpuguard's declaration of " #sym " does not match nccl.h");
GPUGUARD_NCCL_REQUIRED_FUNCTIONS(GPUGUARD_CHECK_AGAINST_NCCL_H)
GPUGUARD_NCCL_OPTIONAL_FUNCTIONS(GPUGUARD_CHECK_AGAINST_NCCL_H)

#define GPUGUARD_SAME_FIELD(field)                                                              \
  static_assert(offsetof(g::ncclConfigV21400, field) == offsetof(::ncclConfig_t, field) &&       \
                    sizeof(g::ncclConfigV21400::field) == sizeof(::ncclConfig_t::field),         \
                "ncclConfig_t." #field " moved");
GPUGUARD_SAME_FIELD(size)
GPUGUARD_SAME_FIELD(magic)
GPUGUARD_SAME_FIELD(version)
GPUGUARD_SAME_FIELD(blocking)
GPUGUARD_SAME_FIELD(cgaClusterSize)
GPUGUARD_SAME_FIELD(minCTAs)
GPUGUARD_SAME_FIELD(maxCTAs)
GPUGUARD_SAME_FIELD(netName)
GPUGUARD_SAME_FIELD(splitShare)
static_assert(sizeof(g::ncclConfigV21400) <= sizeof(::ncclConfig_t));

constexpr ::ncclConfig_t kInitializer = NCCL_CONFIG_INITIALIZER;
static_assert(kInitializer.magic == g::kConfigMagic);

static_assert(g::kUniqueIdBytes == NCCL_UNIQUE_ID_BYTES);
static_assert(g::kConfigVersion21400 == NCCL_VERSION(2, 14, 0));
static_assert(g::kConfigUndefInt == NCCL_CONFIG_UNDEF_INT);
static_assert(g::ncclSuccess == static_cast<int>(::ncclSuccess));
static_assert(g::ncclInvalidUsage == static_cast<int>(::ncclInvalidUsage));
static_assert(g::ncclRemoteError == static_cast<int>(::ncclRemoteError));
static_assert(g::ncclInProgress == static_cast<int>(::ncclInProgress));
static_assert(g::ncclFloat32 == static_cast<int>(::ncclFloat32));
static_assert(g::ncclSum == static_cast<int>(::ncclSum));

}  // namespace
