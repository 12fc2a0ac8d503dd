// Three libstdc++ functions that GCC 11+'s headers call and GCC 8's libstdc++ (manylinux_2_28's: GLIBCXX_3.4.25,
// CXXABI_1.3.11) lacks, defined in a binary wheel's _libtorch variant for a torch whose own libraries lack them too
// (GPUGUARD_LIBSTDCXX_GCC8, which scripts/build_wheels.sh sets for torch 2.6), so that it needs no newer libstdc++.
//
// GCC 11 made exception_ptr's copy constructor and destructor inline, calling _M_addref and _M_release, which it
// then exported (CXXABI_1.3.13); it also added std::__throw_bad_array_new_length (GLIBCXX_3.4.29), which the
// headers call for an array size that overflows. torch 2.7 and later export all three from their own libraries
// (their toolchain's libstdc++_nonshared), so a variant built against them binds there (and must not carry this file:
// torch 2.14's libtorch_python also exports the destructor named below, unversioned, and GNU ld 2.40 wrote a corrupt
// dynamic symbol where the two met); torch 2.6's libraries do not, and its variant was left out of every wheel for
// needing them. The module's version script (only PyInit_ global) keeps these definitions local: they serve this
// module's own calls and never interpose on the process's libstdc++.
//
// The reference counts themselves stay libstdc++'s: _M_addref and _M_release go through exception_ptr's out-of-line
// copy constructor and destructor, which every libstdc++ since GCC 4.4 exports at CXXABI_1.3.3. They are named with
// that version (.symver) because the module holds inline copies of the same constructor and destructor (from the
// GCC 12 headers), which call _M_addref and _M_release: an unversioned reference would bind to those and recurse.
#include <exception>
#include <new>

extern "C" void gpuguard_libstdcxx_exception_ptr_copy(void* self, const void* other) noexcept;
extern "C" void gpuguard_libstdcxx_exception_ptr_destroy(void* self) noexcept;
__asm__(".symver gpuguard_libstdcxx_exception_ptr_copy,_ZNSt15__exception_ptr13exception_ptrC1ERKS0_@CXXABI_1.3.3");
__asm__(".symver gpuguard_libstdcxx_exception_ptr_destroy,_ZNSt15__exception_ptr13exception_ptrD1Ev@CXXABI_1.3.3");

namespace std {
namespace __exception_ptr {

// One more reference: libstdc++ copies this pointer into a scratch one, which is dropped without being released.
void exception_ptr::_M_addref() noexcept {
  void* scratch = nullptr;
  gpuguard_libstdcxx_exception_ptr_copy(&scratch, this);
}

// One reference fewer: libstdc++ destroys a scratch pointer to the same exception (the last one frees it).
void exception_ptr::_M_release() noexcept {
  void* scratch = _M_exception_object;
  gpuguard_libstdcxx_exception_ptr_destroy(&scratch);
}

}  // namespace __exception_ptr

void __throw_bad_array_new_length() { throw bad_array_new_length(); }

}  // namespace std
