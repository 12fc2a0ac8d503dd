// Force-included (-include) into every source of a binary wheel's _libtorch variants, which g++ 12 builds against
// this machine's glibc 2.36 (scripts/build_wheels.sh), so that they need no glibc newer than manylinux_2_28's.
// GCC 11+'s libstdc++ headers (ext/atomicity.h) read glibc 2.32's `__libc_single_threaded`, wherever
// <sys/single_threaded.h> exists, to skip the atomic reference counts of a process with one thread: a strong
// reference to GLIBC_2.32 in every module that copies a shared_ptr or a std::string (auditwheel then tags the wheel
// manylinux_2_35, and glibc 2.28's loader refuses the module). Here that name means a hidden variable of the
// module's own, always 0 ("maybe several threads"): the atomics always run, as libstdc++ did before GCC 11.
#pragma once

#if defined(__cplusplus) && defined(__has_include)
#if __has_include(<sys/single_threaded.h>)
#define __libc_single_threaded gpuguard_libc_single_threaded
extern "C" {
// weak: one definition per source, merged into one by the linker; hidden: never exported, never bound by another
// library
__attribute__((weak, visibility("hidden"))) char gpuguard_libc_single_threaded = 0;
}
#endif
#endif
